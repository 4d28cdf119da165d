#include "worker/process_runner.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "common/read_file.h"

extern char** environ;

namespace remat::worker {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The inherited environment with `overrides` set on top, as posix_spawn wants it.
std::vector<std::string> BuildEnvironment(
    const std::vector<std::pair<std::string, std::string>>& overrides) {
  std::map<std::string, std::string> env;
  std::vector<std::string> order;
  for (char** e = environ; e && *e; ++e) {
    std::string kv(*e);
    size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    std::string key = kv.substr(0, eq);
    if (!env.count(key)) order.push_back(key);
    env[key] = kv.substr(eq + 1);
  }
  for (const auto& [key, value] : overrides) {
    if (!env.count(key)) order.push_back(key);
    env[key] = value;
  }
  std::vector<std::string> out;
  out.reserve(order.size());
  for (const auto& key : order) out.push_back(key + "=" + env[key]);
  return out;
}

std::vector<char*> CStrings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// Spawns one child into process group `pgid` (0: a new group led by the child).
ChildExit Spawn(const ChildSpec& spec, pid_t pgid, pid_t* pid_out) {
  ChildExit exit;
  if (spec.argv.empty()) {
    exit.spawn_error = "empty command";
    return exit;
  }
  posix_spawn_file_actions_t actions;
  posix_spawnattr_t attr;
  posix_spawn_file_actions_init(&actions);
  posix_spawnattr_init(&attr);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  const std::string out_path = spec.stdout_path.empty() ? "/dev/null" : spec.stdout_path;
  const std::string err_path = spec.stderr_path.empty() ? "/dev/null" : spec.stderr_path;
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (!spec.cwd.empty()) posix_spawn_file_actions_addchdir_np(&actions, spec.cwd.c_str());

  // Children start with default signal handling and an empty mask, whatever the daemon blocks.
  sigset_t empty, all_default;
  sigemptyset(&empty);
  sigemptyset(&all_default);
  sigaddset(&all_default, SIGTERM);
  sigaddset(&all_default, SIGINT);
  sigaddset(&all_default, SIGPIPE);
  sigaddset(&all_default, SIGCHLD);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &all_default);
  posix_spawnattr_setpgroup(&attr, pgid);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<std::string> argv = spec.argv;
  std::vector<std::string> envv = BuildEnvironment(spec.env);
  std::vector<char*> c_argv = CStrings(argv);
  std::vector<char*> c_env = CStrings(envv);
  pid_t pid = -1;
  const bool search_path = spec.argv[0].find('/') == std::string::npos;
  int rc = search_path ? posix_spawnp(&pid, c_argv[0], &actions, &attr, c_argv.data(), c_env.data())
                       : posix_spawn(&pid, c_argv[0], &actions, &attr, c_argv.data(), c_env.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (rc != 0) {
    exit.spawn_error = spec.argv[0] + ": " + strerror(rc);
    return exit;
  }
  exit.started = true;
  *pid_out = pid;
  return exit;
}

// True once `pid` has exited; leaves it a zombie (WNOWAIT) so its group id stays reserved.
bool HasExited(pid_t pid) {
  siginfo_t info;
  memset(&info, 0, sizeof(info));
  int rc = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
  if (rc != 0) return errno == ECHILD;  // already reaped (SIGCHLD ignored): gone
  return info.si_pid == pid;
}

void Reap(pid_t pid, ChildExit* exit) {
  int status = 0;
  pid_t r;
  do {
    r = waitpid(pid, &status, 0);
  } while (r < 0 && errno == EINTR);
  if (r != pid) return;
  if (WIFEXITED(status)) {
    exit->exited = true;
    exit->exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    exit->signal = WTERMSIG(status);
  }
}

enum class Ended { kNo, kCleanly, kBadly };

// How a child has ended, without reaping it (for the lingering-peer check).
Ended HowEnded(pid_t pid) {
  siginfo_t info;
  memset(&info, 0, sizeof(info));
  if (waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) != 0) {
    return Ended::kNo;
  }
  if (info.si_pid != pid) return Ended::kNo;
  return info.si_code == CLD_EXITED && info.si_status == 0 ? Ended::kCleanly : Ended::kBadly;
}

}  // namespace

std::string ChildExit::Describe() const {
  if (!started) return "did not start: " + spawn_error;
  if (exited) return "exited with status " + std::to_string(exit_code);
  if (signal != 0) {
    const char* name = strsignal(signal);
    return "killed by signal " + std::to_string(signal) +
           (name ? std::string(" (") + name + ")" : "");
  }
  return "ended for an unknown reason";
}

GroupOutcome RunProcessGroup(const std::vector<ChildSpec>& children, const GroupLimits& limits,
                             const CancelToken* cancel) {
  GroupOutcome outcome;
  outcome.children.resize(children.size());
  const auto t0 = Clock::now();
  std::vector<pid_t> pids(children.size(), -1);
  pid_t pgid = 0;
  bool spawn_failed = false;
  for (size_t i = 0; i < children.size(); ++i) {
    outcome.children[i] = Spawn(children[i], pgid, &pids[i]);
    if (!outcome.children[i].started) {
      spawn_failed = true;
      break;
    }
    if (pgid == 0) pgid = pids[i];
    if (!limits.group_record_path.empty()) {
      WriteGroupRecord(limits.group_record_path, pgid, pids[i]);
    }
  }

  auto all_exited = [&] {
    for (pid_t pid : pids) {
      if (pid > 0 && !HasExited(pid)) return false;
    }
    return true;
  };
  auto kill_group = [&](int sig) {
    if (pgid > 0) killpg(pgid, sig);
  };
  // Ends the group: SIGTERM, then SIGKILL after the grace period.
  auto terminate_group = [&] {
    kill_group(SIGTERM);
    const auto t_term = Clock::now();
    while (!all_exited()) {
      if (SecondsSince(t_term) >= limits.kill_grace_s) {
        kill_group(SIGKILL);
        break;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(limits.poll_interval_s));
    }
  };

  if (spawn_failed) {
    if (pgid > 0) kill_group(SIGKILL);
  } else {
    // When the first child failed, and when the first one finished cleanly (its index in each).
    std::optional<std::pair<Clock::time_point, int>> failed, finished;
    const bool several = pids.size() > 1;
    while (!all_exited()) {
      if (cancel && cancel->cancelled()) {
        outcome.cancelled = true;
        terminate_group();
        break;
      }
      if (limits.timeout_s > 0 && SecondsSince(t0) >= limits.timeout_s) {
        outcome.timed_out = true;
        terminate_group();
        break;
      }
      // Only a group of several has peers to linger; a lone child just runs until it ends.
      for (size_t i = 0; several && i < pids.size() && !(failed && finished); ++i) {
        const Ended how = HowEnded(pids[i]);
        if (how == Ended::kBadly && !failed) failed.emplace(Clock::now(), static_cast<int>(i));
        if (how == Ended::kCleanly && !finished) {
          finished.emplace(Clock::now(), static_cast<int>(i));
        }
      }
      const bool failure_due = failed && SecondsSince(failed->first) >= limits.peer_failure_grace_s;
      const bool exit_due = finished && limits.peer_exit_grace_s > 0 &&
                            SecondsSince(finished->first) >= limits.peer_exit_grace_s;
      if (failure_due || exit_due) {
        outcome.lingered_kill = true;
        outcome.first_ended = failure_due ? failed->second : finished->second;
        outcome.first_ended_cleanly = !failure_due;
        terminate_group();
        break;
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(limits.poll_interval_s));
    }
  }
  // The direct children are gone (or being killed); take down anything they left in the group
  // while their zombies still hold the group id, then reap.
  if (pgid > 0) kill_group(SIGKILL);
  for (size_t i = 0; i < pids.size(); ++i) {
    if (pids[i] > 0) Reap(pids[i], &outcome.children[i]);
  }
  outcome.elapsed_s = SecondsSince(t0);
  return outcome;
}

unsigned long long ProcessStartTime(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return 0;
  // The command name (field 2) is in parentheses and may hold spaces: count from its end.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22 && fields >> field; ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

bool WriteGroupRecord(const std::string& path, int pgid, int pid) {
  const unsigned long long start = ProcessStartTime(pid);
  if (start == 0) return false;
  std::ofstream out(path, std::ios::app);
  out << pgid << " " << pid << " " << start << "\n";
  return static_cast<bool>(out.flush());
}

bool KillRecordedGroup(const std::string& path) {
  std::ifstream in(path);
  long long pgid = 0, pid = 0;
  unsigned long long start = 0;
  while (in >> pgid >> pid >> start) {
    if (pgid <= 1 || pid <= 1 || start == 0) continue;
    if (ProcessStartTime(static_cast<int>(pid)) != start) continue;
    if (getpgid(static_cast<pid_t>(pid)) != static_cast<pid_t>(pgid)) continue;
    return killpg(static_cast<pid_t>(pgid), SIGKILL) == 0;
  }
  return false;
}

std::string FileTail(const std::string& path, int max_lines, size_t max_bytes) {
  // The trial may have put anything at the path (a FIFO would block a plain open for ever).
  common::FileText tail = common::ReadRegularFileTail(path, max_bytes * 4);
  if (!tail.text) return "";
  const std::string& text = *tail.text;
  std::vector<std::string> lines;
  std::istringstream ss(text);
  std::string line;
  while (std::getline(ss, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) {
      line.pop_back();
    }
    if (!line.empty()) lines.push_back(line);
  }
  size_t from = lines.size() > static_cast<size_t>(max_lines) ? lines.size() - max_lines : 0;
  std::string out;
  for (size_t i = from; i < lines.size(); ++i) {
    if (!out.empty()) out += " | ";
    out += lines[i];
  }
  if (out.size() > max_bytes) out = "..." + out.substr(out.size() - max_bytes);
  return out;
}

bool CaptureOutput(const std::vector<std::string>& argv, double timeout_s, std::string* out) {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::temp_directory_path(ec);
  if (ec) dir = "/tmp";
  std::string templ = (dir / "remat-capture-XXXXXX").string();
  int fd = mkstemp(templ.data());
  if (fd < 0) return false;
  close(fd);
  ChildSpec spec;
  spec.argv = argv;
  spec.stdout_path = templ;
  GroupLimits limits;
  limits.timeout_s = timeout_s;
  limits.kill_grace_s = 1;
  GroupOutcome outcome = RunProcessGroup({spec}, limits, nullptr);
  bool ok = !outcome.timed_out && outcome.children.size() == 1 && outcome.children[0].ok();
  if (ok) {
    std::ifstream in(templ, std::ios::binary);
    std::string text;
    text.resize(1 << 20);
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    *out = std::move(text);
  }
  std::filesystem::remove(templ, ec);
  return ok;
}

}  // namespace remat::worker
