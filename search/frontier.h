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

// The frontier point with the highest throughput (ties: lower memory, then policy string).
std::optional<FrontierPoint> Recommend(const std::vector<FrontierPoint>& frontier);

// When nothing fits: a sentence saying so and which trial came closest (lowest memory among
// trials with memory figures), e.g. "no policy fits 80.0 GiB; closest: full:uniform:1 at 83.2 GiB".
std::string NothingFitsMessage(const std::vector<TrialResult>& trials, MemoryMetric metric,
                               uint64_t budget_bytes);

// Area dominated by `frontier` within memory <= budget and throughput >= t_ref (memory in bytes,
// throughput in tokens/s).
double Hypervolume(const std::vector<FrontierPoint>& frontier, uint64_t budget_bytes, double t_ref);

// Fragmentation diagnosis: ranks whose reserved peak exceeds allocated by more than `ratio`
// (default 1.15) and by at least 256 MiB. Each finding is a readable sentence naming the rank,
// both peaks and the usual fix (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True).
std::vector<std::string> DiagnoseFragmentation(const TrialResult& trial, double ratio = 1.15);

}  // namespace remat::search
