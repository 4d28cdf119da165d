// Trial executors: how a worker turns one leased TrialAssignment into a TrialResult.
//
//   builtin  one remat-trial process per rank (TrialRequest file in, TrialResult file out)
//   replay   the assignment's replay-table entry, after its wall_s (cancel ends the wait)
//   command  an operator-configured command template (worker/command_template.h), which
//            writes a metrics file (worker/README.md) that the worker reads
//
// Every failure of a trial is a result (status failed / timeout / oom / cancelled with a
// message), never an exception or an error of the worker. Thread-safety: Run may be called
// concurrently from many threads, for different trials.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "remat/v1/remat.pb.h"
#include "search/spec.h"
#include "worker/cancel_token.h"
#include "worker/command_template.h"
#include "worker/process_runner.h"
#include "worker/slots.h"

namespace remat::worker {

namespace v1 = ::remat::v1;

struct TrialContext {
  const v1::TrialAssignment* assignment = nullptr;
  std::vector<Slot> slots;  // world_size slots, rank r runs on slots[r]
  std::string trial_dir;    // an empty folder of this attempt's own (requests, results, logs)
  const CancelToken* cancel = nullptr;
};

class TrialExecutor {
 public:
  virtual ~TrialExecutor() = default;
  virtual v1::TrialResult Run(const TrialContext& context) = 0;
};

// The assignment's spec in domain form: proto::FromProto fills in every omitted field with its
// default (search/spec.h, the one home of the defaults). The defaults alone when the spec cannot
// be read (the coordinator validated it, so only a foreign coordinator gets there).
search::SearchSpec AssignmentSpec(const v1::TrialAssignment& assignment);

// search.trial_timeout_s of the assignment's spec.
double TrialTimeoutSeconds(const v1::TrialAssignment& assignment);

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
