// Trial executors: how a worker turns one leased trial (the domain Assignment the daemon converted
// once, worker/assignment.h) into a search::TrialResult.
//
//   builtin  one remat-trial process per rank (TrialRequest file in, TrialResult file out)
//   replay   the assignment's replay-table entry, after its wall_s (cancel ends the wait)
//   command  an operator-configured command template (worker/command_template.h), which
//            writes a metrics file (worker/README.md) that the worker reads
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

// One rank's process of a trial started per rank (builtin, megatron): `argv`, NCCL_NVLS_ENABLE=0
// (NVLink multicast can take a shared host's GPUs out of service), the rank's GPU as
// CUDA_VISIBLE_DEVICES when its slot has one, stdout-R.log / RankStderrPath in the trial folder,
// which is also its working directory.
ChildSpec RankProcess(const TrialContext& context, int rank, std::vector<std::string> argv);
std::string RankStderrPath(const std::string& trial_dir, int rank);

// The limits of a trial's process group: `base` with the trial's timeout and the group record
// in the trial folder (kGroupRecordFile) by which a restarted worker finds the processes a
// killed predecessor left.
GroupLimits TrialGroupLimits(const GroupLimits& base, double timeout_s,
                             const std::string& trial_dir);

// A per-rank trial's group that ended early: cancelled, or killed at `timeout_s` (with rank 0's
// last stderr lines); nullopt when it ran to its end and the ranks' outputs are to be read.
std::optional<search::TrialResult> EndedEarly(const GroupOutcome& outcome, double timeout_s,
                                              const std::string& trial_dir);

class TrialExecutor {
 public:
  virtual ~TrialExecutor() = default;
  virtual search::TrialResult Run(const TrialContext& context) = 0;
};

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
