#include "common/process_stats.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

namespace remat::common {
namespace {

std::string ProcPath(pid_t pid, const char* leaf) {
  return (pid == 0 ? std::string("/proc/self/") : "/proc/" + std::to_string(pid) + "/") + leaf;
}

// Seconds since the epoch at which the system booted (/proc/stat "btime"); 0 when unknown.
double BootTime() {
  std::ifstream in("/proc/stat");
  std::string key;
  while (in >> key) {
    if (key == "btime") {
      double t = 0;
      in >> t;
      return t;
    }
    in.ignore(1 << 20, '\n');
  }
  return 0;
}

int64_t CountFds(pid_t pid) {
  DIR* dir = opendir(ProcPath(pid, "fd").c_str());
  if (dir == nullptr) return -1;
  int64_t n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return pid == 0 ? n - 1 : n;  // our own listing holds one fd open
}

// The soft "Max open files" of /proc/PID/limits; -1 when unlimited or unreadable.
int64_t MaxFds(pid_t pid) {
  std::ifstream in(ProcPath(pid, "limits"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream fields(line.substr(std::strlen("Max open files")));
    std::string soft;
    fields >> soft;
    char* end = nullptr;
    const long long v = std::strtoll(soft.c_str(), &end, 10);
    return end != soft.c_str() && *end == '\0' ? v : -1;
  }
  return -1;
}

}  // namespace

std::optional<ProcessStats> ReadProcessStats(pid_t pid) {
  ProcessStats out;
  {
    std::ifstream in(ProcPath(pid, "status"));
    if (!in) return std::nullopt;
    std::string line;
    bool any = false;
    while (std::getline(in, line)) {
      long long kib = 0;
      if (std::sscanf(line.c_str(), "VmRSS: %lld kB", &kib) == 1) {
        out.resident_bytes = kib * 1024;
        any = true;
      } else if (std::sscanf(line.c_str(), "VmSize: %lld kB", &kib) == 1) {
        out.virtual_bytes = kib * 1024;
      }
    }
    if (!any) return std::nullopt;  // a zombie, or not a process with memory
  }
  {
    // /proc/PID/stat: "pid (comm) state ..."; comm may hold spaces and parentheses, so the
    // fields are counted from the last ')'. utime, stime and starttime are fields 14, 15, 22.
    std::ifstream in(ProcPath(pid, "stat"));
    std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const auto close = stat.rfind(')');
    if (close != std::string::npos) {
      std::istringstream fields(stat.substr(close + 2));
      std::string field;
      double utime = 0, stime = 0, start = 0;
      for (int i = 3; fields >> field; ++i) {
        if (i == 14) utime = std::atof(field.c_str());
        if (i == 15) stime = std::atof(field.c_str());
        if (i == 22) {
          start = std::atof(field.c_str());
          break;
        }
      }
      const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
      if (hz > 0) {
        out.cpu_seconds = (utime + stime) / hz;
        out.start_time_seconds = BootTime() + start / hz;
      }
    }
  }
  out.open_fds = CountFds(pid);
  out.max_fds = MaxFds(pid);
  return out;
}

DescendantsMemory ReadDescendantsMemory(pid_t root) {
  // Parent of every process, from /proc/PID/stat (field 4, after the command's ')').
  std::map<pid_t, std::vector<pid_t>> children;
  if (DIR* dir = opendir("/proc")) {
    while (const dirent* e = readdir(dir)) {
      char* end = nullptr;
      const long pid = std::strtol(e->d_name, &end, 10);
      if (end == e->d_name || *end != '\0') continue;
      std::ifstream in("/proc/" + std::string(e->d_name) + "/stat");
      std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      const auto close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream fields(stat.substr(close + 2));
      std::string state;
      long ppid = 0;
      if (fields >> state >> ppid) children[static_cast<pid_t>(ppid)].push_back(pid);
    }
    closedir(dir);
  }
  DescendantsMemory out;
  std::vector<pid_t> todo = children[root];
  while (!todo.empty()) {
    const pid_t pid = todo.back();
    todo.pop_back();
    if (auto stats = ReadProcessStats(pid)) {
      out.resident_bytes += stats->resident_bytes;
      ++out.processes;
    }
    if (auto it = children.find(pid); it != children.end()) {
      todo.insert(todo.end(), it->second.begin(), it->second.end());
    }
  }
  return out;
}

}  // namespace remat::common
