// The replay executor, and what all executors share.
#include "worker/trial_executor.h"

#include "proto/convert.h"
#include "worker/result_combiner.h"

namespace remat::worker {
namespace {

class ReplayExecutor : public TrialExecutor {
 public:
  v1::TrialResult Run(const TrialContext& context) override {
    const v1::TrialAssignment& a = *context.assignment;
    if (!a.replay_found()) {
      return StatusResult(a, v1::TRIAL_STATUS_FAILED, "not in replay table");
    }
    const double timeout = TrialTimeoutSeconds(a);
    const double wait = std::min(a.replay().wall_s(), timeout);
    if (wait > 0 && context.cancel && context.cancel->WaitFor(wait)) {
      return StatusResult(a, v1::TRIAL_STATUS_CANCELLED, "cancelled");
    }
    if (a.replay().wall_s() > timeout) {
      return StatusResult(a, v1::TRIAL_STATUS_TIMEOUT,
                          "replayed trial takes longer than search.trial_timeout_s");
    }
    v1::TrialResult result = a.replay().result();
    *result.mutable_policy() = a.policy();
    const v1::TrialStatus s = result.status();
    if (s == v1::TRIAL_STATUS_UNSPECIFIED || s == v1::TRIAL_STATUS_PENDING ||
        s == v1::TRIAL_STATUS_RUNNING) {
      result.set_status(v1::TRIAL_STATUS_FAILED);
      if (result.message().empty()) result.set_message("replay entry has no final status");
    }
    if (result.status() == v1::TRIAL_STATUS_OK && result.tokens_per_s() <= 0) {
      result.set_tokens_per_s(TokensPerSecond(a.spec(), result.step_time_s()));
    }
    return result;
  }
};

}  // namespace

search::SearchSpec AssignmentSpec(const v1::TrialAssignment& assignment) {
  auto spec = proto::FromProto(assignment.spec());
  return spec.ok() ? *spec : search::SearchSpec();
}

double TrialTimeoutSeconds(const v1::TrialAssignment& assignment) {
  return AssignmentSpec(assignment).search.trial_timeout_s;
}

std::unique_ptr<TrialExecutor> MakeReplayExecutor() { return std::make_unique<ReplayExecutor>(); }

}  // namespace remat::worker
