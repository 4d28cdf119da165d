// The Pareto frontier of peak memory vs throughput, the recommendation and the hypervolume, as
// the contract defines them. Thread-safety: pure functions.
//
// Rule: among trials with status ok whose memory (per memory_metric, max over ranks) is within
// the budget, keep those no other such trial dominates; b dominates a when b.memory <= a.memory
// and b.throughput >= a.throughput with at least one strict. Exact values, no tolerance: noise is
// handled by measuring the median of several steps, not by fudging comparisons. Two trials with
// identical memory and throughput do not dominate each other: both stay, ordered by policy
// string. The frontier is ordered by memory ascending (ties by throughput descending).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "search/spec.h"
#include "search/trial.h"

namespace remat::search {

struct FrontierPoint {
  Policy policy;
  uint64_t memory_bytes = 0;
  double tokens_per_s = 0;
};

// Points eligible for the frontier: ok and within the budget.
std::vector<FrontierPoint> EligiblePoints(const std::vector<TrialResult>& trials,
                                          MemoryMetric metric, uint64_t budget_bytes);
std::vector<FrontierPoint> ParetoFrontier(const std::vector<FrontierPoint>& points);
std::vector<FrontierPoint> ComputeFrontier(const std::vector<TrialResult>& trials,
                                           MemoryMetric metric, uint64_t budget_bytes);

// The frontier within the measurement noise: ComputeFrontier's points less those whose
// throughput is within the throughput interval (search/noise.h: the 90% interval of the median
// step, turned over) of a point kept at equal or lower memory: measured again, such a point could
// as well come out below it, so it is not a separate frontier point. Points are taken by memory
// ascending (ties: throughput descending); one is kept when its throughput is above the highest
// interval end of every point kept before it. Trials without an interval count as exact, so
// without intervals this is ComputeFrontier. `max_noise`, when given, caps each interval's upper
// end at that fraction over the point's throughput (the planner's use: search.noise_target, what
// a trial measures down to when it can; a trial that stopped at its step cap with a wider
// interval must not shadow a whole region). `upper`, when given, receives each kept point's
// (capped) throughput interval end, in the same order. Pure.
std::vector<FrontierPoint> NoiseAwareFrontier(const std::vector<TrialResult>& trials,
                                              MemoryMetric metric, uint64_t budget_bytes,
                                              std::vector<double>* upper = nullptr,
                                              double max_noise = -1);

// The smallest tie band of the recommendation rule: throughputs closer than this fraction of the
// best are never told apart, however steady the steps look (run-to-run drift on one GPU is about
// this large; docs/results.md).
inline constexpr double kMinNoiseTolerance = 0.01;

// One measured policy as the recommendation rule saw it.
struct RecommendationCandidate {
  Policy policy;
  uint64_t memory_bytes = 0;  // per memory_metric, max over ranks
  double tokens_per_s = 0;
  double noise = 0;            // RelativeNoise (search/noise.h)
  double recompute_flops = 0;  // replayed per step on the busiest rank, by the FLOP model
  double below_best = 0;       // (best - this) / best throughput
  double tolerance = 0;        // the band it was compared with: max(1%, its noise, the best's)
};

// The contract's recommendation: among the ok trials whose memory is at or under the budget less
// search.memory_headroom_gib, those whose throughput is within the measurement noise of the best
// (a band of at least kMinNoiseTolerance: max of 1%, the best's RelativeNoise and the
// candidate's, search/noise.h) are tied; of the tied, the one with the least recompute (fewest
// replayed FLOPs by the memory/FLOP model) is recommended, ties to less memory, then the policy
// string. So a longer module list never wins on noise alone: the decision guide's "smallest
// measured replay cost that satisfies the memory target".
struct Recommendation {
  RecommendationCandidate choice;
  RecommendationCandidate best;               // the highest throughput that fits
  std::vector<RecommendationCandidate> tied;  // within the band of `best`, the choice first,
                                              // then by recompute ascending; includes `best`
  uint64_t budget_bytes = 0;                  // budget less headroom, what the choice fits
  std::string reason;                         // why the choice fell where it did, one sentence
};

// nullopt when no ok trial fits the budget less headroom. Predicted (depth-proxy) trials count
// as measured. Pure; `spec` supplies the budget, the headroom, the metric and the FLOP model.
std::optional<Recommendation> RecommendPolicy(const SearchSpec& spec,
                                              const std::vector<TrialResult>& trials);

// When nothing fits: a sentence saying so and which trial came closest (lowest memory among
// trials with memory figures), e.g. "no policy fits 80.0 GiB; closest: full:uniform:1 at 83.2 GiB".
std::string NothingFitsMessage(const std::vector<TrialResult>& trials, MemoryMetric metric,
                               uint64_t budget_bytes);

// Area dominated by `frontier` within memory <= budget and throughput >= t_ref (memory in bytes,
// throughput in tokens/s).
double Hypervolume(const std::vector<FrontierPoint>& frontier, uint64_t budget_bytes, double t_ref);

// Fragmentation diagnosis: ranks whose reserved peak exceeds allocated by more than `ratio`
// (default 1.15) and by at least 256 MiB. At most two findings per trial, each one readable
// sentence: the fragmentation finding names the ranks ("rank 3", "ranks 64-1023"), the peaks of
// the one with the highest reserved peak, the spread of the excess over all of them, and the
// usual fix (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True); ranks whose allocated peak is
// itself over `budget_bytes` (0: no budget) make the capacity finding instead: allocator
// settings cannot bring them under the budget.
std::vector<std::string> DiagnoseFragmentation(const TrialResult& trial, uint64_t budget_bytes,
                                               double ratio = 1.15);

}  // namespace remat::search
