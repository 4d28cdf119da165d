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
  // A layout proxy's one process speaks for every rank of the layout: no rank to name.
  const bool layout_proxy = assignment.spec.search.layout_proxy;

  TrialStatus status = TrialStatus::kOk;
  std::map<int, search::RankResult> ranks;
  // Depth proxies by depth (every rank's figures at that depth); a layout proxy's stage proxies
  // (one process stood for the whole layout) by role, as the engine named them. In the order
  // first seen (the engine's order: depths ascending, stages in pipeline order).
  std::map<std::pair<std::string, int>, size_t> proxy_index;
  std::vector<search::ProxyMeasurement> proxies;
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
      if (first_rank != std::numeric_limits<int>::max() && r.message.rfind("rank ", 0) != 0 &&
          !layout_proxy) {
        message += "rank " + std::to_string(first_rank) + ": ";
      }
      message += r.message;
    }
    predicted = predicted || r.predicted;
    for (const search::ProxyMeasurement& p : r.proxies) {
      auto [it, added] = proxy_index.insert({{p.role, p.num_layers}, proxies.size()});
      if (added) proxies.emplace_back();
      search::ProxyMeasurement& merged = proxies[it->second];
      merged.num_layers = p.num_layers;
      merged.role = p.role;
      merged.rank = p.rank;
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
  for (search::ProxyMeasurement& p : proxies) {
    std::sort(p.ranks.begin(), p.ranks.end(),
              [](const search::RankResult& a, const search::RankResult& b) {
                return a.rank < b.rank;
              });
    out.proxies.push_back(p);
  }
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
