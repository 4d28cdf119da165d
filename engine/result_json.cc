#include "engine/result_json.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace remat::engine {
namespace {

nlohmann::json RanksJson(const std::vector<search::RankResult>& in) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& k : in) {
    ranks.push_back({{"rank", k.rank},
                     {"peak_allocated_bytes", k.peak_allocated_bytes},
                     {"peak_reserved_bytes", k.peak_reserved_bytes},
                     {"static_bytes", k.static_bytes},
                     {"alloc_retries", k.alloc_retries},
                     {"failing_request_bytes", k.failing_request_bytes},
                     {"step_time_s", k.step_time_s},
                     {"step_times_s", k.step_times_s},
                     {"warmup_steps_taken", k.warmup_steps_taken},
                     {"warmup_step_times_s", k.warmup_step_times_s}});
  }
  return ranks;
}

}  // namespace

std::string TrialResultJson(const search::TrialResult& r) {
  nlohmann::json proxies = nlohmann::json::array();
  for (const auto& m : r.proxies) {
    nlohmann::json one = {
        {"num_layers", m.num_layers}, {"step_time_s", m.step_time_s}, {"ranks", RanksJson(m.ranks)}};
    if (!m.role.empty()) {  // a layout proxy's stage role and the rank it measured
      one["role"] = m.role;
      one["rank"] = m.rank;
    }
    proxies.push_back(std::move(one));
  }
  uint64_t static_bytes = 0, alloc_retries = 0;
  for (const auto& k : r.ranks) {
    static_bytes = std::max(static_bytes, k.static_bytes);
    alloc_retries = std::max(alloc_retries, k.alloc_retries);
  }
  const nlohmann::json j = {{"policy", r.policy.ToString()},
                            {"predicted", r.predicted},
                            {"proxies", proxies},
                            {"status", search::Name(r.status)},
                            {"peak_allocated_bytes", r.PeakAllocatedBytes()},
                            {"peak_reserved_bytes", r.PeakReservedBytes()},
                            {"static_bytes", static_bytes},
                            {"alloc_retries", alloc_retries},
                            {"ranks", RanksJson(r.ranks)},
                            {"step_time_s", r.step_time_s},
                            {"step_time_spread_s", r.step_time_spread_s},
                            {"step_time_low_s", r.step_time_low_s},
                            {"step_time_high_s", r.step_time_high_s},
                            {"noise_target_met", r.noise_target_met},
                            {"measured_steps", r.measured_steps},
                            {"forced_load_balancing", r.forced_load_balancing},
                            {"tokens_per_s", r.tokens_per_s},
                            {"model_tflops", r.model_tflops},
                            {"loss", r.loss},
                            {"grad_norm", r.grad_norm},
                            {"setup_s", r.setup_s},
                            {"wall_s", r.wall_s},
                            {"warmup_steps_taken", r.warmup_steps_taken},
                            {"warmup_settled", r.warmup_settled},
                            {"step_time_relative_spread", r.RelativeSpread()},
                            {"versions", r.versions},
                            {"message", r.message}};
  return j.dump();
}

}  // namespace remat::engine
