// Talking to Slurm from the worker (worker/slurm_launcher.h): running one Slurm command with a
// time limit, and the batched poll of every job a launcher follows.
//
// SlurmJobPoller: one batched query of every followed job per poll interval, shared by the
// trials' threads. The first thread whose answer is older than the interval asks Slurm about
// all of them (one `squeue -t all --jobs=ID,...`; one `sacct -j ID,...` for the jobs the
// controller has forgotten), the others wait for that answer: 64 running trials cost one squeue
// a second, not 64 scontrol calls. Thread-safety: RunSlurmCommand is reentrant; the poller's
// methods may be called from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "worker/slurm_job.h"

namespace remat::worker {

struct SlurmCommandResult {
  bool ok = false;  // started and exited 0
  std::string out, err, how;
};

// Runs `argv` in `dir` (its output in dir/<name>.out and .err, read back: at most 1 MiB each),
// killed after `timeout_s`.
SlurmCommandResult RunSlurmCommand(const std::vector<std::string>& argv, const std::string& dir,
                                   const std::string& name, double timeout_s);

// What sbatch, squeue and a job's ranks wrote; "" when it is not a regular file of at most
// 1 MiB (a job's directory is the job's: a FIFO there must not block the worker).
std::string ReadSmallFile(const std::string& path);

class SlurmJobPoller {
 public:
  explicit SlurmJobPoller(const SlurmLauncherOptions& options) : options_(options) {}

  // Follow `job` until the matching Remove (counted: Next never waits for a job no poll asks
  // about).
  void Add(const std::string& job);
  void Remove(const std::string& job);

  // The state of `job` from a poll newer than *generation (updated), waiting for one when
  // needed (at most about one poll interval plus the query); nullopt when Slurm could not say.
  // `dir` holds the query's output files when this thread is the one that asks.
  std::optional<SlurmJobInfo> Next(const std::string& job, const std::string& dir,
                                   uint64_t* generation);

 private:
  using Clock = std::chrono::steady_clock;
  std::map<std::string, SlurmJobInfo> QueryAll(const std::set<std::string>& jobs,
                                               const std::string& dir) const;

  const SlurmLauncherOptions& options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> jobs_;  // followed jobs, with how many trials follow each
  std::set<std::string> answered_;   // the jobs the last poll asked about
  std::map<std::string, std::optional<SlurmJobInfo>> answers_;
  uint64_t generation_ = 0;
  bool polling_ = false;
  Clock::time_point last_poll_{};
};

}  // namespace remat::worker
