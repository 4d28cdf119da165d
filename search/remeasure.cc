#include "search/remeasure.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "search/frontier.h"
#include "search/noise.h"

namespace remat::search {
namespace {

std::string Percent(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", 100 * v);
  return buf;
}

// Pools the ok runs of one policy (at least two).
TrialResult Pool(const SearchSpec& spec, const std::vector<const TrialResult*>& runs) {
  TrialResult out = *runs.front();
  std::map<int, RankResult> ranks;
  for (const RankResult& r : out.ranks) ranks[r.rank] = r;
  bool every_rank_timed = true;
  for (size_t i = 1; i < runs.size(); ++i) {
    for (const RankResult& r : runs[i]->ranks) {
      auto [it, fresh] = ranks.emplace(r.rank, r);
      if (fresh) continue;
      RankResult& m = it->second;
      m.peak_allocated_bytes = std::max(m.peak_allocated_bytes, r.peak_allocated_bytes);
      m.peak_reserved_bytes = std::max(m.peak_reserved_bytes, r.peak_reserved_bytes);
      m.alloc_retries = std::max(m.alloc_retries, r.alloc_retries);
      m.step_times_s.insert(m.step_times_s.end(), r.step_times_s.begin(), r.step_times_s.end());
      m.warmup_steps_taken = std::max(m.warmup_steps_taken, r.warmup_steps_taken);
    }
  }
  double step = 0, lo = 0, hi = 0;
  bool any = false;
  out.ranks.clear();
  for (auto& [rank, r] : ranks) {
    if (r.step_times_s.empty()) {
      every_rank_timed = false;
    } else {
      r.step_time_s = MedianStepTime(r.step_times_s);
      const auto [mn, mx] = std::minmax_element(r.step_times_s.begin(), r.step_times_s.end());
      lo = any ? std::min(lo, *mn) : *mn;
      hi = any ? std::max(hi, *mx) : *mx;
      any = true;
    }
    step = std::max(step, r.step_time_s);
    out.ranks.push_back(r);
  }
  if (!every_rank_timed || !any) {
    // Without per-step times (a backend that reports medians only): the runs' median.
    std::vector<double> medians;
    for (const TrialResult* r : runs) medians.push_back(r->step_time_s);
    step = MedianStepTime(medians);
    const auto [mn, mx] = std::minmax_element(medians.begin(), medians.end());
    lo = *mn;
    hi = *mx;
  }
  const double first_step = out.step_time_s;
  out.step_time_s = step;
  out.step_time_spread_s = hi - lo;
  if (every_rank_timed && any) {
    // The pooled median's 90% interval, not the range of every pooled step: a range only grows
    // with more steps, so two runs pooled would tie with more policies than either run alone
    // (up to 6 steps the interval is the range).
    const RankResult* slowest = nullptr;
    for (const RankResult& r : out.ranks) {
      if (!slowest || r.step_time_s > slowest->step_time_s) slowest = &r;
    }
    const MedianInterval ci = MedianConfidenceInterval(slowest->step_times_s);
    if (ci.coverage >= kMedianConfidence) out.step_time_spread_s = ci.high_s - ci.low_s;
  }
  out.tokens_per_s = TokensPerSecond(spec, step);
  if (step > 0 && first_step > 0) out.model_tflops *= first_step / step;
  for (size_t i = 1; i < runs.size(); ++i) {
    out.warmup_steps_taken = std::max(out.warmup_steps_taken, runs[i]->warmup_steps_taken);
    out.warmup_settled = out.warmup_settled && runs[i]->warmup_settled;
    out.wall_s += runs[i]->wall_s;
  }
  out.reused = false;
  // The pooled steps' interval, not the first run's (none when the runs reported medians only).
  out.step_time_low_s = out.step_time_high_s = 0;
  out.measured_steps = 0;
  out.noise_target_met = false;
  if (every_rank_timed && any) FillStepTimeInterval(spec.search, &out);
  return out;
}

}  // namespace

std::vector<TrialResult> CombineRemeasured(const SearchSpec& spec,
                                           const std::vector<TrialResult>& results) {
  std::vector<std::string> order;
  std::map<std::string, std::vector<const TrialResult*>> by_policy;
  for (const TrialResult& r : results) {
    const std::string key = r.policy.ToString();
    auto& runs = by_policy[key];
    if (runs.empty()) order.push_back(key);
    runs.push_back(&r);
  }
  std::vector<TrialResult> out;
  out.reserve(order.size());
  for (const std::string& key : order) {
    const auto& runs = by_policy[key];
    if (runs.size() == 1) {
      out.push_back(*runs.front());
      continue;
    }
    std::vector<const TrialResult*> ok;
    std::string others;
    for (const TrialResult* r : runs) {
      if (r->status == TrialStatus::kOk && !r->predicted) {
        ok.push_back(r);
      } else {
        others += (others.empty() ? "" : ", ") + std::string(Name(r->status));
      }
    }
    if (ok.empty()) {
      out.push_back(*runs.front());
      continue;
    }
    TrialResult pooled = ok.size() == 1 ? *ok.front() : Pool(spec, ok);
    std::string note = "measured " + std::to_string(runs.size()) + " times";
    if (ok.size() > 1) note += ", " + std::to_string(ok.size()) + " runs' steps pooled";
    if (!others.empty()) note += "; the other runs: " + others;
    pooled.message += (pooled.message.empty() ? "" : "; ") + note;
    out.push_back(std::move(pooled));
  }
  return out;
}

std::vector<Remeasure> NearTiesToRemeasure(const SearchSpec& spec,
                                           const std::vector<TrialResult>& results) {
  if (spec.search.backend == Backend::kReplay) return {};
  std::map<std::string, int> runs;
  for (const TrialResult& r : results) {
    if (++runs[r.policy.ToString()] > 1) return {};  // the one round has run
  }
  return RemeasureCandidates(spec, results);
}

std::vector<Remeasure> RemeasureCandidates(const SearchSpec& spec,
                                           const std::vector<TrialResult>& results) {
  std::map<std::string, int> runs;
  for (const TrialResult& r : results) ++runs[r.policy.ToString()];
  const std::vector<TrialResult> measured = CombineRemeasured(spec, results);
  std::map<std::string, const TrialResult*> by_policy;
  for (const TrialResult& r : measured) by_policy[r.policy.ToString()] = &r;
  auto noise = [&](const Policy& p) {
    auto it = by_policy.find(p.ToString());
    return it == by_policy.end() ? 0.0 : RelativeNoise(*it->second);
  };
  auto measured_once = [&](const Policy& p) {
    auto it = by_policy.find(p.ToString());
    return it != by_policy.end() && !it->second->predicted && runs[p.ToString()] == 1;
  };

  // Candidates with their priority: what decides the recommendation first (the choice and the
  // best, then the other tied policies, closest first), then frontier near-ties, closest first.
  struct Pick {
    Policy policy;
    std::string reason;
    int rank_class = 0;
    double closeness = 0;
  };
  std::vector<Pick> picks;
  std::set<std::string> picked;
  auto add = [&](const Policy& p, const std::string& reason, int rank_class, double closeness) {
    if (!measured_once(p)) return;
    if (!picked.insert(p.ToString()).second) return;
    picks.push_back({p, reason, rank_class, closeness});
  };
  if (auto rec = RecommendPolicy(spec, measured); rec && rec->tied.size() > 1) {
    for (const RecommendationCandidate& c : rec->tied) {
      const bool decides = c.policy == rec->choice.policy || c.policy == rec->best.policy;
      add(c.policy,
          "re-measure: tied with the best (" + rec->best.policy.ToString() +
              ") for the recommendation, " + Percent(c.below_best) + " below it (band " +
              Percent(c.tolerance) + ")",
          decides ? 0 : 1, c.below_best);
    }
  }
  // Candidates for the recommendation whose throughput interval (search/noise.h) overlaps the
  // best's: which of them is faster is not known yet, whatever the tie band says.
  if (auto rec = RecommendPolicy(spec, measured)) {
    const auto best = by_policy.find(rec->best.policy.ToString());
    const ThroughputInterval b = ThroughputIntervalOf(*best->second);
    bool any_overlap = false;
    for (const TrialResult& r : measured) {
      if (r.policy == rec->best.policy || r.status != TrialStatus::kOk || r.ranks.empty() ||
          r.PeakBytes(spec.search.memory_metric) > rec->budget_bytes || !(r.tokens_per_s > 0)) {
        continue;
      }
      const ThroughputInterval t = ThroughputIntervalOf(r);
      if (t.high < b.low || b.high <= b.low) continue;
      any_overlap = true;
      add(r.policy,
          "re-measure: its throughput interval overlaps the best's (" +
              rec->best.policy.ToString() + ", " +
              Percent(rec->best.tokens_per_s / r.tokens_per_s - 1) +
              " apart) for the recommendation",
          1, (rec->best.tokens_per_s - r.tokens_per_s) / rec->best.tokens_per_s);
    }
    if (any_overlap) {
      add(rec->best.policy,
          "re-measure: the best fitting throughput, overlapped by another's interval", 0, 0);
    }
  }
  const std::vector<FrontierPoint> frontier =
      ComputeFrontier(measured, spec.search.memory_metric, spec.search.MemoryBudgetBytes());
  for (size_t i = 0; i < frontier.size(); ++i) {
    for (size_t j = 0; j < frontier.size(); ++j) {
      if (i == j) continue;
      const FrontierPoint& a = frontier[i];
      const FrontierPoint& b = frontier[j];
      const double top = std::max(a.tokens_per_s, b.tokens_per_s);
      if (!(top > 0)) continue;
      const double apart = std::abs(a.tokens_per_s - b.tokens_per_s) / top;
      const double band = std::max({kMinNoiseTolerance, noise(a.policy), noise(b.policy)});
      if (apart <= band) {
        add(a.policy,
            "re-measure: frontier point within " + Percent(apart) + " of " + b.policy.ToString() +
                " (noise band " + Percent(band) + ")",
            2, apart);
      }
    }
  }
  // The cost bound: a quarter of the policies measured (at least 2), so a noisy surface where
  // everything ties does not double the search.
  std::stable_sort(picks.begin(), picks.end(), [](const Pick& a, const Pick& b) {
    if (a.rank_class != b.rank_class) return a.rank_class < b.rank_class;
    return a.closeness < b.closeness;
  });
  const size_t limit = std::max<size_t>(kMinRemeasures, (measured.size() + 3) / 4);
  if (picks.size() > limit) picks.resize(limit);
  std::map<std::string, std::string> why;
  std::vector<Policy> order;
  for (const Pick& p : picks) {
    why[p.policy.ToString()] = p.reason;
    order.push_back(p.policy);
  }
  std::vector<Remeasure> out;
  for (const Policy& p : order) out.push_back({p, why[p.ToString()]});
  std::sort(out.begin(), out.end(), [&](const Remeasure& a, const Remeasure& b) {
    const uint64_t ma = by_policy[a.policy.ToString()]->PeakBytes(spec.search.memory_metric);
    const uint64_t mb = by_policy[b.policy.ToString()]->PeakBytes(spec.search.memory_metric);
    if (ma != mb) return ma < mb;
    return a.policy.ToString() < b.policy.ToString();
  });
  return out;
}

}  // namespace remat::search
