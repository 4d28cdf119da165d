#include "search/text.h"

#include <algorithm>
#include <cstdint>

namespace remat::search {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

// The length of the well-formed UTF-8 sequence at text[i], or 0 when the byte there does not
// start one (Unicode's table 3-7: no overlongs, no surrogates, nothing above U+10FFFF).
size_t SequenceLength(std::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(text[k]); };
  const uint8_t b0 = byte(i);
  if (b0 < 0x80) return 1;
  size_t n;
  uint8_t lo = 0x80, hi = 0xBF;  // the allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    n = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    n = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    n = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

bool IsValidUtf8(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const size_t n = SequenceLength(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string BoundedUtf8(std::string_view text, size_t max_bytes) {
  // Room for the marker when the text must be cut: "… (" + up to 20 digits + " bytes cut)".
  constexpr size_t kMarkerRoom = 32;
  const size_t keep = max_bytes >= kMarkerRoom ? max_bytes - kMarkerRoom : max_bytes;
  std::string out;
  out.reserve(std::min(text.size(), max_bytes));
  size_t i = 0;
  while (i < text.size()) {
    const size_t n = SequenceLength(text, i);
    const std::string_view piece = n == 0 ? kReplacement : text.substr(i, n);
    if (out.size() + piece.size() > keep) break;
    out.append(piece);
    i += n == 0 ? 1 : n;
  }
  if (i == text.size()) return out;
  // Cut: maybe everything would still have fit without the marker's room.
  if (text.size() - i + out.size() <= max_bytes && IsValidUtf8(text.substr(i))) {
    out.append(text.substr(i));
    return out;
  }
  if (max_bytes < kMarkerRoom) return out;
  out += "\xE2\x80\xA6 (" + std::to_string(text.size() - i) + " bytes cut)";
  return out;
}

std::string QuoteForError(std::string_view value, size_t max_bytes) {
  static const char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  size_t i = 0;
  while (i < value.size() && out.size() < max_bytes + 1) {
    const size_t n = SequenceLength(value, i);
    if (n == 0) {
      const auto b = static_cast<uint8_t>(value[i]);
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
      ++i;
      continue;
    }
    const char c = value[i];
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (n == 1 && (static_cast<uint8_t>(c) < 0x20 || c == 0x7F)) {
      out += "\\x";
      out += kHex[static_cast<uint8_t>(c) >> 4];
      out += kHex[c & 15];
    } else {
      out.append(value.substr(i, n));
    }
    i += n;
  }
  if (i < value.size()) out += "\xE2\x80\xA6";  // …
  out += '"';
  return out;
}

}  // namespace remat::search
