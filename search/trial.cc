#include "search/trial.h"

#include <algorithm>

namespace remat::search {
namespace {
constexpr const char* kStatus[] = {"ok", "oom", "failed", "timeout", "invalid", "cancelled"};
}  // namespace

const char* Name(TrialStatus s) { return kStatus[static_cast<int>(s)]; }

double MedianStepTime(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::vector<double> MeasuredSteps(const std::vector<double>& all, int warmup_steps,
                                  int measure_steps) {
  const size_t begin = std::min(all.size(), static_cast<size_t>(std::max(0, warmup_steps)));
  const size_t end =
      std::min(all.size(), begin + static_cast<size_t>(std::max(0, measure_steps)));
  return std::vector<double>(all.begin() + begin, all.begin() + end);
}

std::optional<TrialStatus> ParseTrialStatus(const std::string& s) {
  for (int i = 0; i < 6; ++i) {
    if (s == kStatus[i]) return static_cast<TrialStatus>(i);
  }
  return std::nullopt;
}

uint64_t TrialResult::PeakAllocatedBytes() const {
  uint64_t m = 0;
  for (const auto& r : ranks) m = std::max(m, r.peak_allocated_bytes);
  return m;
}

uint64_t TrialResult::PeakReservedBytes() const {
  uint64_t m = 0;
  for (const auto& r : ranks) m = std::max(m, r.peak_reserved_bytes);
  return m;
}

uint64_t TrialResult::PeakBytes(MemoryMetric metric) const {
  return metric == MemoryMetric::kReserved ? PeakReservedBytes() : PeakAllocatedBytes();
}

double TrialResult::RelativeSpread() const {
  if (!(step_time_s > 0)) return 0;
  double spread = step_time_spread_s;
  if (!(spread > 0)) {
    for (const auto& r : ranks) {
      if (r.step_times_s.size() < 2) continue;
      const auto [lo, hi] = std::minmax_element(r.step_times_s.begin(), r.step_times_s.end());
      spread = std::max(spread, *hi - *lo);
    }
  }
  return spread / step_time_s;
}

double TokensPerSecond(const SearchSpec& spec, double step_time_s) {
  if (!(step_time_s > 0)) return 0;
  return static_cast<double>(spec.EffectiveGlobalBatchSize()) * spec.model.seq_length /
         step_time_s;
}

}  // namespace remat::search
