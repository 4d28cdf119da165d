// Near-ties measured twice. A frontier point whose throughput is within the measurement noise
// of another's, or a policy tied with the best for the recommendation, may owe its place to one
// lucky run; before the recommendation is made such policies are measured once more, and the
// two runs' measured steps are pooled. Bounded: a policy is re-measured at most once per search,
// and only in one round, after the strategy is done.
//
// The coordinator (server/search_run.cc) asks NearTiesToRemeasure once the strategy is done,
// runs what it names, and computes the frontier and the recommendation from
// CombineRemeasured(results). Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "search/policy.h"
#include "search/spec.h"
#include "search/trial.h"

namespace remat::search {

struct Remeasure {
  Policy policy;
  std::string reason;  // e.g. "re-measure: within 1.0% of selective:[mlp] (band 1.0%)"
};

// At least this many near-ties may be re-measured in a search, however few policies it measured.
inline constexpr size_t kMinRemeasures = 2;

// The policies to measure again, memory ascending: ok, measured (not predicted) trials
// measured once so far that are (a) in the recommendation's tie set when it has more than one
// member, or fit the budget less headroom with a throughput interval (search/noise.h) that
// overlaps the best's (then the best too), or (b) on the frontier within the noise band of
// another frontier point (max of 1% and the two trials' RelativeNoise, as the
// recommendation's band). At most a quarter of the
// policies measured (at least kMinRemeasures), chosen in this order: the recommendation's choice
// and the best, the other tied policies closest to the best first, then the frontier near-ties
// closest first. Empty with backend replay (a table holds one measurement per policy: a second
// replays the same figures) and once any policy was measured twice (the one round has run).
std::vector<Remeasure> NearTiesToRemeasure(const SearchSpec& spec,
                                           const std::vector<TrialResult>& results);

// NearTiesToRemeasure's choice without its two guards (backend replay, a round already run):
// the same policies in the same order, picked from `results` as they stand (policies measured
// more than once pooled, and not picked again). For a replay that holds further recorded runs
// of a policy (the replay bench, bench/search), which can serve a re-measure a different
// measurement than the first.
std::vector<Remeasure> RemeasureCandidates(const SearchSpec& spec,
                                           const std::vector<TrialResult>& results);

// One result per policy, in the order policies were first seen: a policy with two or more
// results gets them combined. Ok runs are pooled: each rank's measured steps together, its
// median the rank's step time, the trial's step time the slowest rank's, the spread the width of
// the slowest rank's pooled median's 90% interval (search/noise.h; the range of every pooled
// step when too few steps give one, up to 6; so more draws narrow a policy's tie band, where
// the range would widen it), peaks the highest; the loss and versions are the first run's.
// When only some runs are ok, the ok ones count (the message says what the others were).
std::vector<TrialResult> CombineRemeasured(const SearchSpec& spec,
                                           const std::vector<TrialResult>& results);

}  // namespace remat::search
