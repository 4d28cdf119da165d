#include "search/planner.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>

#include "search/frontier.h"
#include "search/rules.h"
#include "search/units.h"

namespace remat::search {
namespace {

// A label whose predicted extra saving on top of a policy is below this fraction of the
// predicted peak cannot move the frontier: it is not proposed as a neighbour.
constexpr double kMinUsefulSavingFraction = 0.002;

// A neighbour predicted to add less than this fraction of the frontier's hypervolume is not tried.
constexpr double kMinHypervolumeGain = 0.001;

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

// Labels that make another redundant when both are present (the outer one already discards
// everything the inner one would).
bool Redundant(const Policy& p) {
  if (p.Has(Label::kMoe) && (p.Has(Label::kMoeAct) || p.Has(Label::kSharedExperts))) return true;
  return false;
}

double SavingPerCost(const SearchSpec& spec, const MemoryEstimate& base, const Policy& p) {
  MemoryEstimate e = EstimateMemory(spec, p);
  const double saving = base.peak_bytes - e.peak_bytes;
  const double cost = std::max(e.recompute_flops, 1.0);
  return saving / cost;
}

// Follow-up labels the guide names after a first boundary: "add core_attn" after mla_up_proj,
// "add layernorm, then whole moe" after moe_act.
int GuidePreference(const SearchSpec& spec, const Policy& from, Label add) {
  const ModelSpec& m = spec.model;
  if (m.multi_latent_attention && from.Has(Label::kMlaUpProj) && add == Label::kCoreAttn) return 0;
  if (m.IsMoe() && from.Has(Label::kMoeAct) && add == Label::kLayernorm) return 0;
  if (m.IsMoe() && from.Has(Label::kMoeAct) && add == Label::kMoe) return 1;
  return 2;
}

// The full-recompute proposals of the initial plan: block with the smallest N predicted to fit,
// and uniform:1.
std::vector<Candidate> FullRecomputePlan(const SearchSpec& spec) {
  std::vector<Candidate> out;
  const int layers = LayersPerStage(spec);
  if (layers < 1 || !ValidatePolicy(spec, Policy::Full(RecomputeMethod::kUniform, 1)).ok()) {
    return out;
  }
  const double budget = static_cast<double>(spec.search.MemoryBudgetBytes());
  int block_n = layers;
  for (int n = 1; n <= layers; ++n) {
    if (EstimateMemory(spec, Policy::Full(RecomputeMethod::kBlock, n)).peak_bytes <= budget) {
      block_n = n;
      break;
    }
  }
  if (block_n < layers &&
      ValidatePolicy(spec, Policy::Full(RecomputeMethod::kBlock, block_n)).ok()) {
    out.push_back(MakeCandidate(
        spec, Policy::Full(RecomputeMethod::kBlock, block_n),
        "full recompute: block with the smallest N predicted to fit (" + std::to_string(block_n) +
            " of " + std::to_string(layers) + " layers per stage)"));
  }
  out.push_back(MakeCandidate(spec, Policy::Full(RecomputeMethod::kUniform, 1),
                              "full recompute: uniform:1, the low-memory end of the frontier"));
  return out;
}

class GuidedStrategy : public Strategy {
 public:
  explicit GuidedStrategy(const SearchSpec& spec) : spec_(spec), plan_(InitialPlan(spec)) {}

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

  void Observe(const TrialResult& result) override {
    results_[result.policy.ToString()] = result;
  }

  bool Done() const override {
    if (results_.size() < proposed_.size()) return false;  // outstanding trials
    if (Remaining() <= 0) return true;
    return !NextCandidate().has_value();
  }

  int PlannedTotal() const override {
    int total = std::max<int>(proposed_.size(), plan_.size());
    if (!Done()) {
      // Expect about one follow-up per frontier point still open.
      total = std::max<int>(total, proposed_.size() + 1);
    }
    return std::min(total, spec_.search.max_trials);
  }

  void Restore(const std::vector<Candidate>& proposed,
               const std::vector<TrialResult>& results) override {
    proposed_ = proposed;
    tried_.clear();
    for (const auto& c : proposed_) tried_.insert(c.policy.ToString());
    results_.clear();
    for (const auto& r : results) Observe(r);
  }

 private:
  int Remaining() const { return spec_.search.max_trials - static_cast<int>(proposed_.size()); }

  std::vector<TrialResult> Results() const {
    std::vector<TrialResult> out;
    for (const auto& [k, r] : results_) out.push_back(r);
    return out;
  }

  std::optional<Candidate> NextCandidate() const {
    for (const auto& c : plan_) {
      if (!tried_.count(c.policy.ToString())) return c;
    }
    if (auto c = NextBlockCandidate()) return c;
    return NextNeighbour();
  }

  // Refines full:block:N towards the smallest N whose measured peak fits.
  std::optional<Candidate> NextBlockCandidate() const {
    const int layers = LayersPerStage(spec_);
    const uint64_t budget = spec_.search.MemoryBudgetBytes();
    int max_nofit = 0, min_fit = layers + 1;
    bool any_block = false;
    for (const auto& [key, r] : results_) {
      if (!r.policy.IsFull() || r.policy.method != RecomputeMethod::kBlock) continue;
      any_block = true;
      const bool fits = r.status == TrialStatus::kOk && r.PeakBytes(spec_.search.memory_metric) <= budget;
      const bool nofit = r.status == TrialStatus::kOom ||
                         (r.status == TrialStatus::kOk && !fits);
      if (fits) min_fit = std::min(min_fit, r.policy.num_layers);
      if (nofit) max_nofit = std::max(max_nofit, r.policy.num_layers);
    }
    if (!any_block) return std::nullopt;
    // Block N and uniform:1 are the same at N = layers: never propose it.
    const int lo = max_nofit + 1, hi = std::min(min_fit - 1, layers - 1);
    if (lo > hi) return std::nullopt;
    const int n = (lo + hi) / 2;
    Policy p = Policy::Full(RecomputeMethod::kBlock, n);
    if (tried_.count(p.ToString())) return std::nullopt;
    return MakeCandidate(spec_, p,
                         "full recompute: narrowing block N towards the smallest that fits "
                         "(between " + std::to_string(lo) + " and " + std::to_string(hi) + ")");
  }

  // One change at a time from the points on the frontier so far: a label added or dropped on a
  // selective point, or another N of full:block:N (predicted from the nearest measured N). Each neighbour's memory and
  // throughput are predicted from its measured anchor (the analytic model's ratio between the
  // two, applied to the measurement), and the neighbour whose predicted point would add the most
  // hypervolume to the measured frontier goes first. When no neighbour is predicted to add at
  // least kMinHypervolumeGain of the frontier's hypervolume, nothing left could improve it: done.
  std::optional<Candidate> NextNeighbour() const {
    const auto results = Results();
    const MemoryMetric metric = spec_.search.memory_metric;
    const uint64_t budget = spec_.search.MemoryBudgetBytes();
    const auto frontier = ComputeFrontier(results, metric, budget);
    std::vector<const TrialResult*> anchors;
    for (const auto& f : frontier) anchors.push_back(&results_.at(f.policy.ToString()));
    if (anchors.empty()) {
      // Nothing fits yet: grow from the lowest-memory selective point measured so far.
      const TrialResult* lowest = nullptr;
      for (const auto& [k, r] : results_) {
        if (r.policy.IsFull() || r.ranks.empty()) continue;
        if (!lowest || r.PeakBytes(metric) < lowest->PeakBytes(metric)) lowest = &r;
      }
      if (lowest) anchors.push_back(lowest);
    }
    double t_min = 0;
    for (const auto& f : frontier) t_min = t_min == 0 ? f.tokens_per_s : std::min(t_min, f.tokens_per_s);
    const double t_ref = 0.9 * t_min;
    const double base_hv = frontier.empty() ? 0 : Hypervolume(frontier, budget, t_ref);
    const double model_flops = std::max(ModelFlopsPerStep(spec_), 1.0);

    std::optional<Candidate> best;
    double best_gain = -1;
    int best_preference = 3;
    auto consider = [&](const TrialResult& anchor, const Policy& p, int preference,
                        const std::string& change) {
      if (tried_.count(p.ToString()) || Redundant(p) || !ValidatePolicy(spec_, p).ok()) return;
      const MemoryEstimate ea = EstimateMemory(spec_, anchor.policy);
      const MemoryEstimate ep = EstimateMemory(spec_, p);
      if (ea.peak_bytes <= 0) return;
      const double mem = anchor.PeakBytes(metric) * (ep.peak_bytes / ea.peak_bytes);
      // A point predicted well over the budget cannot join the frontier (2% for model error).
      if (mem > 1.02 * static_cast<double>(budget)) return;
      const double tps = anchor.tokens_per_s * StepCost(anchor.policy, ea, model_flops) /
                         StepCost(p, ep, model_flops);
      double gain = 0;
      if (anchor.status == TrialStatus::kOk && !frontier.empty()) {
        auto with = frontier;
        with.push_back({p, static_cast<uint64_t>(std::min(mem, static_cast<double>(budget))), tps});
        gain = Hypervolume(ParetoFrontier(with), budget, t_ref) - base_hv;
        if (gain < kMinHypervolumeGain * base_hv) return;
      } else if (ea.peak_bytes - ep.peak_bytes < kMinUsefulSavingFraction * ea.peak_bytes) {
        return;  // growing towards the budget: only changes that save memory
      }
      if (preference < best_preference ||
          (preference == best_preference && gain > best_gain)) {
        best_preference = preference;
        best_gain = gain;
        best = MakeCandidate(spec_, p,
                             "one change from " + anchor.policy.ToString() + ": " + change +
                                 Fmt(" (predicted %.2f GiB", BytesToGib(mem)) +
                                 Fmt(", %.0f tokens/s)", tps));
      }
    };
    const std::vector<Label> valid = ValidLabels(spec_);
    const int layers = LayersPerStage(spec_);
    // full:block:N is a one-dimensional family that maps the low-memory end; full:uniform:1 is
    // its end N = layers (every layer recomputed on its own). Every unmeasured N is predicted from
    // the nearest measured point of the family that fits, on the frontier or not, so the walk
    // reaches an N that would join the frontier even when the N next to a measurement would not.
    std::map<int, const TrialResult*> family;  // N -> measured point that fits
    for (const auto& [k, r] : results_) {
      if (!r.policy.IsFull() || r.status != TrialStatus::kOk || r.PeakBytes(metric) > budget) continue;
      if (r.policy.method == RecomputeMethod::kBlock) family[r.policy.num_layers] = &r;
      if (r.policy.method == RecomputeMethod::kUniform && r.policy.num_layers == 1) family[layers] = &r;
    }
    for (int n = 1; n < layers && !family.empty(); ++n) {
      auto above = family.lower_bound(n);
      auto nearest = above;
      if (above == family.end() ||
          (above != family.begin() && n - std::prev(above)->first < above->first - n)) {
        nearest = std::prev(above);
      }
      if (nearest->first == n) continue;
      consider(*nearest->second, Policy::Full(RecomputeMethod::kBlock, n), 2,
               "block N " + std::to_string(nearest->first) + " -> " + std::to_string(n));
    }
    for (const TrialResult* a : anchors) {
      const Policy& anchor = a->policy;
      if (anchor.IsFull()) continue;  // the full-recompute family is walked above
      // With nothing fitting yet, follow the guide's order of follow-up labels first.
      const bool growing = frontier.empty();
      for (Label l : valid) {
        if (!anchor.Has(l)) {
          consider(*a, anchor.With(l), growing ? GuidePreference(spec_, anchor, l) : 2,
                   std::string("adds ") + LabelName(l));
        }
      }
      for (Label l : anchor.labels) {
        consider(*a, anchor.Without(l), 2, std::string("drops ") + LabelName(l));
      }
    }
    return best;
  }

  // Relative time of a step under `p`: model FLOPs plus replayed FLOPs, plus a small charge for
  // output-discarding labels whose replay is elementwise (memory-bound, so FLOPs understate it).
  static double StepCost(const Policy& p, const MemoryEstimate& e, double model_flops) {
    double elementwise = 0;
    for (Label l : p.labels) {
      if (l == Label::kLayernorm || l == Label::kMoeAct) elementwise += 0.01;
    }
    return 1.0 + e.recompute_flops / model_flops + elementwise;
  }

  SearchSpec spec_;
  std::vector<Candidate> plan_;
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
