#include "search/frontier.h"

#include <algorithm>
#include <cstdio>

#include "search/memory_model.h"
#include "search/noise.h"
#include "search/units.h"

namespace remat::search {
namespace {

std::string Gib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", BytesToGib(static_cast<double>(bytes)));
  return buf;
}

bool Dominates(const FrontierPoint& b, const FrontierPoint& a) {
  return b.memory_bytes <= a.memory_bytes && b.tokens_per_s >= a.tokens_per_s &&
         (b.memory_bytes < a.memory_bytes || b.tokens_per_s > a.tokens_per_s);
}

}  // namespace

std::vector<FrontierPoint> EligiblePoints(const std::vector<TrialResult>& trials,
                                          MemoryMetric metric, uint64_t budget_bytes) {
  std::vector<FrontierPoint> out;
  for (const auto& t : trials) {
    if (t.status != TrialStatus::kOk || t.ranks.empty()) continue;
    const uint64_t mem = t.PeakBytes(metric);
    if (mem > budget_bytes) continue;
    out.push_back({t.policy, mem, t.tokens_per_s});
  }
  return out;
}

std::vector<FrontierPoint> ParetoFrontier(const std::vector<FrontierPoint>& points) {
  std::vector<FrontierPoint> out;
  for (const auto& a : points) {
    bool dominated = false;
    for (const auto& b : points) {
      if (Dominates(b, a)) {
        dominated = true;
        break;
      }
    }
    if (!dominated) out.push_back(a);
  }
  std::sort(out.begin(), out.end(), [](const FrontierPoint& x, const FrontierPoint& y) {
    if (x.memory_bytes != y.memory_bytes) return x.memory_bytes < y.memory_bytes;
    if (x.tokens_per_s != y.tokens_per_s) return x.tokens_per_s > y.tokens_per_s;
    return x.policy.ToString() < y.policy.ToString();
  });
  return out;
}

std::vector<FrontierPoint> ComputeFrontier(const std::vector<TrialResult>& trials,
                                           MemoryMetric metric, uint64_t budget_bytes) {
  return ParetoFrontier(EligiblePoints(trials, metric, budget_bytes));
}

std::vector<FrontierPoint> NoiseAwareFrontier(const std::vector<TrialResult>& trials,
                                              MemoryMetric metric, uint64_t budget_bytes,
                                              std::vector<double>* upper, double max_noise) {
  struct Point {
    FrontierPoint p;
    double high = 0;
  };
  std::vector<Point> points;
  for (const auto& t : trials) {
    if (t.status != TrialStatus::kOk || t.ranks.empty()) continue;
    const uint64_t mem = t.PeakBytes(metric);
    if (mem > budget_bytes) continue;
    double high = std::max(t.tokens_per_s, ThroughputIntervalOf(t).high);
    if (max_noise >= 0) high = std::min(high, t.tokens_per_s * (1 + max_noise));
    points.push_back({{t.policy, mem, t.tokens_per_s}, high});
  }
  std::sort(points.begin(), points.end(), [](const Point& x, const Point& y) {
    if (x.p.memory_bytes != y.p.memory_bytes) return x.p.memory_bytes < y.p.memory_bytes;
    if (x.p.tokens_per_s != y.p.tokens_per_s) return x.p.tokens_per_s > y.p.tokens_per_s;
    return x.p.policy.ToString() < y.p.policy.ToString();
  });
  std::vector<FrontierPoint> out;
  if (upper != nullptr) upper->clear();
  double bar = -1;  // the highest interval end kept so far
  for (const Point& x : points) {
    if (!out.empty() && !(x.p.tokens_per_s > bar)) continue;
    out.push_back(x.p);
    if (upper != nullptr) upper->push_back(x.high);
    bar = std::max(bar, x.high);
  }
  return out;
}

std::optional<Recommendation> RecommendPolicy(const SearchSpec& spec,
                                              const std::vector<TrialResult>& trials) {
  const MemoryMetric metric = spec.search.memory_metric;
  const uint64_t budget = spec.search.RecommendBudgetBytes();
  std::vector<RecommendationCandidate> fit;
  for (const auto& t : trials) {
    if (t.status != TrialStatus::kOk || t.ranks.empty() || !(t.tokens_per_s > 0)) continue;
    if (t.PeakBytes(metric) > budget) continue;
    RecommendationCandidate c;
    c.policy = t.policy;
    c.memory_bytes = t.PeakBytes(metric);
    c.tokens_per_s = t.tokens_per_s;
    c.noise = RelativeNoise(t);
    c.recompute_flops = EstimateMemory(spec, t.policy).recompute_flops;
    fit.push_back(std::move(c));
  }
  if (fit.empty()) return std::nullopt;
  Recommendation rec;
  rec.budget_bytes = budget;
  const RecommendationCandidate best =
      *std::max_element(fit.begin(), fit.end(),
                        [](const RecommendationCandidate& a, const RecommendationCandidate& b) {
                          if (a.tokens_per_s != b.tokens_per_s)
                            return a.tokens_per_s < b.tokens_per_s;
                          if (a.memory_bytes != b.memory_bytes)
                            return a.memory_bytes > b.memory_bytes;
                          return a.policy.ToString() > b.policy.ToString();
                        });
  for (auto& c : fit) {
    c.below_best = (best.tokens_per_s - c.tokens_per_s) / best.tokens_per_s;
    c.tolerance = std::max({kMinNoiseTolerance, best.noise, c.noise});
    if (c.below_best <= c.tolerance) rec.tied.push_back(c);
    if (c.policy == best.policy) rec.best = c;
  }
  // Least recompute first; the FLOP model gives equal figures to policies that replay the same
  // work (every full:uniform:N), which then go to the smaller memory.
  std::sort(rec.tied.begin(), rec.tied.end(),
            [](const RecommendationCandidate& a, const RecommendationCandidate& b) {
              if (a.recompute_flops != b.recompute_flops) {
                return a.recompute_flops < b.recompute_flops;
              }
              if (a.memory_bytes != b.memory_bytes) return a.memory_bytes < b.memory_bytes;
              return a.policy.ToString() < b.policy.ToString();
            });
  rec.choice = rec.tied.front();
  std::string within = Gib(budget);
  if (spec.search.memory_headroom_gib > 0) {
    within += " (the budget less " + Gib(spec.search.MemoryBudgetBytes() - budget) + " headroom)";
  }
  char buf[512];
  if (rec.tied.size() == 1) {
    std::snprintf(buf, sizeof(buf),
                  "the highest throughput within %s; no other policy that fits is within %.1f%% "
                  "(the measurement noise) of it",
                  within.c_str(), 100 * rec.best.tolerance);
  } else if (rec.choice.policy == rec.best.policy) {
    std::snprintf(buf, sizeof(buf),
                  "the highest throughput within %s and, of the %zu policies within the "
                  "measurement noise of it, the one that replays the least (%.1f GFLOP per step)",
                  within.c_str(), rec.tied.size(), rec.choice.recompute_flops / 1e9);
  } else {
    std::snprintf(buf, sizeof(buf),
                  "%zu policies within %s are within the measurement noise of the best "
                  "throughput (%s, %.0f tokens/s); this one is %.1f%% below it, inside its %.1f%% "
                  "band, and replays the least of them (%.1f GFLOP per step against %.1f)",
                  rec.tied.size(), within.c_str(), rec.best.policy.ToString().c_str(),
                  rec.best.tokens_per_s, 100 * rec.choice.below_best, 100 * rec.choice.tolerance,
                  rec.choice.recompute_flops / 1e9, rec.best.recompute_flops / 1e9);
  }
  rec.reason = buf;
  return rec;
}

std::string NothingFitsMessage(const std::vector<TrialResult>& trials, MemoryMetric metric,
                               uint64_t budget_bytes) {
  std::string msg = "no policy fits the budget of " + Gib(budget_bytes) + " (" + Name(metric) +
                    " memory)";
  const TrialResult* closest = nullptr;
  for (const auto& t : trials) {
    if (t.ranks.empty() || t.PeakBytes(metric) == 0) continue;
    if (!closest || t.PeakBytes(metric) < closest->PeakBytes(metric)) closest = &t;
  }
  if (closest) {
    msg += "; closest: " + closest->policy.ToString() + " at " + Gib(closest->PeakBytes(metric)) +
           " (" + Name(closest->status) + ")";
  } else {
    msg += "; no trial reported memory figures";
  }
  return msg;
}

double Hypervolume(const std::vector<FrontierPoint>& frontier, uint64_t budget_bytes,
                   double t_ref) {
  std::vector<FrontierPoint> pts;
  for (const auto& p : frontier) {
    if (p.memory_bytes <= budget_bytes && p.tokens_per_s > t_ref) pts.push_back(p);
  }
  std::sort(pts.begin(), pts.end(), [](const FrontierPoint& a, const FrontierPoint& b) {
    return a.memory_bytes < b.memory_bytes;
  });
  // Sweep memory from low to high; between consecutive memory values the dominated height is the
  // best throughput seen so far.
  double area = 0, best = t_ref;
  for (size_t i = 0; i < pts.size(); ++i) {
    best = std::max(best, pts[i].tokens_per_s);
    const double next = i + 1 < pts.size() ? static_cast<double>(pts[i + 1].memory_bytes)
                                           : static_cast<double>(budget_bytes);
    area += (next - static_cast<double>(pts[i].memory_bytes)) * (best - t_ref);
  }
  return area;
}

namespace {

// "rank 3", "ranks 0-7", "ranks 0-7, 16-23": the ranks (ascending) with consecutive ones joined.
std::string NameRanks(const std::vector<const RankResult*>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    size_t last = i;
    while (last + 1 < ranks.size() && ranks[last + 1]->rank == ranks[last]->rank + 1) ++last;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]->rank);
    if (last > i) out += "-" + std::to_string(ranks[last]->rank);
    i = last;
  }
  return out;
}

std::string Percent(double x) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%.0f%%", 100.0 * x);
  return buf;
}

}  // namespace

std::vector<std::string> DiagnoseFragmentation(const TrialResult& trial, uint64_t budget_bytes,
                                               double ratio) {
  constexpr uint64_t kMinGap = 256ull << 20;
  // One finding of each kind per trial, whatever the number of ranks: a layout proxy lists every
  // rank of a 1,024-GPU layout, and its stages differ by a few MiB each.
  std::vector<const RankResult*> capacity, fragmented;
  for (const RankResult& r : trial.ranks) {
    if (r.peak_allocated_bytes == 0 || r.peak_reserved_bytes < r.peak_allocated_bytes + kMinGap ||
        r.peak_reserved_bytes <= ratio * r.peak_allocated_bytes) {
      continue;
    }
    (budget_bytes > 0 && r.peak_allocated_bytes > budget_bytes ? capacity : fragmented)
        .push_back(&r);
  }
  std::sort(capacity.begin(), capacity.end(),
            [](const RankResult* a, const RankResult* b) { return a->rank < b->rank; });
  std::sort(fragmented.begin(), fragmented.end(),
            [](const RankResult* a, const RankResult* b) { return a->rank < b->rank; });
  std::vector<std::string> out;
  const std::string policy = trial.policy.ToString() + ": ";
  if (!capacity.empty()) {
    const RankResult* worst = *std::max_element(
        capacity.begin(), capacity.end(), [](const RankResult* a, const RankResult* b) {
          return a->peak_allocated_bytes < b->peak_allocated_bytes;
        });
    out.push_back(policy + NameRanks(capacity) + " allocated " +
                  (capacity.size() > 1 ? "up to " : "") + Gib(worst->peak_allocated_bytes) +
                  ", over the budget of " + Gib(budget_bytes) +
                  " by itself: capacity, not fragmentation (reserved " +
                  Gib(worst->peak_reserved_bytes) +
                  "); allocator settings cannot fix it, recompute or less static "
                  "memory can");
  }
  if (!fragmented.empty()) {
    // The figures quoted are those of the rank with the highest reserved peak (the one that
    // decides the fit); the percentage spans every rank named.
    const RankResult* worst = fragmented[0];
    double lo = 1e300, hi = 0;
    uint64_t retries = 0;
    for (const RankResult* r : fragmented) {
      if (r->peak_reserved_bytes > worst->peak_reserved_bytes) worst = r;
      const double extra = static_cast<double>(r->peak_reserved_bytes - r->peak_allocated_bytes) /
                           static_cast<double>(r->peak_allocated_bytes);
      lo = std::min(lo, extra);
      hi = std::max(hi, extra);
      retries = std::max(retries, r->alloc_retries);
    }
    const bool several = fragmented.size() > 1;
    const std::string lo_pct = Percent(lo), hi_pct = Percent(hi);  // "15-19%" when they differ
    const std::string pct =
        lo_pct == hi_pct ? hi_pct : lo_pct.substr(0, lo_pct.size() - 1) + "-" + hi_pct;
    std::string s = policy + NameRanks(fragmented) + " reserved " + (several ? "up to " : "") +
                    Gib(worst->peak_reserved_bytes) + " but allocated only " +
                    Gib(worst->peak_allocated_bytes) + (several ? " there (" : " (") + pct +
                    " more" + (several ? " across them" : "") +
                    "): allocator fragmentation or caching, not activations";
    if (retries > 0) {
      s += ", with " + std::to_string(retries) + " allocator retries" + (several ? " at most" : "");
    }
    s += "; try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before adding recompute";
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace remat::search
