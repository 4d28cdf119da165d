#include "common/read_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace remat::common {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return std::nullopt;
  return ss.str();
}

namespace {
// Opens `path` for reading only when it is a regular file, never waiting (O_NONBLOCK: opening a
// FIFO with no writer would otherwise wait for one). The descriptor, or -1 with out->error set;
// *st is the file's status.
int OpenRegular(const std::string& path, struct stat* st, FileText* out) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    out->error = std::string("cannot be read: ") + std::strerror(errno);
    return -1;
  }
  if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    close(fd);
    out->error = "is not a regular file";
    return -1;
  }
  return fd;
}
}  // namespace

FileText ReadRegularFile(const std::string& path, size_t max_bytes) {
  FileText out;
  struct stat st {};
  const int fd = OpenRegular(path, &st, &out);
  if (fd < 0) return out;
  const std::string too_big = "is larger than " + std::to_string(max_bytes) + " bytes";
  if (static_cast<unsigned long long>(st.st_size) > max_bytes) {
    close(fd);
    out.error = too_big;
    return out;
  }
  std::string text;
  text.resize(static_cast<size_t>(st.st_size) + 1);  // one more: a file that grew is noticed
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n = read(fd, text.data() + got, text.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      out.error = std::string("cannot be read: ") + std::strerror(errno);
      close(fd);
      return out;
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
    if (got == text.size() && got <= max_bytes) text.resize(std::min(max_bytes + 1, got * 2));
  }
  close(fd);
  if (got > max_bytes) {
    out.error = too_big;
    return out;
  }
  text.resize(got);
  out.text = std::move(text);
  return out;
}

FileText ReadRegularFileTail(const std::string& path, size_t max_bytes) {
  FileText out;
  struct stat st {};
  const int fd = OpenRegular(path, &st, &out);
  if (fd < 0) return out;
  const auto size = static_cast<unsigned long long>(st.st_size);
  const off_t start = size > max_bytes ? static_cast<off_t>(size - max_bytes) : 0;
  std::string text(static_cast<size_t>(size - static_cast<unsigned long long>(start)), '\0');
  size_t got = 0;
  while (got < text.size()) {
    const ssize_t n =
        pread(fd, text.data() + got, text.size() - got, start + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      out.error = std::string("cannot be read: ") + std::strerror(errno);
      close(fd);
      return out;
    }
    if (n == 0) break;  // it shrank meanwhile
    got += static_cast<size_t>(n);
  }
  close(fd);
  text.resize(got);
  out.text = std::move(text);
  return out;
}

}  // namespace remat::common
