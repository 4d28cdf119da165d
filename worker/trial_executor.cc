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

std::string RankStdoutPath(const std::string& run_dir, int index) {
  return (std::filesystem::path(run_dir) / ("stdout-" + std::to_string(index) + ".log")).string();
}

std::string RankStderrPath(const std::string& run_dir, int index) {
  return (std::filesystem::path(run_dir) / ("stderr-" + std::to_string(index) + ".log")).string();
}

}  // namespace remat::worker
