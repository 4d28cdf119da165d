// Runs the processes of one trial (one per rank, or one command) as a single process group, and
// ends the whole group on timeout, on cancel, or when one rank has ended (died, or finished) and
// the rest linger.
//
// The children start with posix_spawn (safe in a multi-threaded daemon), inherit the
// environment plus the overrides given, and write stdout/stderr to files. Grandchildren stay in
// the group unless they leave it themselves, so killing the group ends a launcher's ranks too.
// After the direct children have exited, anything left in the group is killed before the
// children are reaped (so the group id cannot have been recycled).
//
// Thread-safety: RunProcessGroup may run concurrently from many threads (each waits only for
// its own children). It never throws; failures are in the returned outcome.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "worker/cancel_token.h"

namespace remat::worker {

struct ChildSpec {
  std::vector<std::string> argv;  // argv[0]: the program; searched in PATH when it has no '/'
  std::vector<std::pair<std::string, std::string>> env;  // set over the inherited environment
  std::string stdout_path;                               // "" -> /dev/null
  std::string stderr_path;                               // "" -> /dev/null
  std::string cwd;                                       // "" -> the daemon's working directory
};

struct GroupLimits {
  double timeout_s = 0;     // 0: none. Past it the group gets SIGTERM, then SIGKILL.
  double kill_grace_s = 5;  // SIGTERM -> SIGKILL delay
  // A child failed (non-zero status or a signal): the others get this long, then the group dies.
  double peer_failure_grace_s = 30;
  // A child finished (status 0) while the others still run: they get this long, then the group
  // dies (0: no limit). The ranks of one trial end together; one still running a minute after
  // its peer finished is stuck (say, in a collective the peer will never join).
  double peer_exit_grace_s = 60;
  double poll_interval_s = 0.02;
  // When set, each child's group, pid and start time are written here as it starts
  // (WriteGroupRecord), so that a worker restarted after a crash can end a group its previous
  // run left (KillRecordedGroup).
  std::string group_record_path;
};

struct ChildExit {
  bool started = false;
  std::string spawn_error;  // why it did not start
  bool exited = false;      // exited normally, with exit_code
  int exit_code = -1;
  int signal = 0;  // killed by this signal
  bool ok() const { return started && exited && exit_code == 0; }
  // "exited with status 3", "killed by signal 9 (Killed)", "did not start: ..."
  std::string Describe() const;
};

struct GroupOutcome {
  std::vector<ChildExit> children;  // same order as the specs
  bool timed_out = false;           // the group was killed for exceeding timeout_s
  bool cancelled = false;           // the group was killed because `cancel` fired
  bool lingered_kill = false;       // killed after a child ended and the others lingered
  int first_ended = -1;             // with lingered_kill: the child whose end started the clock
  bool first_ended_cleanly = false; // ... and it had finished with status 0 (else it failed)
  double elapsed_s = 0;
};

GroupOutcome RunProcessGroup(const std::vector<ChildSpec>& children, const GroupLimits& limits,
                             const CancelToken* cancel);

// The start time of process `pid` (field 22 of /proc/PID/stat, in clock ticks since boot);
// 0 when it does not exist. With the pid it names one process: a pid is recycled, a pid and its
// start time are not.
unsigned long long ProcessStartTime(int pid);

// Appends "PGID PID START" for process `pid` of group `pgid` to `path`. False on error.
bool WriteGroupRecord(const std::string& path, int pgid, int pid);

// Reads a record written by WriteGroupRecord and, when one of its processes still runs (same
// pid, same start time) in the recorded group, SIGKILLs the whole group. Returns true when it
// killed a group. While one member lives the group id cannot have been reused; when none does,
// nothing is killed.
bool KillRecordedGroup(const std::string& path);
// The record's name inside a trial folder (the executors write it, the daemon reads it).
inline constexpr char kGroupRecordFile[] = ".remat-group";

// The last `max_lines` lines (at most `max_bytes` bytes) of a text file, trimmed, lines joined
// with " | ". Empty when the file is missing or empty.
std::string FileTail(const std::string& path, int max_lines = 6, size_t max_bytes = 1200);

// Runs `argv` and returns its stdout (at most 1 MiB) if it exits 0 within `timeout_s`.
// Returns nullopt-like empty + false when it does not start, fails or times out.
bool CaptureOutput(const std::vector<std::string>& argv, double timeout_s, std::string* out);

}  // namespace remat::worker
