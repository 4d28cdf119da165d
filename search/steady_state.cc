#include "search/steady_state.h"

#include <algorithm>

#include "search/noise.h"
#include "search/trial.h"

namespace remat::search {

double RelativeSpreadOf(const std::vector<double>& times) {
  if (times.size() < 2) return 0;
  const double median = MedianStepTime(times);
  if (!(median > 0)) return 0;
  const auto [lo, hi] = std::minmax_element(times.begin(), times.end());
  return (*hi - *lo) / median;
}

double WindowSpread(const std::vector<double>& times, int window) {
  if (window < 1 || static_cast<int>(times.size()) < window) return -1;
  return RelativeSpreadOf(std::vector<double>(times.end() - window, times.end()));
}

bool Settled(const SearchOptions& options, const std::vector<double>& warmup_times) {
  const double spread = WindowSpread(warmup_times, options.steady_window);
  // A spread at the tolerance counts, rounding aside (1.05 - 1.0 is a hair over 0.05 in doubles).
  return spread >= 0 && spread <= options.steady_tolerance * (1 + 1e-9);
}

bool WarmupDone(const SearchOptions& options, const std::vector<double>& warmup_times) {
  const int taken = static_cast<int>(warmup_times.size());
  if (taken < options.warmup_steps) return false;
  if (taken >= std::max(options.warmup_max_steps, options.warmup_steps)) return true;
  return Settled(options, warmup_times);
}

SteadySplit SplitSteadyState(const SearchOptions& options, const std::vector<double>& step_times) {
  SteadySplit out;
  std::vector<double> warmup;
  size_t w = 0;
  while (w < step_times.size() && !WarmupDone(options, warmup)) warmup.push_back(step_times[w++]);
  out.warmup_steps = static_cast<int>(w);
  out.settled = Settled(options, warmup) && WarmupDone(options, warmup);
  out.measured = AdaptiveMeasuredSteps(step_times, static_cast<int>(w), options);
  return out;
}

}  // namespace remat::search
