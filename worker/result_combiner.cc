#include "worker/result_combiner.h"

#include <algorithm>
#include <limits>
#include <map>

namespace remat::worker {

using search::TrialStatus;

int StatusSeverity(TrialStatus status) {
  switch (status) {
    case TrialStatus::kOk:
      return 0;
    case TrialStatus::kFailed:
      return 1;
    case TrialStatus::kOom:
      return 2;
    case TrialStatus::kInvalid:
      return 3;
    case TrialStatus::kTimeout:
      return 4;
    case TrialStatus::kCancelled:
      return 5;
  }
  return 1;
}

search::TrialResult CombineRankResults(const Assignment& assignment,
                                       const std::vector<search::TrialResult>& per_rank) {
  search::TrialResult out;
  const int world = std::max(1, assignment.world_size);

  TrialStatus status = TrialStatus::kOk;
  std::map<int, search::RankResult> ranks;
  std::map<int, search::ProxyMeasurement> proxies;  // by depth: every rank's figures at that depth
  // Layout proxies come from one process (a proxy trial leases one slot), one per stage role:
  // kept as they are, in stage order, never merged by depth (stages may have equal depths).
  std::vector<search::ProxyMeasurement> roles;
  bool predicted = false;
  std::string message;
  double step = 0, spread = 0, setup = 0;
  bool settled = !per_rank.empty();
  double tflops = std::numeric_limits<double>::infinity();
  int loss_rank = std::numeric_limits<int>::max();
  for (const search::TrialResult& r : per_rank) {
    if (StatusSeverity(r.status) > StatusSeverity(status)) status = r.status;
    int first_rank = std::numeric_limits<int>::max();
    for (const search::RankResult& rr : r.ranks) {
      ranks[rr.rank] = rr;
      first_rank = std::min(first_rank, rr.rank);
    }
    if (!r.message.empty()) {
      if (!message.empty()) message += "; ";
      if (first_rank != std::numeric_limits<int>::max() && r.message.rfind("rank ", 0) != 0) {
        message += "rank " + std::to_string(first_rank) + ": ";
      }
      message += r.message;
    }
    predicted = predicted || r.predicted;
    for (const search::ProxyMeasurement& p : r.proxies) {
      if (!p.role.empty()) {
        roles.push_back(p);
        continue;
      }
      search::ProxyMeasurement& merged = proxies[p.num_layers];
      merged.num_layers = p.num_layers;
      merged.step_time_s = std::max(merged.step_time_s, p.step_time_s);
      merged.ranks.insert(merged.ranks.end(), p.ranks.begin(), p.ranks.end());
    }
    step = std::max(step, r.step_time_s);
    out.warmup_steps_taken = std::max(out.warmup_steps_taken, r.warmup_steps_taken);
    settled = settled && r.warmup_settled;
    if (out.versions.empty()) out.versions = r.versions;
    spread = std::max(spread, r.step_time_spread_s);
    setup = std::max(setup, r.setup_s);
    if (r.model_tflops > 0) tflops = std::min(tflops, r.model_tflops);
    if (first_rank < loss_rank && r.status == TrialStatus::kOk) {
      loss_rank = first_rank;
      out.loss = r.loss;
      out.grad_norm = r.grad_norm;
    }
  }
  if (status == TrialStatus::kOk && static_cast<int>(ranks.size()) < world) {
    status = TrialStatus::kFailed;
    if (!message.empty()) message += "; ";
    message +=
        std::to_string(ranks.size()) + " of " + std::to_string(world) + " ranks reported a result";
  }
  for (auto& [rank, rr] : ranks) out.ranks.push_back(rr);
  out.predicted = predicted;
  for (auto& [depth, p] : proxies) {
    std::sort(p.ranks.begin(), p.ranks.end(),
              [](const search::RankResult& a, const search::RankResult& b) {
                return a.rank < b.rank;
              });
    out.proxies.push_back(p);
  }
  out.proxies.insert(out.proxies.end(), roles.begin(), roles.end());
  out.status = status;
  out.message = message;
  out.setup_s = setup;
  if (status == TrialStatus::kOk) {
    out.step_time_s = step;
    out.step_time_spread_s = spread;
    out.warmup_settled = settled;
    out.tokens_per_s = search::TokensPerSecond(assignment.spec, step);
    if (tflops != std::numeric_limits<double>::infinity()) out.model_tflops = tflops;
  }
  return out;
}

}  // namespace remat::worker
