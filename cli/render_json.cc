#include "cli/render_json.h"

#include <google/protobuf/util/json_util.h>
#include <nlohmann/json.hpp>
#include <map>
#include <string>
#include <vector>

#include "cli/render_format.h"

namespace remat::cli {

using render::MaxAllocated;
using render::MaxReserved;
using render::StatusOf;

namespace {

using nlohmann::ordered_json;

// JSON null where a figure is unknown rather than a made-up zero: the proto's plain numbers
// cannot say "not reported", so zero stands for it where zero is not a possible measurement
// (a model's weights, a step's time, a training loss).
ordered_json Known(double v) { return v != 0 ? ordered_json(v) : ordered_json(nullptr); }
ordered_json Known(uint64_t v) { return v != 0 ? ordered_json(v) : ordered_json(nullptr); }

// One rank's figures; its step time only when the trial measured its steps.
ordered_json RankJson(const v1::RankResult& rr, bool measured) {
  ordered_json rj;
  rj["rank"] = rr.rank();
  rj["peak_allocated_bytes"] = rr.peak_allocated_bytes();
  rj["peak_reserved_bytes"] = rr.peak_reserved_bytes();
  rj["static_bytes"] = Known(rr.static_bytes());
  rj["alloc_retries"] = rr.alloc_retries();
  rj["failing_request_bytes"] = Known(rr.failing_request_bytes());
  rj["step_time_s"] = measured ? Known(rr.step_time_s()) : ordered_json(nullptr);
  rj["step_times_s"] = std::vector<double>(rr.step_times_s().begin(), rr.step_times_s().end());
  rj["warmup_steps_taken"] = rr.warmup_steps_taken();
  rj["warmup_step_times_s"] =
      std::vector<double>(rr.warmup_step_times_s().begin(), rr.warmup_step_times_s().end());
  return rj;
}

// The proxy trials a prediction came from (depth or layout proxies), each with its ranks' peaks.
ordered_json ProxiesJson(const v1::TrialResult& r) {
  ordered_json proxies = ordered_json::array();
  for (const v1::ProxyMeasurement& p : r.proxies()) {
    ordered_json pj;
    pj["num_layers"] = p.num_layers();
    if (!p.role().empty()) {  // a layout proxy: the stage this rank stood for
      pj["role"] = p.role();
      pj["rank"] = p.rank();
    }
    pj["step_time_s"] = p.step_time_s();
    ordered_json pranks = ordered_json::array();
    for (const auto& rr : p.ranks()) {
      pranks.push_back({{"rank", rr.rank()},
                        {"peak_allocated_bytes", rr.peak_allocated_bytes()},
                        {"peak_reserved_bytes", rr.peak_reserved_bytes()}});
    }
    pj["ranks"] = std::move(pranks);
    proxies.push_back(std::move(pj));
  }
  return proxies;
}

// One trial: its figures (null where unknown), its ranks, its combined runs and its proxies.
ordered_json TrialJson(const v1::Trial& t) {
  const v1::TrialResult& r = t.result();
  ordered_json tj;
  // Throughput, step time, loss and the like exist only for a trial that measured its steps.
  const bool measured = StatusOf(t) == v1::TRIAL_STATUS_OK;
  const bool has_ranks = r.ranks_size() > 0;
  tj["policy"] = t.policy().canonical();
  tj["status"] = TrialStatusName(StatusOf(t));
  tj["peak_allocated_bytes"] = has_ranks ? ordered_json(MaxAllocated(r)) : ordered_json(nullptr);
  tj["peak_reserved_bytes"] = has_ranks ? ordered_json(MaxReserved(r)) : ordered_json(nullptr);
  ordered_json ranks = ordered_json::array();
  for (const auto& rr : r.ranks()) ranks.push_back(RankJson(rr, measured));
  tj["ranks"] = std::move(ranks);
  tj["step_time_s"] = measured ? Known(r.step_time_s()) : ordered_json(nullptr);
  tj["tokens_per_s"] = measured ? Known(r.tokens_per_s()) : ordered_json(nullptr);
  tj["loss"] = measured ? Known(r.loss()) : ordered_json(nullptr);
  tj["grad_norm"] = measured ? Known(r.grad_norm()) : ordered_json(nullptr);
  tj["message"] = r.message();
  tj["id"] = t.id();
  tj["reason"] = t.reason();
  tj["step_time_spread_s"] = measured ? ordered_json(r.step_time_spread_s()) : ordered_json(nullptr);
  // The spread relative to the step time ((max - min) / median): the trial's noise.
  tj["step_time_relative_spread"] =
      measured && r.step_time_s() > 0 ? ordered_json(r.step_time_spread_s() / r.step_time_s())
                                      : ordered_json(nullptr);
  // The median's 90% distribution-free interval (search/noise.h); null when not known.
  const bool interval = measured && r.step_time_high_s() > 0;
  tj["step_time_low_s"] = interval ? ordered_json(r.step_time_low_s()) : ordered_json(nullptr);
  tj["step_time_high_s"] = interval ? ordered_json(r.step_time_high_s()) : ordered_json(nullptr);
  tj["noise_target_met"] = measured ? ordered_json(r.noise_target_met()) : ordered_json(nullptr);
  tj["measured_steps"] = measured ? ordered_json(r.measured_steps()) : ordered_json(nullptr);
  tj["forced_load_balancing"] = r.forced_load_balancing();
  tj["warmup_steps_taken"] = measured ? ordered_json(r.warmup_steps_taken()) : ordered_json(nullptr);
  tj["warmup_settled"] = measured ? ordered_json(r.warmup_settled()) : ordered_json(nullptr);
  tj["numerics_mismatch"] =
      t.numerics_mismatch().empty() ? ordered_json(nullptr) : ordered_json(t.numerics_mismatch());
  tj["remeasure"] = t.remeasure();
  tj["versions"] = std::map<std::string, std::string>(r.versions().begin(), r.versions().end());
  if (t.has_combined()) {  // the policy's runs combined: what its frontier point used
    const v1::TrialResult& c = t.combined();
    tj["combined"] = {{"step_time_s", Known(c.step_time_s())},
                      {"step_time_spread_s", c.step_time_spread_s()},
                      {"tokens_per_s", Known(c.tokens_per_s())},
                      {"peak_allocated_bytes", MaxAllocated(c)},
                      {"peak_reserved_bytes", MaxReserved(c)}};
  } else {
    tj["combined"] = nullptr;
  }
  tj["model_tflops"] = measured ? Known(r.model_tflops()) : ordered_json(nullptr);
  tj["setup_s"] = Known(r.setup_s());
  tj["wall_s"] = r.wall_s();
  tj["reused"] = r.reused();
  tj["predicted"] = r.predicted();
  tj["attempts"] = t.attempts();
  tj["worker_id"] = t.worker_id();
  if (r.proxies_size() > 0) tj["proxies"] = ProxiesJson(r);
  return tj;
}

// Why the recommendation fell where it did (the coordinator's search::RecommendPolicy).
ordered_json RecommendationDetailJson(const v1::RecommendationDetail& d) {
  ordered_json tied = ordered_json::array();
  for (const v1::RecommendationCandidate& c : d.tied()) {
    ordered_json cj;
    cj["policy"] = c.policy();
    cj["memory_bytes"] = c.memory_bytes();
    cj["tokens_per_s"] = c.tokens_per_s();
    cj["step_spread"] = c.noise();
    cj["recompute_flops"] = c.recompute_flops();
    cj["below_best"] = c.below_best();
    cj["tolerance"] = c.tolerance();
    tied.push_back(std::move(cj));
  }
  ordered_json dj;
  dj["choice"] = d.choice().policy();
  dj["best"] = d.best().policy();
  dj["best_tokens_per_s"] = d.best().tokens_per_s();
  dj["budget_bytes"] = d.budget_bytes();
  dj["tied"] = std::move(tied);
  dj["reason"] = d.reason();
  return dj;
}

}  // namespace

std::string ResultJson(const v1::Search& s) {
  const std::string& metric = s.memory_metric();
  ordered_json j;
  j["id"] = s.id();
  j["name"] = s.spec().name();
  j["state"] = StateName(s.state());
  j["memory_metric"] = metric;
  j["memory_budget_bytes"] = s.memory_budget_bytes();
  ordered_json trials = ordered_json::array();
  for (const v1::Trial& t : s.trials()) trials.push_back(TrialJson(t));
  j["trials"] = std::move(trials);
  j["frontier"] = ordered_json(std::vector<std::string>(s.frontier().begin(), s.frontier().end()));
  if (s.has_recommendation()) {
    j["recommendation"] = s.recommendation();
    const v1::Apply& apply = s.apply();
    j["apply"] = {{"megatron_bridge", apply.megatron_bridge()},
                  {"megatron_lm", apply.megatron_lm()},
                  {"megatron_lm_remove", apply.megatron_lm_remove()}};
  } else {
    j["recommendation"] = nullptr;
    j["apply"] = nullptr;
  }
  // Why the recommendation fell where it did (the coordinator's search::RecommendPolicy).
  j["recommendation_detail"] = s.has_recommendation_detail()
                                   ? RecommendationDetailJson(s.recommendation_detail())
                                   : ordered_json(nullptr);
  j["message"] = s.message();
  j["trials_done"] = s.trials_done();
  j["trials_planned"] = s.trials_planned();
  j["fragmentation"] = std::vector<std::string>(s.fragmentation().begin(), s.fragmentation().end());
  // Numerical sanity: every trial's loss and grad norm against the control's (search/provenance.h).
  j["numerics"] = {{"compared", s.numerics_compared()},
                   {"tolerance", s.numerics_tolerance()},
                   {"reference", s.numerics_reference().empty() ? ordered_json(nullptr)
                                                                : ordered_json(s.numerics_reference())},
                   {"ok", s.numerics_mismatches_size() == 0},
                   {"mismatches", std::vector<std::string>(s.numerics_mismatches().begin(),
                                                           s.numerics_mismatches().end())}};
  // Provenance: what the trials ran with, and the spec they ran (Megatron defaults resolved).
  j["versions"] = std::map<std::string, std::string>(s.versions().begin(), s.versions().end());
  std::string spec_json;
  google::protobuf::util::JsonPrintOptions print;
  print.preserve_proto_field_names = true;
  if (google::protobuf::util::MessageToJsonString(s.spec(), &spec_json, print).ok()) {
    j["spec"] = ordered_json::parse(spec_json);
  } else {
    j["spec"] = nullptr;
  }
  j["owner"] = s.owner();
  j["created_unix_ms"] = s.created_unix_ms();
  j["updated_unix_ms"] = s.updated_unix_ms();
  return j.dump(2) + "\n";
}

}  // namespace remat::cli
