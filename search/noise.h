// How well a trial knows its step time, and when it has measured enough: the one home of the
// adaptive-measurement rule (search.noise_target, search.max_measure_steps).
//
// A trial's step time is the median of its measured steps. The interval reported with it is the
// distribution-free order-statistic interval of the median: for n steps sorted x_(1) <= ... <=
// x_(n), [x_(k), x_(n+1-k)] holds the true median with probability 1 - 2 P(Binomial(n, 1/2) < k)
// whatever the distribution of the steps (continuous, independent steps). No normality is
// assumed, which matters on MoE steps: within one H200 MoE trial the steps spread by 15-50% of
// the step, in a few slow ones that a mean and a standard deviation would follow and a median
// does not.
//
// The rule: a trial measures at least search.measure_steps; then, when search.noise_target is
// above 0, it keeps measuring until the interval reaches kMedianConfidence and its half-width is
// within noise_target of the median, or until MeasureStepCap steps. With kMedianConfidence 0.90
// the first interval that reaches it needs 5 steps ([min, max] of 5 covers 0.9375), so a steady
// trial (dense H200 steps spread 0.5%) stops at 5 and a noisy one takes more. The default target,
// 0.02, is twice the recommendation's smallest tie band (kMinNoiseTolerance, the run-to-run
// drift of one GPU): a median known to +-2% tells apart policies 2-4% apart, which is where the
// H200 frontiers' neighbours sit; a tighter target buys nothing the next run would reproduce.
//
// The trial engine applies the rule step by step (every rank judges the slowest rank's steps, so
// all stop together); a backend that reads a finished run's step times applies it afterwards
// (AdaptiveMeasuredSteps: the command and megatron backends, whose jobs run for the cap).
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <vector>

#include "search/spec.h"
#include "search/status.h"
#include "search/trial.h"

namespace remat::search {

// search.noise_target is 0 or a fraction below 1; search.max_measure_steps is positive and
// within limits::kMaxSteps. The first problem, naming the field.
Status ValidateNoiseOptions(const SearchOptions& options);

// The confidence of the reported interval and of the stop rule.
inline constexpr double kMedianConfidence = 0.90;

struct MedianInterval {
  int steps = 0;
  double median_s = 0;
  double low_s = 0, high_s = 0;
  // The interval's exact coverage of the true median (any continuous distribution). Below the
  // confidence asked for when there were too few steps for it: then [min, max].
  double coverage = 0;
  // (high - low) / 2 / median; 0 when the median is not positive.
  double RelativeHalfWidth() const;
};

// P(Binomial(n, 1/2) < k), exact to double precision for any n (log-space sums).
double BinomialHalfBelow(int n, int k);

// The narrowest symmetric order-statistic interval whose coverage is at least `confidence`
// ([min, max] with its lower coverage when none is; all zero for no steps; a single step is its
// own interval with coverage 0).
MedianInterval MedianConfidenceInterval(std::vector<double> times,
                                        double confidence = kMedianConfidence);

// The most steps a trial measures: measure_steps when noise_target is 0, else the larger of
// measure_steps and max_measure_steps.
int MeasureStepCap(const SearchOptions& options);

// True when a trial that has measured `times` (in order, warm-up excluded) may stop: it has at
// least measure_steps and either noise_target is 0, it reached MeasureStepCap, or the interval of
// its median reaches kMedianConfidence within noise_target.
bool MeasureDone(const SearchOptions& options, const std::vector<double>& times);

// The rule applied afterwards to a finished run's step times (every step, warm-up included): the
// steps after the first `warmup_steps`, up to the first count at which MeasureDone holds (all of
// them, up to the cap, when it never does).
std::vector<double> AdaptiveMeasuredSteps(const std::vector<double>& step_times, int warmup_steps,
                                          const SearchOptions& options);

// A trial's interval: from the measured steps of its slowest rank (the highest step_time_s) when
// a rank has per-step times, else the recorded step_time_low_s/high_s, else the steps' range
// (step_time_spread_s) centred on the median (the H200 tables of runs 1 and 2 kept only that);
// nullopt when none says anything (a single step, predicted trials).
std::optional<MedianInterval> TrialInterval(const TrialResult& result);

// How far apart two measurements of this trial's policy could come out by noise alone, relative
// to its step time: the width of a tie band (search/frontier.h RecommendPolicy, the re-measure
// round). When the median's interval reaches kMedianConfidence (5 or more steps), the larger of
// the interval's width and half the steps' range, both over the median; else the whole range
// (TrialResult::RelativeSpread: 3 steps, or a table that kept only the range).
// The range alone grows with the steps a noisy trial measures while its median's interval
// narrows: on the H200 MLA + MoE table with forced routing, full:block:7 measured 11 steps that
// spanned 7.2% with a 3.7%-wide interval, and a band of the range tied it with a policy 4.2%
// slower (a second run of the table measures them 6% apart). The interval alone trusts steps to
// be independent draws; with the router learning, a trial's steps drift (the last five of 20 a
// median 13% under the first five) and its interval says less than its range: half the range
// keeps such a trial's band wide (docs/results.md).
double RelativeNoise(const TrialResult& result);

// Records on `result` the interval of `times` (the trial's measured steps, per step the slowest
// rank's): step_time_low_s/high_s, measured_steps and whether noise_target was met.
void SetStepTimeInterval(const SearchOptions& options, const std::vector<double>& times,
                         TrialResult* result);

// Sets result->step_time_low_s/high_s (and noise_target_met against `options`) from TrialInterval
// when they are unset: how replayed and combined trials get their interval.
void FillStepTimeInterval(const SearchOptions& options, TrialResult* result);

// A trial's throughput interval, tokens/s: the step interval turned over (the slow end is the low
// throughput). {tokens_per_s, tokens_per_s} when the trial has no interval.
struct ThroughputInterval {
  double low = 0, high = 0;
};
ThroughputInterval ThroughputIntervalOf(const TrialResult& result);

// Why this spec's step times will be noisier than a trial can measure away, one sentence; empty
// when nothing is known, and for a replayed table (measured already: its figures carry their
// noise). Today: a MoE model whose router learns its routing
// (model.moe_router_force_load_balancing off). From freshly initialised weights the routing, and
// with it the experts' loads and the step time, keeps changing over the first tens of steps, the
// same for every policy but not at the same step count: on an H200 (a 16-layer MLA + 16-expert
// model) a trial's last five of 20 measured steps ran a median 13% faster than its first five,
// and policies that keep the same tensors measured a median 11% apart; with forced balancing the
// warm-up settled in 4-5 steps and three of four medians were known to 2% within 5-8 steps
// (docs/results.md).
std::string RoutingNoiseCaution(const SearchSpec& spec);

}  // namespace remat::search
