#include "worker/result_combiner.h"

#include <algorithm>
#include <limits>
#include <map>

#include "proto/convert.h"
#include "search/trial.h"

namespace remat::worker {

int StatusSeverity(v1::TrialStatus status) {
  switch (status) {
    case v1::TRIAL_STATUS_OK:
      return 0;
    case v1::TRIAL_STATUS_FAILED:
      return 1;
    case v1::TRIAL_STATUS_OOM:
      return 2;
    case v1::TRIAL_STATUS_INVALID:
      return 3;
    case v1::TRIAL_STATUS_TIMEOUT:
      return 4;
    case v1::TRIAL_STATUS_CANCELLED:
      return 5;
    default:
      return 1;  // not a final status: treat as failed
  }
}

double TokensPerSecond(const v1::SearchSpec& spec, double step_time_s) {
  auto domain = proto::FromProto(spec);  // the contract's formula lives in search/trial.h
  return domain.ok() ? search::TokensPerSecond(*domain, step_time_s) : 0;
}

v1::TrialResult StatusResult(const v1::TrialAssignment& assignment, v1::TrialStatus status,
                             const std::string& message) {
  v1::TrialResult result;
  *result.mutable_policy() = assignment.policy();
  result.set_status(status);
  result.set_message(message);
  return result;
}

v1::TrialResult CombineRankResults(const v1::TrialAssignment& assignment,
                                   const std::vector<v1::TrialResult>& per_rank) {
  v1::TrialResult out;
  *out.mutable_policy() = assignment.policy();
  const int world = std::max(1, assignment.world_size());

  v1::TrialStatus status = v1::TRIAL_STATUS_OK;
  std::map<int, v1::RankResult> ranks;
  std::map<int, v1::ProxyMeasurement> proxies;  // by depth: every rank's figures at that depth
  bool predicted = false;
  std::string message;
  double step = 0, spread = 0, setup = 0;
  double tflops = std::numeric_limits<double>::infinity();
  int loss_rank = std::numeric_limits<int>::max();
  for (const v1::TrialResult& r : per_rank) {
    v1::TrialStatus s = r.status();
    if (s == v1::TRIAL_STATUS_UNSPECIFIED || s == v1::TRIAL_STATUS_PENDING ||
        s == v1::TRIAL_STATUS_RUNNING) {
      s = v1::TRIAL_STATUS_FAILED;
    }
    if (StatusSeverity(s) > StatusSeverity(status)) status = s;
    int first_rank = std::numeric_limits<int>::max();
    for (const v1::RankResult& rr : r.ranks()) {
      ranks[rr.rank()] = rr;
      first_rank = std::min(first_rank, rr.rank());
    }
    if (!r.message().empty()) {
      if (!message.empty()) message += "; ";
      if (first_rank != std::numeric_limits<int>::max() && r.message().rfind("rank ", 0) != 0) {
        message += "rank " + std::to_string(first_rank) + ": ";
      }
      message += r.message();
    }
    predicted = predicted || r.predicted();
    for (const v1::ProxyMeasurement& p : r.proxies()) {
      v1::ProxyMeasurement& merged = proxies[p.num_layers()];
      merged.set_num_layers(p.num_layers());
      merged.set_step_time_s(std::max(merged.step_time_s(), p.step_time_s()));
      for (const v1::RankResult& rr : p.ranks()) *merged.add_ranks() = rr;
    }
    step = std::max(step, r.step_time_s());
    spread = std::max(spread, r.step_time_spread_s());
    setup = std::max(setup, r.setup_s());
    if (r.model_tflops() > 0) tflops = std::min(tflops, r.model_tflops());
    if (first_rank < loss_rank && s == v1::TRIAL_STATUS_OK) {
      loss_rank = first_rank;
      out.set_loss(r.loss());
      out.set_grad_norm(r.grad_norm());
    }
  }
  if (status == v1::TRIAL_STATUS_OK && static_cast<int>(ranks.size()) < world) {
    status = v1::TRIAL_STATUS_FAILED;
    if (!message.empty()) message += "; ";
    message +=
        std::to_string(ranks.size()) + " of " + std::to_string(world) + " ranks reported a result";
  }
  for (auto& [rank, rr] : ranks) *out.add_ranks() = rr;
  out.set_predicted(predicted);
  for (auto& [depth, p] : proxies) {
    std::sort(p.mutable_ranks()->begin(), p.mutable_ranks()->end(),
              [](const v1::RankResult& a, const v1::RankResult& b) { return a.rank() < b.rank(); });
    *out.add_proxies() = p;
  }
  out.set_status(status);
  out.set_message(message);
  out.set_setup_s(setup);
  if (status == v1::TRIAL_STATUS_OK) {
    out.set_step_time_s(step);
    out.set_step_time_spread_s(spread);
    out.set_tokens_per_s(TokensPerSecond(assignment.spec(), step));
    if (tflops != std::numeric_limits<double>::infinity()) out.set_model_tflops(tflops);
  }
  return out;
}

}  // namespace remat::worker
