// The planner: the decision guide as code. A Strategy proposes the next trials from the results
// so far and knows when to stop, so the coordinator can drive it with any number of workers.
//
// Usage (single-threaded; the coordinator calls it under its own lock):
//   auto strategy = MakeStrategy(spec);
//   while (!strategy->Done()) {
//     for (auto& c : strategy->Propose(free_slots)) dispatch(c.policy);
//     ... strategy->Observe(result) for each result that arrives ...
//   }
// Propose never returns a policy it returned before. A strategy is rebuilt after a coordinator
// restart by replaying Propose/Observe with the recorded trials (Restore).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "search/memory_model.h"
#include "search/policy.h"
#include "search/spec.h"
#include "search/trial.h"

namespace remat::search {

struct Candidate {
  Policy policy;
  std::string reason;  // why the guide proposes it ("matched no-recompute control", ...)
  MemoryEstimate estimate;
};

class Strategy {
 public:
  virtual ~Strategy() = default;

  // Up to `max_count` new candidates that can run now (fewer when the next step depends on
  // results still outstanding). Empty when nothing can be proposed until more results arrive
  // or when the search is done.
  virtual std::vector<Candidate> Propose(int max_count) = 0;

  // A result for a policy this strategy proposed (any status).
  virtual void Observe(const TrialResult& result) = 0;

  // True when no further trial could change the outcome: frontier settled, trial limit reached,
  // or nothing left to try. Outstanding proposals must have been observed.
  virtual bool Done() const = 0;

  // The number of trials this strategy expects to run in total (an estimate for progress bars).
  virtual int PlannedTotal() const = 0;

  // The one round of near-tie re-measures (search/remeasure.h) has ended, every re-measure in
  // it final: `pooled` holds each re-measured policy's runs combined (CombineRemeasured). The
  // strategy takes them for its own single results; Done() may then be false again. Called at
  // most once, after Done(); the default ignores them.
  virtual void ObserveRemeasured(const std::vector<TrialResult>& pooled) { (void)pooled; }

  // What the strategy has learnt about its own predictions so far, one sentence for the search's
  // output (e.g. the measured error of the memory predictions); "" when nothing.
  virtual std::string Notes() const { return ""; }

  // Rebuild state after a restart: `proposed` in the order they were proposed, `results` for
  // those that finished. Afterwards Propose continues where the strategy left off.
  virtual void Restore(const std::vector<Candidate>& proposed,
                       const std::vector<TrialResult>& results) = 0;
};

// The guided strategy (the decision guide) or the exhaustive one, per spec.search.strategy. The
// guided one follows spec.search.objective: `frontier` maps the memory/throughput frontier and
// settles when every untried policy together is predicted to add under 0.4% of its hypervolume
// beyond the frontier's known noise (NoiseAwareFrontier, each point raised to its throughput
// interval, at most search.noise_target; only intervals that met the target count), then measures
// what the `recommend` objective would still measure (a policy that, measured as predicted,
// would become the recommendation), so no policy predicted to become the recommendation is left
// untried;
// `recommend` measures only what could change the recommendation (RecommendPolicy) and tries
// full recompute only when no selective policy fits, as measured or predicted. Both walk the
// initial plan first and predict every other policy from the measurements (search/predict.h);
// whether a prediction may fit the budget is corrected by the error the predictions have had on
// this search (Predictor::MeasuredMemoryError, FitTest), which Notes() reports.
// Beyond the plan (under recommend: beyond the control) a proposal waits for the results of every
// trial proposed before it, so the trials a guided search runs are a function of its results
// alone, whatever the number of slots or the order results arrive in.
std::unique_ptr<Strategy> MakeStrategy(const SearchSpec& spec);
std::unique_ptr<Strategy> MakeGuidedStrategy(const SearchSpec& spec);
std::unique_ptr<Strategy> MakeExhaustiveStrategy(const SearchSpec& spec);

// What `remat plan` shows: the control, the architecture's first boundaries, other single labels
// as calibration points sized to the table (one per 100 equivalence classes, best saving per
// replayed FLOP first; none on tables under 100 classes), core_attn under flash attention, then
// the full-recompute policies; each with its reason and estimate. Under the
// recommend objective the full-recompute policies are listed only when the model predicts that
// no selective policy fits the budget less headroom, and the search may end before the plan does
// (as soon as nothing untried could change the recommendation).
std::vector<Candidate> InitialPlan(const SearchSpec& spec);

}  // namespace remat::search
