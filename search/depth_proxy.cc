#include "search/depth_proxy.h"

#include <algorithm>
#include <cstdio>

#include "search/memory_model.h"

namespace remat::search {
namespace {

// The value at depth `l` on the line through (d1, v1) and (d2, v2); never negative.
double Extend(double v1, double v2, int d1, int d2, int l) {
  const double v = v1 + (v2 - v1) * static_cast<double>(l - d1) / static_cast<double>(d2 - d1);
  return std::max(0.0, v);
}

uint64_t ExtendBytes(uint64_t v1, uint64_t v2, int d1, int d2, int l) {
  return static_cast<uint64_t>(Extend(static_cast<double>(v1), static_cast<double>(v2), d1, d2, l) + 0.5);
}

ProxyMeasurement Measurement(const TrialResult& r, int layers) {
  ProxyMeasurement m;
  m.num_layers = layers;
  m.ranks = r.ranks;
  m.step_time_s = r.step_time_s;
  return m;
}

}  // namespace

std::string ProxyPolicyProblem(const SearchSpec& spec, const Policy& policy) {
  const auto& d = spec.search.proxy_layers;
  if (d.size() != 2 || !policy.IsFull()) return "";
  // Full recompute applies per model chunk (Megatron's TransformerBlock).
  const int pp =
      std::max(1, spec.parallel.pipeline_model_parallel_size) * spec.parallel.VirtualChunks();
  const int s1 = d[0] / pp, s2 = d[1] / pp;
  // Both proxies must keep at least one layer that is not recomputed: at N = depth the backward
  // peak is the recompute transient, past it the stored layers, and the line would bend.
  if (policy.method == RecomputeMethod::kBlock && policy.num_layers >= s1) {
    return policy.ToString() + " must recompute fewer layers per stage than the shallow proxy "
           "has (" + std::to_string(s1) + ") to be extrapolated from these depths";
  }
  if (policy.method == RecomputeMethod::kUniform &&
      (s1 % policy.num_layers != 0 || s2 % policy.num_layers != 0)) {
    return policy.ToString() + " needs proxy depths per stage that are multiples of " +
           std::to_string(policy.num_layers);
  }
  return "";
}

SearchSpec AtDepth(const SearchSpec& spec, int layers) {
  SearchSpec cut = spec;
  cut.model.num_layers = layers;
  std::vector<int>& pattern = cut.model.moe_layer_freq.pattern;
  if (!pattern.empty()) pattern.resize(layers);
  cut.search.proxy_layers.clear();
  return cut;
}

TrialResult PredictFullDepth(const SearchSpec& full, const TrialResult& shallow,
                             const TrialResult& deep) {
  const int d1 = full.search.proxy_layers.at(0), d2 = full.search.proxy_layers.at(1);
  const int l = full.model.num_layers;
  TrialResult r;
  r.policy = shallow.policy;
  r.predicted = true;
  r.proxies = {Measurement(shallow, d1), Measurement(deep, d2)};
  r.setup_s = shallow.setup_s + deep.setup_s;
  r.wall_s = shallow.wall_s + deep.wall_s;
  const TrialResult* bad = shallow.status != TrialStatus::kOk ? &shallow
                           : deep.status != TrialStatus::kOk  ? &deep
                                                              : nullptr;
  if (bad) {
    r.status = bad->status;
    r.ranks = bad->ranks;
    r.message = "proxy at " + std::to_string(bad == &shallow ? d1 : d2) + " layers: " +
                Name(bad->status) + (bad->message.empty() ? "" : ": " + bad->message);
    return r;
  }
  if (shallow.ranks.size() != deep.ranks.size()) {
    r.status = TrialStatus::kFailed;
    r.message = "proxy depths reported different rank counts";
    return r;
  }
  for (size_t i = 0; i < shallow.ranks.size(); ++i) {
    const RankResult& a = shallow.ranks[i];
    const RankResult& b = deep.ranks[i];
    RankResult p;
    p.rank = a.rank;
    p.peak_allocated_bytes = ExtendBytes(a.peak_allocated_bytes, b.peak_allocated_bytes, d1, d2, l);
    p.peak_reserved_bytes = ExtendBytes(a.peak_reserved_bytes, b.peak_reserved_bytes, d1, d2, l);
    p.static_bytes = ExtendBytes(a.static_bytes, b.static_bytes, d1, d2, l);
    p.alloc_retries = std::max(a.alloc_retries, b.alloc_retries);
    p.step_time_s = Extend(a.step_time_s, b.step_time_s, d1, d2, l);
    r.ranks.push_back(p);
  }
  r.status = TrialStatus::kOk;
  r.step_time_s = Extend(shallow.step_time_s, deep.step_time_s, d1, d2, l);
  r.step_time_spread_s = std::max(shallow.step_time_spread_s, deep.step_time_spread_s) *
                         static_cast<double>(l) / d2;
  r.tokens_per_s = TokensPerSecond(full, r.step_time_s);
  // Model TFLOP/s scale with the work per step over the time per step.
  const double deep_flops = ModelFlopsPerStep(AtDepth(full, d2));
  r.model_tflops = r.step_time_s > 0 && deep_flops > 0
                       ? deep.model_tflops * (ModelFlopsPerStep(full) / deep_flops) *
                             (deep.step_time_s / r.step_time_s)
                       : 0;
  r.loss = deep.loss;
  r.grad_norm = deep.grad_norm;
  r.warmup_steps_taken = std::max(shallow.warmup_steps_taken, deep.warmup_steps_taken);
  r.warmup_settled = shallow.warmup_settled && deep.warmup_settled;
  r.versions = deep.versions;
  char buf[160];
  std::snprintf(buf, sizeof(buf),
                "predicted for %d layers from proxies at %d and %d layers (peak %.2f -> %.2f GiB)",
                l, d1, d2, shallow.PeakReservedBytes() / 1073741824.0,
                deep.PeakReservedBytes() / 1073741824.0);
  r.message = buf;
  return r;
}

}  // namespace remat::search
