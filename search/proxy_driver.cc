#include "search/proxy_driver.h"

#include <algorithm>

#include "search/depth_proxy.h"
#include "search/rules.h"

namespace remat::search {

bool MemoryCapped(const SearchSpec& spec) {
  return spec.search.memory_budget_gib < kUncappedBudgetGib;
}

SearchSpec DepthRunSpec(const SearchSpec& full, int layers, double timeout_s) {
  SearchSpec cut = AtDepth(full, layers);
  cut.search.memory_budget_gib = kUncappedBudgetGib;
  cut.search.trial_timeout_s = timeout_s;
  return cut;
}

TrialResult RunDepthProxies(const SearchSpec& full, const Policy& policy, const DepthRunner& run) {
  const Status valid = ValidatePolicy(full, policy);
  if (!valid.ok()) {
    TrialResult r;
    r.policy = policy;
    r.status = TrialStatus::kInvalid;
    r.message = valid.message();
    return r;
  }
  std::vector<TrialResult> measured;
  double spent = 0;
  for (int layers : full.search.proxy_layers) {
    // The depths share the trial's timeout; a depth never gets less than a millisecond (a
    // runner given 0 would read it as "no timeout").
    const double left = std::max(0.001, full.search.trial_timeout_s - spent);
    measured.push_back(run(DepthRunSpec(full, layers, left), layers));
    spent += std::max(0.0, measured.back().wall_s);
    if (measured.back().status != TrialStatus::kOk) break;
  }
  // A failed first depth stands for both: PredictFullDepth reports the first that failed.
  if (measured.size() < 2) measured.push_back(measured.front());
  TrialResult r = PredictFullDepth(full, measured[0], measured[1]);
  r.policy = policy;
  return r;
}

}  // namespace remat::search
