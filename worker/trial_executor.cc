// The replay executor.
#include "worker/trial_executor.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "search/noise.h"

namespace remat::worker {
namespace {

using search::TrialStatus;

class ReplayExecutor : public TrialExecutor {
 public:
  search::TrialResult Run(const TrialContext& context) override {
    const Assignment& a = *context.assignment;
    if (!a.replay) return StatusResult(TrialStatus::kFailed, "not in replay table");
    const double timeout = a.spec.search.trial_timeout_s;
    const double wait = std::min(a.replay_wall_s, timeout);
    if (wait > 0 && context.cancel && context.cancel->WaitFor(wait)) {
      return StatusResult(TrialStatus::kCancelled, "cancelled");
    }
    if (a.replay_wall_s > timeout) {
      return StatusResult(TrialStatus::kTimeout,
                          "replayed trial takes longer than search.trial_timeout_s");
    }
    search::TrialResult result = *a.replay;
    if (result.status == TrialStatus::kOk && result.tokens_per_s <= 0) {
      result.tokens_per_s = search::TokensPerSecond(a.spec, result.step_time_s);
    }
    search::FillStepTimeInterval(a.spec.search, &result);  // from the table's steps, if any
    return result;
  }
};

}  // namespace

std::unique_ptr<TrialExecutor> MakeReplayExecutor() { return std::make_unique<ReplayExecutor>(); }

std::string RankStderrPath(const std::string& trial_dir, int rank) {
  return (std::filesystem::path(trial_dir) / ("stderr-" + std::to_string(rank) + ".log")).string();
}

ChildSpec RankProcess(const TrialContext& context, int rank, std::vector<std::string> argv) {
  const std::filesystem::path dir(context.trial_dir);
  ChildSpec child;
  child.argv = std::move(argv);
  child.env.emplace_back("NCCL_NVLS_ENABLE", "0");
  if (context.slots[rank].gpu) {
    child.env.emplace_back("CUDA_VISIBLE_DEVICES", std::to_string(context.slots[rank].index));
  }
  child.stdout_path = (dir / ("stdout-" + std::to_string(rank) + ".log")).string();
  child.stderr_path = RankStderrPath(context.trial_dir, rank);
  child.cwd = dir.string();
  return child;
}

GroupLimits TrialGroupLimits(const GroupLimits& base, double timeout_s,
                             const std::string& trial_dir) {
  GroupLimits limits = base;
  limits.timeout_s = timeout_s;
  limits.group_record_path = (std::filesystem::path(trial_dir) / kGroupRecordFile).string();
  return limits;
}

std::optional<search::TrialResult> EndedEarly(const GroupOutcome& outcome, double timeout_s,
                                              const std::string& trial_dir) {
  if (outcome.cancelled) return StatusResult(search::TrialStatus::kCancelled, "cancelled");
  if (!outcome.timed_out) return std::nullopt;
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%.4g s", timeout_s);
  std::string msg = std::string("killed after search.trial_timeout_s = ") + seconds;
  const std::string tail = FileTail(RankStderrPath(trial_dir, 0), 3, 600);
  if (!tail.empty()) msg += "; rank 0 stderr: " + tail;
  return StatusResult(search::TrialStatus::kTimeout, msg);
}

}  // namespace remat::worker
