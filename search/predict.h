// Predicting an unmeasured policy's figures from the policies measured so far: the planner's
// way to "predict, then measure only what can move the outcome".
//
// The analytic model (search/memory_model.h) is right about differences between policies of one
// model and less right about absolute figures, so every prediction is anchored on measurements:
//   - a selective policy takes the model's ratio to the measured selective policy that differs
//     from it by the fewest labels (ties: the nearest by the model's peak). Adding up measured
//     single-label savings was tried and predicted worse: reserved peaks carry 1-8% of allocator
//     caching that differs from policy to policy (the H200 tables), and a sum of differences adds
//     up that noise, where one ratio to a neighbour carries it once;
//   - full:block:N and full:uniform:N are one-dimensional families: N is predicted from the
//     measured N on either side (the measured/model ratio interpolated in N) and clamped by them,
//     since memory falls and step time grows with N (block; full:uniform:1 is block's end N =
//     layers per stage, and when both are measured, two draws of one policy, their mean
//     throughput anchors that end);
//   - failing all that, the measured trial nearest by the model's peak is the anchor.
// A selective prediction's time takes the model's step-cost ratio to its anchor, each label's
// charge scaled by what this search has measured of it (LabelChargeScales): the FLOP model's
// charges are off per label by factors of 0.1 to 10 on the H200 tables (the shared experts'
// replay costs 0.02-0.3 of its FLOPs' share there, unfused core attention 3-10 times it), and a
// search that believes the model keeps the policies it overcharges unmeasured. Predicted
// optimistically (what the frontier search explores with), a label that no trial of this search
// has run is charged kUnmeasuredLabelScale of the model's charge for it: a label the search never
// runs is never corrected by an anchor that ran it, nor by a pair of trials.
// Only ok trials anchor memory (an oom trial stops at its failing allocation), but an oom trial,
// or an ok one over the budget, marks its family member as not fitting: the block N below it
// cannot fit either.
//
// Thread-safety: none (caches model estimates and measured label charges); one Predictor per
// strategy, used under its lock.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "search/memory_model.h"
#include "search/policy.h"
#include "search/spec.h"
#include "search/trial.h"

namespace remat::search {

struct Prediction {
  double memory_bytes = 0;  // per spec.search.memory_metric
  double tokens_per_s = 0;  // 0 when nothing measured can anchor a time
  // True when the policy is known not to fit: a measured member of its monotone family at or
  // below it in memory did not fit (full:block:N below a block N that did not fit).
  bool known_not_to_fit = false;
};

// How far the memory predictions have been off on this search so far, measured leave-one-out:
// each ok trial predicted from the other trials (as Predict would have, had it not been measured)
// against what it measured. Relative errors (measured - predicted) / predicted.
struct MemoryError {
  int trials = 0;     // ok trials with a prediction to compare
  double bias = 0;    // their median error
  double spread = 0;  // the kMemoryErrorQuantile of the errors' distances from the median
};

// The spread is the 90th percentile of the distances (nearest rank), not the largest: one
// policy's allocator caching can put its reserved peak 1.4-2% off a prediction from its
// neighbours while the rest are within 0.5%, and the largest then let the search try every policy
// predicted up to 2% over the budget (on the held-out H200 MLA table five such trials, all over
// it: 21 trials where 19 keep the same frontier). Below ten errors it is still the largest.
inline constexpr double kMemoryErrorQuantile = 0.9;

// The planner's fit test near the budget: a prediction corrected by the measured bias may fit
// when it is at most `margin` over the budget. With fewer than kMinErrorTrials errors the
// uncorrected prediction and kModelMargin (the anchored model's error on the H200 tables) apply;
// after, the margin is the measured spread, within [kMinMargin, kModelMargin]: a search whose
// predictions have been right spends fewer trials on policies predicted just over the budget.
inline constexpr double kModelMargin = 0.02;
inline constexpr double kMinMargin = 0.005;
inline constexpr int kMinErrorTrials = 3;
struct FitTest {
  double bias = 0;
  double margin = kModelMargin;
  // The corrected prediction and whether it may fit `budget`.
  double Corrected(double predicted_bytes) const { return predicted_bytes * (1 + bias); }
  bool MayFit(double predicted_bytes, double budget_bytes) const {
    return Corrected(predicted_bytes) <= (1 + margin) * budget_bytes;
  }
};
FitTest FitTestFrom(const MemoryError& error);

// The share of the model's charge for a label no trial has run, when predicting optimistically:
// between the lower quartile (0.3) and the median (1.0) of what the twelve H200 tables measure
// against the model per label (`remat-search-bench --source . --label-costs`: the measured
// replay time over the FLOP model's, medians over pairs of policies that differ by that label
// alone: unfused core attention 2.8-9.7, mla_up_proj 0.1-1.9, moe 0.6-1.9, shared experts -0.3
// to 1.1, the dense MLP 0.25; 0.3-0.6 here miss the same goals on the replay bench). The plan
// runs every label but `moe` and `shared_experts`; a search that believes the model's 15% of the
// step for `moe` on the MLA + MoE model (measured 9-10% with forced routing) never runs a `moe`
// policy, and the low-memory end of that model's frontier is made of them (docs/results.md).
inline constexpr double kUnmeasuredLabelScale = 0.5;

// A label's charge as measured by this search: over every pair of its ok selective trials that
// differ by that label alone (and where the model charges it something), the median measured
// charge (the step time with it over the step time without, less 1) over the median modelled one,
// within [kMinLabelChargeScale, kMaxLabelChargeScale] (one pair is two single draws, so one noisy
// pair must not zero a label's cost or multiply it without bound). A label no pair differs by
// keeps the model's charge. On the H200 replays (docs/results.md): the frontier's policies at
// their pooled figures reach 0.95 of the pooled exhaustive hypervolume in 202 of 250 deals of
// the tables with second runs, 179 with the model's charges.
inline constexpr double kMinLabelChargeScale = 0.25;
inline constexpr double kMaxLabelChargeScale = 4.0;

class Predictor {
 public:
  explicit Predictor(const SearchSpec& spec);

  // The model's estimate, computed once per policy.
  const MemoryEstimate& Model(const Policy& policy);

  // Relative step cost under `policy` by the model: 1 + replayed FLOPs / model FLOPs, plus a small
  // charge for output-discarding labels whose replay is elementwise (memory-bound, so FLOPs
  // understate it).
  double StepCost(const Policy& policy);

  // `measured`: every trial observed so far, keyed by canonical policy string. A selective
  // prediction's labels are charged as LabelChargeScales(measured) says. `optimistic`: the
  // labels of `policy` that no selective trial in `measured` ran (whatever its outcome) are
  // charged kUnmeasuredLabelScale of the model's charge.
  Prediction Predict(const std::map<std::string, TrialResult>& measured, const Policy& policy,
                     bool optimistic = false);

  // The leave-one-out error of the memory predictions over `measured` (MemoryError). A function
  // of the measurements alone, whatever order they arrived in.
  MemoryError MeasuredMemoryError(const std::map<std::string, TrialResult>& measured);

  // Each label's measured charge over the model's (see kMinLabelChargeScale), for the labels
  // some pair of `measured` differs by; with the number of such pairs.
  struct LabelScale {
    double scale = 1;  // measured over modelled, within the bounds
    int pairs = 0;
    double measured = 0, modelled = 0;  // the medians over the pairs
  };
  std::map<Label, LabelScale> LabelChargeScales(const std::map<std::string, TrialResult>& measured);

 private:
  // Predict, with the trial keyed `exclude` (if any) left out of `measured`; labels charged as
  // the model says unless `measured_charges` (the leave-one-out memory error needs no time).
  Prediction PredictExcluding(const std::map<std::string, TrialResult>& measured,
                              const Policy& policy, const std::string& exclude,
                              bool optimistic = false, bool measured_charges = false);
  std::map<Label, LabelScale> ComputeLabelChargeScales(
      const std::map<std::string, TrialResult>& measured);
  std::optional<Prediction> PredictFamily(const std::map<std::string, TrialResult>& measured,
                                          const Policy& policy, const std::string& exclude);
  // How each label is charged in a prediction: the labels no trial ran (when optimistic) and
  // the measured scales.
  struct Charges {
    std::set<Label> discounted;
    std::map<Label, LabelScale> scales;
  };
  // Step time under `to` over step time under `from`: StepCost's ratio, walked one label at a
  // time when both are selective, each label's charge in that company scaled as `charges` says
  // (kUnmeasuredLabelScale for a discounted one).
  double StepRatio(const Policy& from, const Policy& to, const Charges& charges);
  Prediction PredictFrom(const TrialResult& anchor, const Policy& policy, const Charges& charges);

  SearchSpec spec_;
  double model_flops_ = 1;
  std::map<std::string, MemoryEstimate> cache_;
  // The last LabelChargeScales: what of its measurements it reads (each trial's key, whether
  // it can anchor, whether it was predicted, its throughput), and what it gave. A proposal
  // predicts every untried policy from the same measurements.
  std::vector<std::tuple<std::string, bool, bool, double>> scales_inputs_;
  std::map<Label, LabelScale> scales_;
};

}  // namespace remat::search
