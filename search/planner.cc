#include "search/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "search/equivalence.h"
#include "search/frontier.h"
#include "search/predict.h"
#include "search/rules.h"
#include "search/units.h"

namespace remat::search {
namespace {

// A policy predicted to add less than this fraction of the frontier's hypervolume is not tried.
// 0.00165 with kStopHypervolumeGain 0.004 (were 0.002 and 0.003): on the 80-layer flash surface,
// whose frontier is the full:block:N staircase, the hypervolume went from 0.964 to 0.972 (mean of
// five seeds) for 14.0% of the policies where it was 12.6%; no other surface or table took more
// frontier trials (docs/results.md, search-bench-2026-12-02-r2.txt). 0.0015 gave 0.975 but one seed
// took 16% of the policies; 0.00175 kept to 14.9% but gave 0.969.
constexpr double kMinHypervolumeGain = 0.00165;

// The frontier objective stops when every untried policy together is predicted to add less than
// this fraction of the measured frontier's hypervolume (the goal is 0.97 of the exhaustive one).
// Both thresholds were chosen on the replay bench (bench/search, docs/results.md): lower ones
// buy little hypervolume for many trials on the 80-layer surfaces.
constexpr double kStopHypervolumeGain = 0.004;

// After the re-measure round the frontier search resumes only for a policy predicted to add at
// least this fraction of the (now pooled) frontier's hypervolume: the round replaced lucky single
// draws by pooled ones, and a gap that opens by more than the noise is worth a trial, one of a
// few tenths of a percent is the noise again. On the fifth forced-routing MLA + MoE table at
// 46 GiB two lucky full:block draws hid the `moe` policies at the low-memory end until their
// re-measures (0.900 of the pooled hypervolume; resumed, 0.980 for three trials more); at
// kStopHypervolumeGain the 80-layer flash surface took 0.2%-gain trials past 15% of its
// policies for no hypervolume (docs/results.md).
constexpr double kResumeHypervolumeGain = 0.01;

// The initial plan measures a single label beyond the first boundaries only as a calibration
// point for the predictions, at most one per this many equivalence classes (search/
// equivalence.h). On the small H200 tables (24-96 policies, 23-71 classes) those labels took
// 3-5 trials, 7-12% of the table, and the frontier came out identical without them: the first
// boundaries and full recompute anchor the predictions well enough. On the 80-layer surfaces
// (167 classes) one such label (the best saving per replayed FLOP) still pays: without it the
// flash surface's worst seed lost 0.02 of its hypervolume.
constexpr size_t kClassesPerCalibrationLabel = 100;

std::string Fmt(const char* fmt, double a) {
  char buf[128];
  std::snprintf(buf, sizeof(buf), fmt, a);
  return buf;
}

Candidate MakeCandidate(const SearchSpec& spec, Policy policy, std::string reason) {
  Candidate c;
  c.estimate = EstimateMemory(spec, policy);
  c.policy = std::move(policy);
  c.reason = std::move(reason);
  return c;
}

// The guide's first boundaries for this architecture, in the contract's priority order.
std::vector<std::pair<Label, std::string>> FirstBoundaries(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  std::vector<std::pair<Label, std::string>> out;
  if (m.attention_backend == AttentionBackend::kUnfused && !m.IsGdn()) {
    out.push_back({Label::kCoreAttn,
                   "first boundary: unfused attention materialises scores and probabilities"});
  }
  if (m.multi_latent_attention) {
    out.push_back({Label::kMlaUpProj, "first boundary for MLA: expanded Q/K/V projections"});
  }
  if (m.IsMoe() && m.moe_grouped_gemm) {
    out.push_back({Label::kMoeAct,
                   "first boundary for grouped MoE: the expert activation between fc1 and fc2"});
  }
  if (m.NumMoeLayers() < m.num_layers) {
    out.push_back({Label::kMlp, "first boundary for a dense FFN: the whole dense MLP"});
  }
  std::vector<std::pair<Label, std::string>> valid;
  for (auto& b : out) {
    if (LabelProblem(spec, b.first).empty()) valid.push_back(b);
  }
  return valid;
}

double SavingPerCost(const SearchSpec& spec, const MemoryEstimate& base, const Policy& p) {
  MemoryEstimate e = EstimateMemory(spec, p);
  const double saving = base.peak_bytes - e.peak_bytes;
  const double cost = std::max(e.recompute_flops, 1.0);
  return saving / cost;
}

// The full-recompute proposals of the initial plan: block with the smallest N predicted to fit,
// and uniform:1. Before anything is measured "predicted to fit" allows for the model's error
// (kModelMargin, the other way than the fit test's): a guess that runs out of memory costs a
// trial and says little; one just under the budget is found from its neighbours later.
std::vector<Candidate> FullRecomputePlan(const SearchSpec& spec) {
  std::vector<Candidate> out;
  const int layers = LayersPerStage(spec);
  if (layers < 1 || !ValidatePolicy(spec, Policy::Full(RecomputeMethod::kUniform, 1)).ok()) {
    return out;
  }
  const double budget = static_cast<double>(spec.search.MemoryBudgetBytes());
  const int block_n = SmallestFittingBlock(spec, budget / (1 + kModelMargin)).value_or(layers);
  if (block_n < layers &&
      ValidatePolicy(spec, Policy::Full(RecomputeMethod::kBlock, block_n)).ok()) {
    out.push_back(MakeCandidate(spec, Policy::Full(RecomputeMethod::kBlock, block_n),
                                "full recompute: block with the smallest N predicted to fit (" +
                                    std::to_string(block_n) + " of " + std::to_string(layers) +
                                    " layers per stage)"));
  }
  out.push_back(MakeCandidate(spec, Policy::Full(RecomputeMethod::kUniform, 1),
                              "full recompute: uniform:1, the low-memory end of the frontier"));
  return out;
}

// What the untried policies together must beat for the guided frontier search to go on: the
// frontier within noise (NoiseAwareFrontier), each point at the top of its throughput interval,
// taken at most search.noise_target over it (a trial's noise beyond the target is its failure to
// settle, not its policy's figure). Policies predicted inside measured points' intervals would
// only tell the noise again. Only intervals that reached the confidence within the target count:
// a trial that stopped at its step cap, or one whose interval is not a 90% one (3 steps; the older
// tables' ranges), is taken as exact, so the search goes on where the noise is not known (the
// H200 MoE replays, whose ranges run to +-17%, lost 0.03-0.11 of their hypervolume otherwise).
// Each policy is still ranked against the measured frontier itself: ranked against this one,
// the H200 MoE replays lost 0.05-0.09 of their hypervolume.
std::vector<FrontierPoint> RaisedFrontier(const SearchSpec& spec,
                                          std::vector<TrialResult> results) {
  for (TrialResult& r : results) {
    if (r.noise_target_met) continue;
    r.step_time_low_s = r.step_time_high_s = r.step_time_spread_s = 0;
    for (RankResult& rank : r.ranks) rank.step_times_s.clear();
  }
  std::vector<double> upper;
  std::vector<FrontierPoint> raised =
      NoiseAwareFrontier(results, spec.search.memory_metric, spec.search.MemoryBudgetBytes(),
                         &upper, spec.search.noise_target);
  for (size_t i = 0; i < raised.size(); ++i) raised[i].tokens_per_s = upper[i];
  return raised;
}

// The guided strategy. Both objectives walk the initial plan first (the contract's order); then
// every untried valid policy is predicted from the measurements so far (search/predict.h) and only
// one that is predicted to change the outcome is measured:
//   frontier:  the policy predicted to add the most hypervolume to the measured frontier (a
//              label that no trial has run predicted optimistically: Predictor::Predict); once
//              all untried policies together are predicted to add less than
//              kStopHypervolumeGain of it, what `recommend` would still measure (below), then
//              the search ends;
//   recommend: a policy that, measured as predicted, would become the recommendation
//              (RecommendPolicy: it must beat the current one by more than the noise, or tie
//              with less recompute); the search ends when none could. Full recompute is tried only
//              when no selective policy fits as measured and none is predicted to.
// Once the re-measure round has ended (ObserveRemeasured), the frontier objective takes the pooled
// figures for its own and resumes for a policy predicted to add at least kResumeHypervolumeGain
// (the recommend objective does not resume: the round settles its ties).
// While nothing fits, the policy with the highest predicted throughput among those predicted to
// fit goes first (under recommend: the plan's order first, and full recompute only once no
// selective policy may fit). Beyond the plan (under recommend: beyond the control) a proposal
// waits for the results of every trial proposed before it: the choices are a function of the
// measurements alone, whatever the number of slots or the order results arrive in.
class GuidedStrategy : public Strategy {
 public:
  explicit GuidedStrategy(const SearchSpec& spec)
      : spec_(spec), plan_(InitialPlan(spec)), predictor_(spec) {
    // One selective policy per equivalence class (search/equivalence.h): the others keep the
    // same tensors. full:block:N over every layer of a chunk keeps what full:uniform:1 keeps too,
    // but it stays a candidate: until the strategy can re-measure, that second draw of uniform:1
    // is what pins the low-memory end on noisy surfaces (without it the replay bench loses
    // 0.02-0.03 of the pooled hypervolume on the MoE tables and the 80-layer flash surface).
    for (auto& c : EquivalenceClasses(spec)) {
      all_.push_back(std::move(c.representative));
      for (auto& o : c.others) {
        if (o.representative.IsFull()) all_.push_back(std::move(o.representative));
      }
    }
  }

  std::vector<Candidate> Propose(int max_count) override {
    std::vector<Candidate> out;
    while (static_cast<int>(out.size()) < max_count && Remaining() > 0) {
      auto next = NextCandidate();
      if (!next) break;
      tried_.insert(next->policy.ToString());
      proposed_.push_back(*next);
      out.push_back(std::move(*next));
    }
    return out;
  }

  void Observe(const TrialResult& result) override { results_[result.policy.ToString()] = result; }

  void ObserveRemeasured(const std::vector<TrialResult>& pooled) override {
    for (const TrialResult& r : pooled) {
      if (tried_.count(r.policy.ToString())) results_[r.policy.ToString()] = r;
    }
    remeasured_ = true;
  }

  bool Done() const override {
    if (results_.size() < proposed_.size()) return false;  // outstanding trials
    if (Remaining() <= 0) return true;
    return !NextCandidate().has_value();
  }

  // The plan, and beyond it (objective frontier) every untried policy that is now predicted to
  // add to the frontier on its own: an upper estimate that falls as measurements come in, so a
  // display that only raises its total when it must (server/search_run.h) rarely has to.
  int PlannedTotal() const override {
    int total = std::max<int>(proposed_.size(), plan_.size());
    if (!Done()) total = std::max<int>(total, proposed_.size() + std::max(1, OpenFollowUps()));
    return std::min(total, spec_.search.max_trials);
  }

  std::string Notes() const override {
    const MemoryError e = predictor_.MeasuredMemoryError(results_);
    if (e.trials == 0) return "";
    const FitTest fit = FitTestFrom(e);
    std::string out = "memory predictions, each measured trial predicted from the others: " +
                      Fmt("median error %+.1f%%", 100 * e.bias) +
                      Fmt(", spread %.1f%%", 100 * e.spread) + " over " +
                      std::to_string(e.trials) + " trials; ";
    out += e.trials < kMinErrorTrials ? std::string("too few to correct by")
                                      : Fmt("predictions corrected by %+.1f%%", 100 * fit.bias);
    out += Fmt(": one predicted up to %.1f%% over the budget is still tried", 100 * fit.margin);
    const auto scales = predictor_.LabelChargeScales(results_);
    if (!scales.empty()) {
      out += "; replay charges as measured by pairs of trials (times the model's):";
      for (const auto& [label, s] : scales) {
        out += std::string(" ") + LabelName(label) + Fmt(" x%.2f", s.scale) + " (" +
               std::to_string(s.pairs) + (s.pairs == 1 ? " pair)" : " pairs)");
      }
    }
    return out;
  }

  void Restore(const std::vector<Candidate>& proposed,
               const std::vector<TrialResult>& results) override {
    proposed_ = proposed;
    tried_.clear();
    for (const auto& c : proposed_) tried_.insert(c.policy.ToString());
    results_.clear();
    for (const auto& r : results) Observe(r);
    remeasured_ = false;  // the caller passes the round's pooled results again when it ended
  }

 private:
  int Remaining() const { return spec_.search.max_trials - static_cast<int>(proposed_.size()); }
  bool Outstanding() const { return results_.size() < proposed_.size(); }

  std::vector<TrialResult> Results() const {
    std::vector<TrialResult> out;
    for (const auto& [k, r] : results_) out.push_back(r);
    return out;
  }

  // A predicted figure that may fit `budget`: corrected by the error the memory predictions have
  // had so far, and that error allowed for (search/predict.h FitTest).
  static bool MayFit(const Prediction& p, uint64_t budget, const FitTest& fit) {
    return !p.known_not_to_fit && fit.MayFit(p.memory_bytes, static_cast<double>(budget));
  }

  FitTest CurrentFitTest() const {
    return FitTestFrom(predictor_.MeasuredMemoryError(results_));
  }

  std::optional<Candidate> NextCandidate() const {
    if (remeasured_) return NextAfterRemeasures();
    if (spec_.search.objective == Objective::kRecommend) return NextForRecommendation();
    for (const auto& c : plan_) {
      if (!tried_.count(c.policy.ToString())) return c;
    }
    // Beyond the plan every choice rests on measurements: it waits for every trial proposed
    // before it, so what a search chooses depends on its results alone, never on how many
    // slots ran it or which result came first (two identical searches, one of them reusing the
    // other's results from the cache, make the same choices).
    if (Outstanding()) return std::nullopt;
    const auto results = Results();
    if (ComputeFrontier(results, spec_.search.memory_metric, spec_.search.MemoryBudgetBytes())
            .empty()) {
      return NextToFit(spec_.search.MemoryBudgetBytes());
    }
    if (auto next = NextForFrontier(results)) return next;
    // The frontier is settled; the recommendation is the one point of it the user runs with, so
    // what could still become the recommendation is measured too (as under `recommend`): the
    // frontier's hypervolume weighs a point near the budget no more than any other, and on the
    // 96-policy MLA + MoE table at 46 GiB the settled frontier's recommendation was 0.81 of the
    // best that fits (docs/results.md, 2026-12-02 r3).
    return NextForRecommendation();
  }

  // After the re-measure round (frontier objective only): a policy predicted to add at least
  // kResumeHypervolumeGain to the pooled frontier, proposed once every trial before it is in.
  std::optional<Candidate> NextAfterRemeasures() const {
    if (spec_.search.objective != Objective::kFrontier || Outstanding()) return std::nullopt;
    const auto results = Results();
    if (ComputeFrontier(results, spec_.search.memory_metric, spec_.search.MemoryBudgetBytes())
            .empty()) {
      return std::nullopt;
    }
    auto next = NextForFrontier(results, nullptr, kResumeHypervolumeGain);
    if (next) next->reason = "after the re-measures (their runs pooled): " + next->reason;
    return next;
  }

  // Untried policies beyond the plan that would be proposed for the frontier now, in any order.
  int OpenFollowUps() const {
    if (spec_.search.objective == Objective::kRecommend) return 1;
    for (const auto& c : plan_) {
      if (!tried_.count(c.policy.ToString())) return 1;  // the plan counts them already
    }
    const auto results = Results();
    if (ComputeFrontier(results, spec_.search.memory_metric, spec_.search.MemoryBudgetBytes())
            .empty()) {
      return 1;
    }
    int open = 0;
    NextForFrontier(results, &open, remeasured_ ? kResumeHypervolumeGain : kMinHypervolumeGain);
    if (open == 0 && !remeasured_ && NextForRecommendation()) open = 1;
    return open;
  }

  // Proposes only a policy predicted to add at least `min_gain` of the frontier's hypervolume on
  // its own; `open`, when given, counts every such untried policy (0 when the frontier is
  // settled).
  std::optional<Candidate> NextForFrontier(const std::vector<TrialResult>& results,
                                           int* open = nullptr,
                                           double min_gain = kMinHypervolumeGain) const {
    const uint64_t budget = spec_.search.MemoryBudgetBytes();
    const auto frontier = ComputeFrontier(results, spec_.search.memory_metric, budget);
    double t_min = frontier.front().tokens_per_s;
    for (const auto& f : frontier) t_min = std::min(t_min, f.tokens_per_s);
    const double t_ref = 0.9 * t_min;
    const double base = Hypervolume(frontier, budget, t_ref);
    const std::vector<FrontierPoint> raised = RaisedFrontier(spec_, results);
    const double raised_base = Hypervolume(raised, budget, t_ref);
    std::vector<FrontierPoint> predicted;
    std::optional<Candidate> best;
    double best_gain = 0;
    const double caching_spread = CachingSpread();
    const FitTest fit = CurrentFitTest();
    for (const Policy& p : all_) {
      if (tried_.count(p.ToString())) continue;
      // Optimistic about a label no trial has run (search/predict.h): the stop rule below then
      // measures one policy with it before it settles, if that could add to the frontier.
      const Prediction pred = predictor_.Predict(results_, p, /*optimistic=*/true);
      if (!MayFit(pred, budget, fit) || !(pred.tokens_per_s > 0)) continue;
      // The correction decides only whether it may fit (the budget edge); where the point sits
      // in memory stays the anchored prediction (corrected there too, the flash and MoE surfaces
      // lost 0.01-0.02 of their hypervolume for no trial saved).
      const FrontierPoint point{
          p, static_cast<uint64_t>(std::min(pred.memory_bytes, static_cast<double>(budget))),
          pred.tokens_per_s};
      predicted.push_back(point);
      auto with = frontier;
      with.push_back(point);
      // Ranked as if a selective policy came out half a caching spread smaller than predicted:
      // its reserved peak carries its own caching, which no neighbour predicts. (A whole spread
      // cost the MLA tables two more trials for no more hypervolume; none lost the 80-layer
      // flash surface 0.01 of its hypervolume: docs/results.md.)
      if (!p.IsFull()) {
        with.back().memory_bytes =
            static_cast<uint64_t>(point.memory_bytes * (1 - 0.5 * caching_spread));
      }
      const double gain = Hypervolume(ParetoFrontier(with), budget, t_ref) - base;
      if (gain < min_gain * base) continue;
      if (open != nullptr) ++*open;
      if (!best || gain > best_gain) {
        best_gain = gain;
        best = MakeCandidate(
            spec_, p,
            Fmt("predicted to add %.1f%% to the frontier's hypervolume", 100 * gain / base) +
                Fmt(" (predicted %.2f GiB", BytesToGib(pred.memory_bytes)) +
                (fit.bias != 0 ? Fmt(", %.2f GiB after the measured error",
                                     BytesToGib(fit.Corrected(pred.memory_bytes)))
                               : std::string()) +
                Fmt(", %.0f tokens/s)", pred.tokens_per_s));
      }
    }
    if (!best) return std::nullopt;
    // Every untried policy at once, as predicted (no optimism): when even all of them would add
    // little, the frontier is settled.
    auto with_all = raised;
    with_all.insert(with_all.end(), predicted.begin(), predicted.end());
    const double joint = Hypervolume(ParetoFrontier(with_all), budget, t_ref) - raised_base;
    if (joint < kStopHypervolumeGain * base) {
      if (open != nullptr) *open = 0;
      return std::nullopt;
    }
    return best;
  }

  // How far the allocator's caching (reserved over allocated) differs between the selective
  // policies measured so far: the standard deviation of reserved / allocated. A selective
  // prediction anchored on a neighbour can be off by as much; full recompute members are
  // predicted from their own family, whose caching moves smoothly with N.
  double CachingSpread() const {
    if (spec_.search.memory_metric != MemoryMetric::kReserved) return 0;
    std::vector<double> ratios;
    for (const auto& [k, r] : results_) {
      if (r.policy.IsFull() || r.status != TrialStatus::kOk || r.PeakAllocatedBytes() == 0)
        continue;
      ratios.push_back(static_cast<double>(r.PeakReservedBytes()) / r.PeakAllocatedBytes());
    }
    if (ratios.size() < 2) return 0;
    double mean = 0, var = 0;
    for (double x : ratios) mean += x / ratios.size();
    for (double x : ratios) var += (x - mean) * (x - mean) / (ratios.size() - 1);
    return std::sqrt(var);
  }

  // Nothing fits yet: the untried policy with the highest predicted throughput among those
  // predicted to fit `budget` (without a time to go on, the lowest predicted memory).
  std::optional<Candidate> NextToFit(uint64_t budget) const {
    std::optional<Candidate> best;
    std::pair<double, double> best_key;
    const FitTest fit = CurrentFitTest();
    for (const Policy& p : all_) {
      if (tried_.count(p.ToString())) continue;
      const Prediction pred = predictor_.Predict(results_, p);
      if (!MayFit(pred, budget, fit)) continue;
      const std::pair<double, double> key{pred.tokens_per_s, -pred.memory_bytes};
      if (!best || key > best_key) {
        best_key = key;
        best = MakeCandidate(spec_, p,
                             "nothing fits yet: the fastest policy predicted to fit" +
                                 Fmt(" (predicted %.2f GiB", BytesToGib(pred.memory_bytes)) +
                                 Fmt(", %.0f tokens/s)", pred.tokens_per_s));
      }
    }
    return best;
  }

  std::optional<Candidate> NextForRecommendation() const {
    const auto results = Results();
    const uint64_t budget = spec_.search.RecommendBudgetBytes();
    const MemoryMetric metric = spec_.search.memory_metric;
    // The control anchors every prediction: it always runs first.
    if (!plan_.empty() && !tried_.count(plan_.front().policy.ToString())) return plan_.front();
    // Every later choice rests on measurements: it waits for every trial proposed before it
    // (see NextCandidate), which also covers "what is still running may fit".
    if (Outstanding()) return std::nullopt;
    const auto rec = RecommendPolicy(spec_, results);
    // Full recompute only when no selective policy fits as measured and none is predicted to.
    bool selective_may_fit = false;
    for (const auto& r : results) {
      if (!r.policy.IsFull() && r.status == TrialStatus::kOk && !r.ranks.empty() &&
          r.PeakBytes(metric) <= budget) {
        selective_may_fit = true;
      }
    }
    std::map<std::string, Prediction> predictions;
    const FitTest fit = CurrentFitTest();
    for (const Policy& p : all_) {
      if (tried_.count(p.ToString())) continue;
      const Prediction pred = predictor_.Predict(results_, p);
      if (!MayFit(pred, budget, fit)) continue;
      predictions[p.ToString()] = pred;
      if (!p.IsFull()) selective_may_fit = true;
    }
    auto could_change = [&](const Policy& p, const Prediction& pred) {
      if (p.IsFull() && selective_may_fit) return false;
      if (!rec) return true;
      if (!(pred.tokens_per_s > 0)) return false;
      // Measured as predicted (noise-free), would it become the recommendation?
      TrialResult as_predicted;
      as_predicted.policy = p;
      as_predicted.status = TrialStatus::kOk;
      RankResult rank;
      rank.peak_allocated_bytes = rank.peak_reserved_bytes =
          static_cast<uint64_t>(std::min(pred.memory_bytes, static_cast<double>(budget)));
      as_predicted.ranks.push_back(rank);
      as_predicted.tokens_per_s = pred.tokens_per_s;
      auto with = results;
      with.push_back(as_predicted);
      const auto changed = RecommendPolicy(spec_, with);
      return changed && changed->choice.policy == p;
    };
    auto reason = [&](const Prediction& pred) {
      std::string why = rec ? "could become the recommendation (now " +
                                  rec->choice.policy.ToString() +
                                  Fmt(", %.0f tokens/s)", rec->choice.tokens_per_s)
                            : std::string("nothing fits yet");
      return why + Fmt(": predicted %.2f GiB", BytesToGib(pred.memory_bytes)) +
             Fmt(", %.0f tokens/s", pred.tokens_per_s);
    };
    // The plan's order first (the guide's path), then the fastest predicted.
    for (const auto& c : plan_) {
      auto it = predictions.find(c.policy.ToString());
      if (it != predictions.end() && could_change(c.policy, it->second)) {
        Candidate out = c;
        out.reason += "; " + reason(it->second);
        return out;
      }
    }
    std::optional<Candidate> best;
    std::pair<double, double> best_key;
    for (const Policy& p : all_) {
      auto it = predictions.find(p.ToString());
      if (it == predictions.end() || !could_change(p, it->second)) continue;
      const std::pair<double, double> key{it->second.tokens_per_s, -it->second.memory_bytes};
      if (!best || key > best_key) {
        best_key = key;
        best = MakeCandidate(spec_, p, reason(it->second));
      }
    }
    return best;
  }

  SearchSpec spec_;
  bool remeasured_ = false;  // ObserveRemeasured: the re-measure round has ended
  std::vector<Candidate> plan_;
  std::vector<Policy> all_;  // class representatives, and full-recompute class members
  mutable Predictor predictor_;
  std::vector<Candidate> proposed_;
  std::set<std::string> tried_;
  std::map<std::string, TrialResult> results_;
};

class ExhaustiveStrategy : public Strategy {
 public:
  explicit ExhaustiveStrategy(const SearchSpec& spec) : spec_(spec) {
    for (auto& p : EnumerateValidPolicies(spec)) {
      all_.push_back(MakeCandidate(spec, p, "exhaustive: every valid policy"));
    }
  }

  std::vector<Candidate> Propose(int max_count) override {
    std::vector<Candidate> out;
    while (static_cast<int>(out.size()) < max_count && next_ < all_.size()) {
      out.push_back(all_[next_++]);
    }
    return out;
  }
  void Observe(const TrialResult& result) override { observed_.insert(result.policy.ToString()); }
  bool Done() const override { return next_ == all_.size() && observed_.size() >= all_.size(); }
  int PlannedTotal() const override { return static_cast<int>(all_.size()); }
  void Restore(const std::vector<Candidate>& proposed,
               const std::vector<TrialResult>& results) override {
    std::set<std::string> seen;
    for (const auto& c : proposed) seen.insert(c.policy.ToString());
    // Keep the enumeration order; what was proposed before is not proposed again.
    std::vector<Candidate> rest;
    std::vector<Candidate> done;
    for (auto& c : all_) (seen.count(c.policy.ToString()) ? done : rest).push_back(c);
    all_ = done;
    next_ = all_.size();
    all_.insert(all_.end(), rest.begin(), rest.end());
    observed_.clear();
    for (const auto& r : results) Observe(r);
  }

 private:
  SearchSpec spec_;
  std::vector<Candidate> all_;
  size_t next_ = 0;
  std::set<std::string> observed_;
};

}  // namespace

std::vector<Candidate> InitialPlan(const SearchSpec& spec) {
  std::vector<Candidate> plan;
  if (!ValidatePolicy(spec, Policy::None()).ok()) return plan;
  plan.push_back(MakeCandidate(spec, Policy::None(), "matched no-recompute control"));
  std::set<Label> placed;
  for (auto& [label, reason] : FirstBoundaries(spec)) {
    plan.push_back(MakeCandidate(spec, Policy::Selective({label}), reason));
    placed.insert(label);
  }
  const MemoryEstimate base = plan.front().estimate;
  const bool flash = spec.model.attention_backend == AttentionBackend::kFlash;
  std::vector<std::pair<double, Label>> rest;
  for (Label l : ValidLabels(spec)) {
    if (placed.count(l) || (flash && l == Label::kCoreAttn)) continue;
    rest.push_back({SavingPerCost(spec, base, Policy::Selective({l})), l});
  }
  std::stable_sort(rest.begin(), rest.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  const size_t calibration = EquivalenceClasses(spec).size() / kClassesPerCalibrationLabel;
  if (rest.size() > calibration) rest.resize(calibration);
  for (auto& [score, l] : rest) {
    const MemoryEstimate e = EstimateMemory(spec, Policy::Selective({l}));
    plan.push_back(MakeCandidate(
        spec, Policy::Selective({l}),
        std::string("single label ") + LabelName(l) +
            Fmt(": predicted %.2f GiB less", BytesToGib(base.peak_bytes - e.peak_bytes)) +
            Fmt(" for %.1f GFLOP replayed per step", e.recompute_flops / 1e9)));
  }
  if (flash && LabelProblem(spec, Label::kCoreAttn).empty()) {
    plan.push_back(MakeCandidate(
        spec, Policy::Selective({Label::kCoreAttn}),
        "core_attn under flash attention: compared against [] only (the kernel already "
        "rematerialises its internals)"));
  }
  // Under the recommend objective full recompute is planned only when the model says no selective
  // policy fits the budget less headroom (the guide: "only when targeted selective boundaries do
  // not make the workload fit"); the strategy adds it later if the measurements say so.
  if (spec.search.objective == Objective::kRecommend) {
    const double budget = static_cast<double>(spec.search.RecommendBudgetBytes());
    for (const Policy& p : EnumerateValidPolicies(spec)) {
      if (!p.IsFull() && EstimateMemory(spec, p).peak_bytes <= budget) return plan;
    }
  }
  for (auto& c : FullRecomputePlan(spec)) plan.push_back(std::move(c));
  return plan;
}

std::unique_ptr<Strategy> MakeGuidedStrategy(const SearchSpec& spec) {
  return std::make_unique<GuidedStrategy>(spec);
}

std::unique_ptr<Strategy> MakeExhaustiveStrategy(const SearchSpec& spec) {
  return std::make_unique<ExhaustiveStrategy>(spec);
}

std::unique_ptr<Strategy> MakeStrategy(const SearchSpec& spec) {
  if (spec.search.strategy == StrategyKind::kExhaustive) return MakeExhaustiveStrategy(spec);
  return MakeGuidedStrategy(spec);
}

}  // namespace remat::search
