// Trial executors: how a worker turns one leased trial (the domain Assignment the daemon converted
// once, worker/assignment.h) into a search::TrialResult.
//
//   builtin, megatron, command  a backend composed with a launcher (worker/trial_pipeline.h)
//   replay   the assignment's replay-table entry, after its wall_s (cancel ends the wait)
//
// Every failure of a trial is a result (status failed / timeout / oom / cancelled with a
// message), never an exception or an error of the worker. Executors neither set nor read the
// result's policy: the daemon reports it under the assignment's (MakeReport). Thread-safety: Run
// may be called concurrently from many threads, for different trials.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "search/trial.h"
#include "worker/assignment.h"
#include "worker/cancel_token.h"
#include "worker/command_template.h"
#include "worker/process_runner.h"
#include "worker/slots.h"

namespace remat::worker {

struct TrialContext {
  const Assignment* assignment = nullptr;  // read without error (the daemon checked)
  std::vector<Slot> slots;                 // world_size slots, rank r runs on slots[r]
  std::string trial_dir;  // an empty folder of this attempt's own (requests, results, logs)
  const CancelToken* cancel = nullptr;
};

// The logs of process `index` (the rank, for per-rank runs) of a run in `run_dir`.
std::string RankStdoutPath(const std::string& run_dir, int index);
std::string RankStderrPath(const std::string& run_dir, int index);

class TrialExecutor {
 public:
  virtual ~TrialExecutor() = default;
  virtual search::TrialResult Run(const TrialContext& context) = 0;
};

// Compositions with the local launcher (worker/trial_pipeline.h), as tests and the daemon use
// them: the backend's options and the process group's limits (timeout_s from each trial's spec).
struct BuiltinExecutorOptions {
  std::string trial_binary;           // path of remat-trial
  double collective_timeout_s = 300;  // handed to each rank; capped at the trial timeout
  GroupLimits limits;                 // timeout_s is taken from each trial's spec
};
std::unique_ptr<TrialExecutor> MakeBuiltinExecutor(BuiltinExecutorOptions options);

std::unique_ptr<TrialExecutor> MakeReplayExecutor();

struct CommandExecutorOptions {
  std::map<std::string, CommandTemplate> templates;  // by name; only these may run
  GroupLimits limits;                                // timeout_s is taken from each trial's spec
};
std::unique_ptr<TrialExecutor> MakeCommandExecutor(CommandExecutorOptions options);

}  // namespace remat::worker
