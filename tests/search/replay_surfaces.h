// Replaying a guided search against an exhaustive table, and large synthetic tables to replay.
//
// Shared by the replay tests (tests/search/planner_h200_test.cc, planner_large_test.cc) and the
// bench that prints their figures (bench/search/, remat-search-bench). Standard library only.
//
// A synthetic table stands for an exhaustive search of a model too large for the GPUs at hand:
// every valid policy "measured" as the memory/FLOP model predicts it, with the errors a real
// measurement has against the model: a systematic error per label and per full-recompute family
// member (smooth in N), allocator caching on reserved memory, a true replay cost off the FLOP
// model's, and step-time noise per step. A selective policy is measured as its equivalence
// class's representative (search/equivalence.h: the same memory and expected step time), with
// step times of its own. Reserved memory follows what the six H200 exhaustive
// tables show (docs/results/h200-*-exhaustive-table*.json): 1-8% over allocated, on a grid of
// about 1-2 GiB, and monotone along full:block:N and full:uniform:N (the caching follows the
// allocation pattern, which changes smoothly with N), not independent noise per trial.
// Deterministic for a seed. Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "search/frontier.h"
#include "search/spec.h"
#include "search/trial.h"

namespace remat::search::replay {

using Table = std::map<std::string, TrialResult>;  // canonical policy -> what it measured

// What a synthetic table's measurements get wrong against the model.
struct Noise {
  double label_memory_error = 0.05;  // each label's saving off by up to this fraction
  double full_memory_error = 0.03;   // full-recompute activations off by up to this (smooth in N)
  double fragmentation = 0.04;       // reserved over allocated: up to this fraction
  double reserved_grid_gib = 1;      // reserved peaks are multiples of this
  double replay_cost_error = 0.15;   // the true replay time off the FLOP model's by up to this
  double step_jitter = 0.01;         // standard deviation of one step's time, relative
  double outlier_step = 0.0;         // chance that a step is 30% slow (MoE routing, say)
  int measure_steps = 5;
};

// Further recorded runs of a policy beyond the table's, in the order they were measured: what a
// re-measure in a replay is served (the table's own figure again would tell nothing new).
using Draws = std::map<std::string, std::vector<TrialResult>>;

// Every valid policy of `spec` measured as above, with a base step time `step_time_s` for the
// control. Policies over the budget come back oom (their peak as at the failing allocation).
// `draw` > 0 is another run of the same table: the same memory and systematic errors, its steps
// drawn afresh (draw 0 is the table itself).
Table SyntheticTable(const SearchSpec& spec, double step_time_s, const Noise& noise, uint64_t seed,
                     int draw = 0);

// `count` further runs of every ok policy of SyntheticTable(spec, ..., seed): draws 1..count.
Draws SyntheticDraws(const SearchSpec& spec, double step_time_s, const Noise& noise, uint64_t seed,
                     int count);

// Large surfaces for the search-efficiency goals (model, layout and budget of each in the .cc):
//   "llama70b-unfused"  80 layers, TP 8 + SP, DP 8, unfused attention: 168 policies
//   "llama70b-flash"    the same with flash attention: 168 policies
//   "dense48"           a 48-layer 13B-class dense model: 104 policies
//   "mixtral-like"      32 layers, 8 experts top-2, grouped GEMM, flash: 76 policies
struct Surface {
  SearchSpec spec;
  double step_time_s = 1;
  Noise noise;
};
std::vector<std::string> SurfaceNames();
std::optional<Surface> MakeSurface(const std::string& name);

// A guided search replayed against `table` (a policy missing from it is a failed trial), with
// the exhaustive search's figures beside it. When the strategy is done, the coordinator's
// re-measure round runs as a GPU search runs it (search/remeasure.h RemeasureCandidates): each
// policy it names is served a different recorded measurement, its next unused draw in `draws`,
// else the table's figure for a member of its equivalence class the search did not measure (the
// same tensors: search/equivalence.h); one with neither is not re-measured (counted in
// remeasures_without_draw). The strategy is then handed the re-measured policies' runs pooled
// (Strategy::ObserveRemeasured, as server/search_run.cc does once every re-measure is in) and
// may go on: those trials are marked "(after the re-measures)" in `order` and count as the
// strategy's. The frontier and the recommendation come from the runs pooled
// (CombineRemeasured); re-measures are counted apart (`remeasures`).
struct Outcome;
Outcome Replay(const SearchSpec& spec, const Table& table, const Draws& draws);
struct Outcome {
  size_t guided_trials = 0;  // the policies the strategy measured (re-measures: `remeasures`)
  size_t exhaustive_trials = 0;
  double hypervolume_ratio = 0;  // guided / exhaustive, the contract's hypervolume
  std::optional<Recommendation> guided, exhaustive;
  // The guided recommendation is the exhaustive one within noise: it is among the policies the
  // exhaustive search found tied with its best (or both find nothing fits).
  bool recommendation_matches = false;
  // Against the exhaustive table with each equivalence class's members pooled, and with every
  // further draw of theirs (`draws`) when the replay has them
  // (search/equivalence.h: the members keep the same tensors, so their measured steps are draws
  // of one policy; search/remeasure.h pools them): the guided hypervolume over the pooled
  // exhaustive one, the classes, and the guided recommendation's class throughput (pooled) over
  // the best pooled throughput that fits the budget less headroom (1 when both find nothing).
  double pooled_hypervolume_ratio = 0;
  // The same with the guided frontier's policies taken at their classes' pooled figures: what the
  // frontier the search reports delivers, run again and again. Under pooled_hypervolume_ratio by
  // as much as the search's frontier owes to lucky single draws.
  double delivered_hypervolume_ratio = 0;
  size_t exhaustive_classes = 0;
  double recommendation_throughput_ratio = 0;
  std::vector<std::string> order;  // the guided trials, in the order proposed
  // pooled_hypervolume_ratio of the first k+1 measurements of `order` (re-measures included).
  std::vector<double> pooled_by_trials;
  // The trial goal (GoalShare of the policies, rounded down) and the largest pooled ratio any
  // that many trials of the table reach, chosen knowing it (the pooled frontier's best points):
  // where it is under the hypervolume goal, no search meets both goals.
  size_t goal_trials = 0;
  double best_pooled_at_goal = 0;
  // The same for a search that walks the initial plan first (InitialPlan, search/planner.h; the
  // contract's plan: the control, the first boundaries, full recompute): the plan's trials and
  // the largest pooled ratio its policies and the goal's remaining trials reach together.
  size_t plan_trials = 0;
  double best_pooled_at_goal_after_plan = 0;
  // The exhaustive recommendation's class throughput (pooled) over the best pooled throughput
  // that fits: what the recommendation rule makes of every policy measured once. A guided
  // recommendation that misses where this misses too is the rule on one draw per policy, not
  // the search.
  double exhaustive_throughput_ratio = 0;
  std::string notes;               // the strategy's Notes() at the end
  size_t over_budget_trials = 0;   // guided trials that did not fit (oom or over the budget)
  size_t ok_trials = 0, measured_steps = 0;  // guided ok trials and their measured steps
  std::vector<FrontierPoint> guided_frontier, exhaustive_frontier;
  size_t remeasures = 0;               // re-measures served a different recorded measurement
  size_t remeasures_without_draw = 0;  // named by the round, but the replay held no other draw
};
inline Outcome Replay(const SearchSpec& spec, const Table& table) {
  return Replay(spec, table, Draws{});
}

// A table dealt again from its recorded runs: for each policy with further draws, one of its
// runs (the table's figure or a draw, picked by a hash of `seed` and the policy) is the table's
// figure and the others are its draws, in their recorded order. Where every ok policy has a
// further run (HasFurtherRunOfEach), each deal is a table the same machine could have measured
// as well as the one it did: replaying many deals tells what a search makes of the table's noise,
// where the one recorded table tells what it makes of one draw of it. The pooled reference (every
// run of each class) is the same for every deal. Seed 0 is the table as recorded.
struct Deal {
  Table table;
  Draws draws;
};
Deal Redeal(const Table& table, const Draws& draws, uint64_t seed);
bool HasFurtherRunOfEach(const Table& table, const Draws& draws);

// The share of a table's policies the guided search is to stay within: 15% of 150 or more
// policies, 25% of fewer (the measured H200 tables and the 60-150-policy surfaces).
inline double GoalShare(size_t policies) { return policies >= 150 ? 0.15 : 0.25; }
// The other goals on a measured table: at least this share of the pooled exhaustive hypervolume,
// and a recommendation within 3% of the best pooled throughput that fits.
inline constexpr double kTableHypervolumeGoal = 0.95;
inline constexpr double kRecommendationGoal = 0.97;

// The largest Hypervolume (search/frontier.h) any `k` points of `frontier`, a Pareto frontier,
// reach together with every point of `forced` (any points; none by default). A dominated point
// never adds more than the frontier point that dominates it, so no k measurements of a table do
// better than k of its frontier's points; with the plan's points forced, no search that walks
// the plan first does better with k trials more.
double BestHypervolumeOf(const std::vector<FrontierPoint>& frontier, size_t k, uint64_t budget,
                         double t_ref, const std::vector<FrontierPoint>& forced = {});

// One line of figures and the guided order, for logs and the bench; with `frontiers`, both
// frontiers point by point as well.
std::string Describe(const std::string& name, const Outcome& o, bool frontiers = false);

}  // namespace remat::search::replay
