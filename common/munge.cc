#include "common/munge.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>
#include <vector>

extern char** environ;

namespace remat::common {
namespace {

struct Outcome {
  bool started = false;
  bool timed_out = false;
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs argv with `input` on stdin, collecting stdout and stderr, killed after timeout_s.
Outcome Run(const std::vector<std::string>& argv, const std::string& input, double timeout_s) {
  Outcome o;
  int in[2], out[2], err[2];
  if (pipe2(in, O_CLOEXEC) != 0) return o;
  if (pipe2(out, O_CLOEXEC) != 0) {
    close(in[0]), close(in[1]);
    return o;
  }
  if (pipe2(err, O_CLOEXEC) != 0) {
    close(in[0]), close(in[1]), close(out[0]), close(out[1]);
    return o;
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], 0);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err[1], 2);
  // The child gets default signal handling and mask (the daemons block SIGTERM in all threads).
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(in[1]), close(out[0]), close(err[0]);
    o.err = std::string(argv[0]) + ": " + std::strerror(rc);
    return o;
  }
  o.started = true;
  // The input is small (a credential): one write, before reading, cannot fill the pipe.
  if (!input.empty()) {
    [[maybe_unused]] ssize_t n = write(in[1], input.data(), input.size());
  }
  close(in[1]);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  int open_fds = 2;
  while (open_fds > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      o.timed_out = true;
      kill(pid, SIGKILL);
      break;
    }
    if (poll(fds, 2, static_cast<int>(left)) < 0) continue;
    for (pollfd& p : fds) {
      if (p.fd < 0 || (p.revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[4096];
      const ssize_t n = read(p.fd, buf, sizeof(buf));
      if (n > 0) {
        (p.fd == out[0] ? o.out : o.err).append(buf, static_cast<size_t>(n));
      } else {
        close(p.fd);
        p.fd = -1;
        --open_fds;
      }
    }
  }
  for (pollfd& p : fds) {
    if (p.fd >= 0) close(p.fd);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return o;
}

std::string LastLine(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const size_t nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

std::string Failure(const std::string& program, const Outcome& o, double timeout_s) {
  if (!o.started) return o.err.empty() ? program + " could not be started" : o.err;
  if (o.timed_out) return program + " gave no answer within " + std::to_string(timeout_s) + " s";
  const std::string why = LastLine(o.err);
  return program + " exited with status " + std::to_string(o.exit_code) +
         (why.empty() ? "" : ": " + why);
}

}  // namespace

std::string MungeEncode(const MungeOptions& options, std::string* error) {
  std::vector<std::string> argv = {options.munge, "--no-input"};
  if (!options.socket.empty()) argv.push_back("--socket=" + options.socket);
  Outcome o = Run(argv, "", options.timeout_s);
  if (!o.started || o.timed_out || o.exit_code != 0) {
    *error = Failure(options.munge, o, options.timeout_s);
    return "";
  }
  std::string credential = LastLine(o.out);
  if (credential.rfind("MUNGE:", 0) != 0) {
    *error = options.munge + " printed no credential";
    return "";
  }
  return credential;
}

std::string MungeDecodeUser(const MungeOptions& options, const std::string& credential,
                            std::string* error) {
  if (credential.rfind("MUNGE:", 0) != 0 || credential.size() > 4096 ||
      credential.find_first_of(" \t\r\n") != std::string::npos) {
    *error = "not a MUNGE credential";
    return "";
  }
  std::vector<std::string> argv = {options.unmunge, "--output=/dev/null", "--metadata=-",
                                    "--keys=STATUS,UID"};
  if (!options.socket.empty()) argv.push_back("--socket=" + options.socket);
  Outcome o = Run(argv, credential + "\n", options.timeout_s);
  if (!o.started || o.timed_out || o.exit_code != 0) {
    // unmunge says why in its STATUS line ("STATUS: Replayed credential (17)"), or on stderr.
    std::istringstream lines(o.out);
    std::string line;
    while (std::getline(lines, line)) {
      if (line.rfind("STATUS:", 0) != 0) continue;
      const size_t start = line.find_first_not_of(' ', 7);
      if (start != std::string::npos) {
        *error = "munged says: " + line.substr(start);
        return "";
      }
    }
    *error = Failure(options.unmunge, o, options.timeout_s);
    return "";
  }
  // "UID:              nobody (65534)"
  std::istringstream lines(o.out);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("UID:", 0) != 0) continue;
    std::istringstream words(line.substr(4));
    std::string name;
    words >> name;
    if (!name.empty()) return name;
  }
  *error = options.unmunge + " reported no UID";
  return "";
}

}  // namespace remat::common
