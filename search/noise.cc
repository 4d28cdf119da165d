#include "search/noise.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "search/limits.h"

namespace remat::search {

Status ValidateNoiseOptions(const SearchOptions& o) {
  if (!(o.noise_target >= 0 && o.noise_target < 1)) {
    return InvalidArgument(
        "search.noise_target: must be 0 (measure exactly measure_steps) or a fraction below 1 "
        "(e.g. 0.02: the median step known to within 2%)");
  }
  if (o.max_measure_steps < 1 || o.max_measure_steps > limits::kMaxSteps) {
    return InvalidArgument("search.max_measure_steps: must be a positive integer of at most " +
                           std::to_string(limits::kMaxSteps));
  }
  return OkStatus();
}

double MedianInterval::RelativeHalfWidth() const {
  return median_s > 0 ? (high_s - low_s) / 2 / median_s : 0;
}

double BinomialHalfBelow(int n, int k) {
  if (k <= 0 || n < 0) return 0;
  if (k > n) return 1;
  const double log_total = n * std::log(2.0);
  const double lg_n = std::lgamma(n + 1.0);
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    sum += std::exp(lg_n - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - log_total);
  }
  return std::min(sum, 1.0);
}

MedianInterval MedianConfidenceInterval(std::vector<double> times, double confidence) {
  MedianInterval out;
  out.steps = static_cast<int>(times.size());
  if (times.empty()) return out;
  out.median_s = MedianStepTime(times);
  std::sort(times.begin(), times.end());
  const int n = out.steps;
  // Coverage grows as k shrinks (a wider interval); walk k up from 1 while it still reaches the
  // confidence, summing the binomial's lower tail term by term.
  const double log_total = n * std::log(2.0);
  const double lg_n = std::lgamma(n + 1.0);
  auto term = [&](int i) {  // P(B = i)
    return std::exp(lg_n - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - log_total);
  };
  double below = term(0);  // P(B < k) for k = 1
  int best_k = 0;
  double best_coverage = 0;
  for (int k = 1; 2 * k <= n + 1; ++k) {
    const double coverage = std::max(0.0, 1 - 2 * below);
    if (coverage < confidence) break;
    best_k = k;
    best_coverage = coverage;
    below += term(k);
  }
  if (best_k == 0) {  // too few steps for the confidence: [min, max], with what it covers
    best_k = 1;
    best_coverage = std::max(0.0, 1 - 2 * term(0));
  }
  out.low_s = times[best_k - 1];
  out.high_s = times[n - best_k];
  out.coverage = std::max(0.0, best_coverage);
  return out;
}

int MeasureStepCap(const SearchOptions& options) {
  if (!(options.noise_target > 0)) return options.measure_steps;
  return std::max(options.measure_steps, options.max_measure_steps);
}

bool MeasureDone(const SearchOptions& options, const std::vector<double>& times) {
  const int n = static_cast<int>(times.size());
  if (n < options.measure_steps) return false;
  if (n >= MeasureStepCap(options)) return true;
  const MedianInterval ci = MedianConfidenceInterval(times);
  return ci.coverage >= kMedianConfidence && ci.RelativeHalfWidth() <= options.noise_target;
}

std::vector<double> AdaptiveMeasuredSteps(const std::vector<double>& step_times, int warmup_steps,
                                          const SearchOptions& options) {
  const size_t begin =
      std::min(step_times.size(), static_cast<size_t>(std::max(0, warmup_steps)));
  std::vector<double> out;
  for (size_t i = begin; i < step_times.size() && !MeasureDone(options, out); ++i) {
    out.push_back(step_times[i]);
  }
  return out;
}

std::optional<MedianInterval> TrialInterval(const TrialResult& result) {
  const RankResult* slowest = nullptr;
  for (const auto& r : result.ranks) {
    if (r.step_times_s.empty()) continue;
    if (!slowest || r.step_time_s > slowest->step_time_s) slowest = &r;
  }
  if (slowest) return MedianConfidenceInterval(slowest->step_times_s);
  if (result.step_time_high_s > 0 && result.step_time_low_s > 0) {
    MedianInterval out;
    out.median_s = result.step_time_s;
    out.low_s = result.step_time_low_s;
    out.high_s = result.step_time_high_s;
    return out;  // steps and coverage unknown
  }
  if (result.step_time_spread_s > 0 && result.step_time_s > 0) {
    // Only the range of the steps is known, not where the median sits in it: taken as centred
    // (as the plots draw it). Coverage unknown.
    MedianInterval out;
    out.median_s = result.step_time_s;
    out.low_s =
        std::max(result.step_time_s - result.step_time_spread_s / 2, 0.5 * result.step_time_s);
    out.high_s = result.step_time_s + result.step_time_spread_s / 2;
    return out;
  }
  return std::nullopt;
}

double RelativeNoise(const TrialResult& result) {
  const double spread = result.RelativeSpread();
  const auto ci = TrialInterval(result);
  if (!ci || ci->coverage < kMedianConfidence || !(ci->median_s > 0)) return spread;
  return std::max((ci->high_s - ci->low_s) / ci->median_s, 0.5 * spread);
}

namespace {
void Record(const SearchOptions& options, const MedianInterval& ci, TrialResult* result) {
  result->step_time_low_s = ci.low_s;
  result->step_time_high_s = ci.high_s;
  result->measured_steps = std::max(result->measured_steps, ci.steps);
  result->noise_target_met = options.noise_target > 0 && ci.coverage >= kMedianConfidence &&
                             ci.RelativeHalfWidth() <= options.noise_target;
}
}  // namespace

void SetStepTimeInterval(const SearchOptions& options, const std::vector<double>& times,
                         TrialResult* result) {
  Record(options, MedianConfidenceInterval(times), result);
}

void FillStepTimeInterval(const SearchOptions& options, TrialResult* result) {
  if (result->step_time_high_s > 0) return;
  const auto ci = TrialInterval(*result);
  if (!ci || !(ci->high_s > 0)) return;
  Record(options, *ci, result);
}

ThroughputInterval ThroughputIntervalOf(const TrialResult& result) {
  ThroughputInterval out{result.tokens_per_s, result.tokens_per_s};
  const double step = result.step_time_s;
  if (!(step > 0) || !(result.tokens_per_s > 0)) return out;
  double lo = result.step_time_low_s, hi = result.step_time_high_s;
  if (!(hi > 0)) {
    const auto ci = TrialInterval(result);
    if (!ci) return out;
    lo = ci->low_s;
    hi = ci->high_s;
  }
  // tokens/s is inversely proportional to the step: scale the recorded throughput so a trial
  // whose throughput was set from a different step count (global batch) keeps its own units.
  if (lo > 0) out.high = std::max(out.high, result.tokens_per_s * step / lo);
  if (hi > 0) out.low = std::min(out.low, result.tokens_per_s * step / hi);
  return out;
}

std::string RoutingNoiseCaution(const SearchSpec& spec) {
  if (!spec.model.IsMoe() || spec.model.moe_router_force_load_balancing ||
      spec.search.backend == Backend::kReplay) {
    return "";
  }
  return "the router learns its routing (model.moe_router_force_load_balancing is off), so step "
         "times drift as the experts' loads change over the first tens of steps and policies are "
         "told apart by less than that drift; Megatron's benchmarks measure with it on";
}

}  // namespace remat::search
