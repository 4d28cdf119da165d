// A process's resource use as Linux reports it in /proc: memory, open file descriptors, CPU
// time. The metrics of rematd and remat-worker read their own (process_* series) and the worker
// reads its trials' (remat_worker_trial_memory_bytes). Standard library and POSIX only.
//
// Thread-safety: ReadProcessStats is a plain function of /proc; call it from any thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>

namespace remat::common {

struct ProcessStats {
  int64_t resident_bytes = 0;     // VmRSS
  int64_t virtual_bytes = 0;      // VmSize
  int64_t open_fds = -1;          // entries of /proc/PID/fd; -1 when it cannot be listed
  int64_t max_fds = -1;           // the soft RLIMIT_NOFILE; -1 when unknown or unlimited
  double cpu_seconds = 0;         // user + system time
  double start_time_seconds = 0;  // since the Unix epoch
};

// The stats of process `pid` (0: this process); nullopt when the process is gone or its /proc
// entry cannot be read (another user's, under hidepid).
std::optional<ProcessStats> ReadProcessStats(pid_t pid = 0);

// What the processes below `root` (its children, their children, ...; not `root` itself) hold
// resident, summed, and how many there are. Scans /proc once; processes that end meanwhile are
// skipped.
struct DescendantsMemory {
  int64_t resident_bytes = 0;
  int processes = 0;
};
DescendantsMemory ReadDescendantsMemory(pid_t root);

}  // namespace remat::common
