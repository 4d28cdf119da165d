// Reading a whole file: the one implementation the mains and the libraries that read files (spec
// files, command templates, metrics files, TLS material) share. Standard library and POSIX only.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace remat::common {

// The whole file, bytes as they are; nullopt when it cannot be opened or read. Callers turn
// nullopt into their own error naming the flag or field. Reads whatever the path names (a FIFO
// or /dev/stdin included): for operator-given paths (TLS material, tokens). Files a user or a
// trial names go through ReadRegularFile.
std::optional<std::string> ReadFile(const std::string& path);

// A file that someone else chose (a spec, a replay table, a trial's metrics file): read only
// when it is a regular file (not /dev/zero, a FIFO, a directory or a socket, which could make
// the reader block or read for ever) of at most `max_bytes`.
struct FileText {
  std::optional<std::string> text;  // set on success
  std::string error;  // otherwise why, as a phrase: "is not a regular file", "is larger than
                      // 1048576 bytes", "cannot be read: No such file or directory"
};
FileText ReadRegularFile(const std::string& path, size_t max_bytes);

// The last `max_bytes` bytes of such a file (a log a trial writes, which may be any size): the
// same refusals as ReadRegularFile except the size.
FileText ReadRegularFileTail(const std::string& path, size_t max_bytes);

}  // namespace remat::common
