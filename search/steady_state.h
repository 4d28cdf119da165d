// The steady-state rule: how long a trial warms up before its steps are measured. The first
// steps of a training run are slow (allocator growth, kernel selection, caches); a median taken
// before they settle is biased (the grouped-MoE example fell from 0.37 s to a steady
// 0.26-0.28 s over its first four steps). So a run warms up for at least
// search.warmup_steps, then until its last search.steady_window warm-up steps agree within
// search.steady_tolerance, and at most search.warmup_max_steps; the next search.measure_steps
// steps are measured. The one home of this rule: the trial engine applies it step by step, the
// command backend to the step times a run reported afterwards.
//
// Thread-safety: pure functions.
#pragma once

#include <vector>

#include "search/spec.h"

namespace remat::search {

// (max - min) / median of `times`; 0 for fewer than two values or a non-positive median.
double RelativeSpreadOf(const std::vector<double>& times);

// The relative spread of the last `window` values of `times`; nullopt-like -1 when there are
// fewer than `window` of them (nothing to judge yet).
double WindowSpread(const std::vector<double>& times, int window);

// True when the last search.steady_window of `warmup_times` spread by at most
// search.steady_tolerance (relative to their median).
bool Settled(const SearchOptions& options, const std::vector<double>& warmup_times);

// True when a run that has taken the warm-up steps `warmup_times` (in order) may start
// measuring: it has taken at least search.warmup_steps and either Settled or it has reached
// search.warmup_max_steps (the bound: a run that never settles is measured anyway, and the
// result says so through its spread).
bool WarmupDone(const SearchOptions& options, const std::vector<double>& warmup_times);

// How a run's recorded step times divide into warm-up and measured steps.
struct SteadySplit {
  int warmup_steps = 0;          // the warm-up steps the rule took
  bool settled = false;          // the warm-up ended because the steps settled, not at the bound
  std::vector<double> measured;  // after the warm-up, as search/noise.h's rule measures them
};

// The rule applied afterwards to every step time a run reported (the command backend, whose run
// length is fixed in advance at search.warmup_max_steps + MeasureStepCap): the warm-up is the
// shortest prefix for which WarmupDone holds, or the whole run when none does; the measured
// steps follow it as AdaptiveMeasuredSteps (search/noise.h) takes them.
SteadySplit SplitSteadyState(const SearchOptions& options, const std::vector<double>& step_times);

}  // namespace remat::search
