// The depth-proxy driver: the one place that says how a trial with search.proxy_layers runs,
// whatever runs its processes (the engine's ranks in engine/trial_runner.cc, the megatron and
// command backends in worker/trial_pipeline.h).
//
//   - which depths: the spec's proxy_layers, in order (ValidateSpec has checked them);
//   - the policy is checked against the FULL spec first (search::ValidatePolicy: a full:block or
//     full:uniform policy these depths cannot extrapolate is invalid, nothing runs);
//   - each depth runs the spec cut to it (AtDepth) with no memory cap of its own (the memory-cap
//     rule below) and with what is left of the trial's timeout (the depths share it);
//   - failure: the first depth that does not end ok ends the trial; the result names that depth
//     and keeps its status (search::PredictFullDepth);
//   - combining: search::PredictFullDepth, the line through the two depths.
//
// The memory-cap rule: a proxy run measures, the prediction decides what fits. A cut spec's
// memory_budget_gib is kUncappedBudgetGib, and MemoryCapped() is how every runner (the engine's
// allocator cap, a command template's {memory_budget_bytes}, the megatron driver's fraction)
// tells that there is no cap to apply.
//
// Std only; thread-safety: pure functions (the runner is called on the caller's thread).
#pragma once

#include <functional>

#include "search/policy.h"
#include "search/spec.h"
#include "search/trial.h"

namespace remat::search {

// A budget no device has: the marker of an uncapped (proxy) run.
inline constexpr double kUncappedBudgetGib = 1 << 20;

// False for a proxy run's spec (DepthRunSpec): no memory cap is to be applied.
bool MemoryCapped(const SearchSpec& spec);

// The spec one proxy depth runs: `full` cut to `layers` (AtDepth), uncapped, with `timeout_s`
// as its trial timeout.
SearchSpec DepthRunSpec(const SearchSpec& full, int layers, double timeout_s);

// Runs one depth: the cut spec (DepthRunSpec) and its layer count; returns that run's result,
// its wall_s the seconds it took (what the next depth's timeout is short of).
using DepthRunner = std::function<TrialResult(const SearchSpec& cut, int layers)>;

// Runs `full`'s proxy depths with `run` as the header says and returns the predicted full-depth
// result (status invalid without running anything when the policy cannot be extrapolated). Its
// policy is `policy`. Requires full.search.proxy_layers to be non-empty.
TrialResult RunDepthProxies(const SearchSpec& full, const Policy& policy, const DepthRunner& run);

}  // namespace remat::search
