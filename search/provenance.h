// Numerical sanity and provenance of a search's results.
//
// Recompute changes when activations are computed, never what they are: every policy of a
// search runs the same model on the same tokens from the same weights, so its loss and gradient
// norm must equal the control's (selective:[]) up to rounding. The contract's tolerance is the
// one it sets for reductions run in another order: 1e-5 relative in fp32, 1e-3 in bf16. A trial
// off by more is computing something else (a replay that does not restore the RNG, a wrong
// recompute), and its throughput and memory are not the policy's: the result marks it.
// Both figures come from step index search.warmup_steps, the same step in every trial.
//
// Provenance: the software each trial ran with (TrialResult::versions, from the engine), summed
// up for the search. Thread-safety: pure functions.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "search/spec.h"
#include "search/trial.h"

namespace remat::search {

// The largest relative difference from the control's loss and grad norm that still matches:
// 1e-5 in fp32, 1e-3 in bf16.
double NumericsTolerance(Precision precision);

// The sentence saying how `trial` differs from `control` (or another reference trial, named in
// the sentence) beyond NumericsTolerance, e.g.
// "selective:[mlp]: loss 2.3412 vs the control's 2.3398 (6.0e-04 relative; tolerance 1.0e-05,
// fp32)"; empty when they match or cannot be compared (either not ok, a depth-proxy prediction,
// or no loss reported). The grad norm is compared too when both report one.
std::string NumericsMismatch(const SearchSpec& spec, const TrialResult& control,
                             const TrialResult& trial);

struct NumericsCheck {
  bool has_control = false;  // an ok control with a loss to compare with
  std::string reference;     // the policy compared with: the control, or the stand-in
  int compared = 0;          // trials compared with it (the reference itself not counted)
  // By position in the results given: the mismatch sentence of each trial off the control.
  std::map<size_t, std::string> mismatches;
};

// Every result compared with the first ok control among them (selective:[]); when none ran ok
// (a control over the budget), with the first comparable result, named in the sentences.
NumericsCheck CheckNumerics(const SearchSpec& spec, const std::vector<TrialResult>& results);

// The versions a search's trials ran with: every key any trial reported, its distinct values in
// the order first seen, joined with " | " when trials disagree (e.g. two workers' drivers).
std::map<std::string, std::string> SearchVersions(const std::vector<TrialResult>& results);

}  // namespace remat::search
