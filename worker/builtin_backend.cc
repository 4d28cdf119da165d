// The builtin backend (worker/trial_pipeline.h): one remat-trial process per rank.
//
// Hand-off per rank r (files in the run's folder):
//   request-r.pb   binary remat.v1.TrialRequest (spec, policy, rank, world_size, rendezvous_dir,
//                  collective_timeout_s)
//   result-r.pb    binary remat.v1.TrialResult written by the rank
// The ranks meet in rendezvous/ inside the run's folder (fresh for every attempt). remat-trial
// runs depth and layout proxies itself (engine/trial_runner.cc, through search/proxy_driver.h).
#include <algorithm>

#include "worker/rank_collector.h"
#include "worker/trial_pipeline.h"

namespace remat::worker {
namespace {

std::string ResultPath(const std::string& dir, int r) {
  return dir + "/result-" + std::to_string(r) + ".pb";
}

class BuiltinBackend : public Backend {
 public:
  explicit BuiltinBackend(BuiltinBackendOptions options) : options_(std::move(options)) {}

  std::optional<search::TrialResult> Refuse(const Assignment&) const override {
    return std::nullopt;  // remat-trial refuses what it cannot run, as status invalid
  }
  bool RunsDepthProxies() const override { return true; }

  std::string Prepare(const TrialContext& context, const search::SearchSpec& spec,
                      LaunchPlan* plan) const override {
    const Assignment& a = *context.assignment;
    Assignment run = a;
    run.spec = spec;
    if (std::string error = WriteTrialRequests(
            run, plan->run_dir,
            std::min(options_.collective_timeout_s, spec.search.trial_timeout_s));
        !error.empty()) {
      return error;
    }
    plan->per_rank = true;
    plan->stale = {"result-*.pb", "rendezvous"};
    plan->fresh_dirs = {"rendezvous"};
    for (int r = 0; r < a.world_size; ++r) {
      plan->processes.push_back({{options_.trial_binary, "--request", RequestPath(plan->run_dir, r),
                                  "--result", ResultPath(plan->run_dir, r)},
                                 {}});
    }
    return "";
  }

  search::TrialResult Read(const TrialContext& context, const search::SearchSpec&,
                           const LaunchPlan& plan, const LaunchOutcome& outcome,
                           double peer_exit_grace_s) const override {
    return CollectRankResults(
        *context.assignment, plan, outcome, "remat-trial",
        [&](int r) -> std::optional<search::TrialResult> {
          v1::TrialResult file;
          if (!ReadResultFile(ResultPath(plan.run_dir, r), &file)) return std::nullopt;
          return ResultFromWire(file);
        },
        peer_exit_grace_s);
  }

 private:
  BuiltinBackendOptions options_;
};

}  // namespace

std::unique_ptr<Backend> MakeBuiltinBackend(BuiltinBackendOptions options) {
  return std::make_unique<BuiltinBackend>(std::move(options));
}

}  // namespace remat::worker
