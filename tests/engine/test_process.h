// Helpers for engine tests that run remat-trial as processes: a fresh temporary folder and a
// shell command with its captured stdout and exit code.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

namespace remat::engine::testing {

// A new, empty folder under the system's temporary folder, unique per call and process.
inline std::filesystem::path TempDir(const std::string& prefix) {
  static int counter = 0;
  std::filesystem::path d = std::filesystem::temp_directory_path() /
                            (prefix + "-" + std::to_string(::getpid()) + "-" +
                             std::to_string(counter++));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

struct Output {
  int exit_code = -1;
  std::string out;
};

// Runs a shell command; stdout captured (stderr folded in with 2>&1 by the caller when wanted).
inline Output Sh(const std::string& command) {
  Output o;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) o.out.append(buf, n);
  const int status = ::pclose(p);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

}  // namespace remat::engine::testing
