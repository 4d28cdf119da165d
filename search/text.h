// Text that crosses a trust boundary: what trials write (stderr, messages) before it enters a
// protobuf message (proto3 strings must be valid UTF-8, or the receiver cannot parse the whole
// message), and values echoed into one-line error messages. Standard library only.
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace remat::search {

// True when `text` is well-formed UTF-8 (no overlong forms, surrogates or code points above
// U+10FFFF).
bool IsValidUtf8(std::string_view text);

// `text` as valid UTF-8 of at most `max_bytes` bytes: every invalid byte becomes U+FFFD; text
// that is longer is cut on a code-point boundary and ends with "… (N bytes cut)" (the marker
// counts within max_bytes; max_bytes below 32 cuts without a marker).
std::string BoundedUtf8(std::string_view text, size_t max_bytes);

// `value` in double quotes for an error line: valid UTF-8, control characters (newlines
// included) escaped as \n, \t or \xNN, quotes and backslashes escaped, cut to about `max_bytes`
// with "…" before the closing quote. Never contains a newline.
std::string QuoteForError(std::string_view value, size_t max_bytes = 64);

}  // namespace remat::search
