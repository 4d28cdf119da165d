#include "search/planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "search/equivalence.h"
#include "search/frontier.h"
#include "search/rules.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

using testing::DenseSpec;
using testing::MlaSpec;
using testing::MoeSpec;

std::vector<std::string> PlanNames(const SearchSpec& spec) {
  std::vector<std::string> out;
  for (const auto& c : InitialPlan(spec)) out.push_back(c.policy.ToString());
  return out;
}

// A deterministic stand-in for measurement: memory from the model, time grows with replayed
// FLOPs. Enough to drive a strategy to its end.
TrialResult Simulate(const SearchSpec& spec, const Policy& p) {
  MemoryEstimate e = EstimateMemory(spec, p);
  TrialResult r;
  r.policy = p;
  RankResult rr;
  rr.peak_allocated_bytes = rr.peak_reserved_bytes = static_cast<uint64_t>(e.peak_bytes);
  r.ranks.push_back(rr);
  r.step_time_s = 1.0 + e.recompute_flops / std::max(e.model_flops, 1.0);
  r.tokens_per_s = TokensPerSecond(spec, r.step_time_s);
  r.status = rr.peak_reserved_bytes <= spec.search.MemoryBudgetBytes() ? TrialStatus::kOk
                                                                       : TrialStatus::kOom;
  return r;
}

std::vector<TrialResult> RunToEnd(Strategy& s, const SearchSpec& spec, int parallel) {
  std::vector<TrialResult> results;
  std::set<std::string> seen;
  for (int guard = 0; guard < 1000 && !s.Done(); ++guard) {
    auto batch = s.Propose(parallel);
    EXPECT_FALSE(batch.empty()) << "not done but nothing proposed with nothing outstanding";
    if (batch.empty()) break;
    for (const auto& c : batch) {
      EXPECT_TRUE(seen.insert(c.policy.ToString()).second)
          << "proposed twice: " << c.policy.ToString();
      EXPECT_TRUE(ValidatePolicy(spec, c.policy).ok()) << c.policy.ToString();
      EXPECT_FALSE(c.reason.empty());
      results.push_back(Simulate(spec, c.policy));
      s.Observe(results.back());
    }
  }
  EXPECT_TRUE(s.Done());
  return results;
}

TEST(PlannerTest, ControlFirstThenCoreAttnForUnfusedDense) {
  auto names = PlanNames(DenseSpec());
  ASSERT_GE(names.size(), 3u);
  EXPECT_EQ(names[0], "selective:[]");
  EXPECT_EQ(names[1], "selective:[core_attn]");
  EXPECT_EQ(names[2], "selective:[mlp]");  // dense FFN boundary follows in the contract's order
  EXPECT_EQ(names.back(), "full:uniform:1");
  EXPECT_EQ(InitialPlan(DenseSpec())[0].reason, "matched no-recompute control");
}

TEST(PlannerTest, FlashPutsCoreAttnAfterAllOtherSingleLabels) {
  SearchSpec s = DenseSpec();
  s.model.attention_backend = AttentionBackend::kFlash;
  auto names = PlanNames(s);
  EXPECT_EQ(names[0], "selective:[]");
  EXPECT_EQ(names[1], "selective:[mlp]");
  size_t core = std::find(names.begin(), names.end(), "selective:[core_attn]") - names.begin();
  ASSERT_LT(core, names.size());
  for (size_t i = core + 1; i < names.size(); ++i) EXPECT_EQ(names[i].rfind("full:", 0), 0u);
}

TEST(PlannerTest, MlaLeadsWithMlaUpProjAfterCoreAttnWhenUnfused) {
  SearchSpec s = MlaSpec();
  auto names = PlanNames(s);
  EXPECT_EQ(names[0], "selective:[]");
  EXPECT_EQ(names[1], "selective:[core_attn]");
  EXPECT_EQ(names[2], "selective:[mla_up_proj]");
  s.model.attention_backend = AttentionBackend::kFlash;
  EXPECT_EQ(PlanNames(s)[1], "selective:[mla_up_proj]");
}

TEST(PlannerTest, GroupedMoeLeadsWithMoeAct) {
  SearchSpec s = MoeSpec();
  s.model.attention_backend = AttentionBackend::kFlash;
  auto names = PlanNames(s);
  EXPECT_EQ(names[0], "selective:[]");
  EXPECT_EQ(names[1], "selective:[moe_act]");
  // Single labels in the plan: the first boundaries (moe_act; mlp only for dense FFN layers),
  // core_attn under flash, and one calibration label per 100 equivalence classes, each once.
  std::set<std::string> singles;
  size_t count = 0;
  for (const auto& n : names) {
    if (n.rfind("selective:[", 0) == 0 && n != "selective:[]" && n.find(',') == std::string::npos) {
      singles.insert(n);
      ++count;
    }
  }
  EXPECT_EQ(singles.size(), count);
  const size_t calibration = EquivalenceClasses(s).size() / 100;
  EXPECT_LE(singles.size(), 3 + calibration);  // moe_act, mlp for dense layers, core_attn
  EXPECT_TRUE(singles.count("selective:[moe_act]"));
  EXPECT_TRUE(singles.count("selective:[core_attn]"));
}

// The plan's calibration labels are sized to the table: none on a table under 100 classes (the
// H200 tables: their frontiers came out the same without them, for 3-5 trials less), one on the
// 80-layer surfaces (167 classes), the best predicted saving per replayed FLOP.
TEST(PlannerTest, CalibrationLabelsAreSizedToTheTable) {
  auto singles = [](const SearchSpec& spec) {
    std::vector<std::string> out;
    for (const auto& c : InitialPlan(spec)) {
      if (!c.policy.IsFull() && c.policy.labels.size() == 1) out.push_back(c.policy.ToString());
    }
    return out;
  };
  const SearchSpec dense = DenseSpec();
  ASSERT_LT(EquivalenceClasses(dense).size(), 100u);
  // Dense, unfused: the first boundaries core_attn and mlp only.
  EXPECT_EQ(singles(dense), (std::vector<std::string>{"selective:[core_attn]", "selective:[mlp]"}));
  SearchSpec big = dense;
  big.model.num_layers = 80;
  const size_t classes = EquivalenceClasses(big).size();
  ASSERT_GE(classes, 100u);
  const auto big_singles = singles(big);
  EXPECT_EQ(big_singles.size(), std::min(ValidLabels(big).size(), 2 + classes / 100));
}

TEST(PlannerTest, PlanCarriesEstimates) {
  for (const auto& c : InitialPlan(DenseSpec())) {
    EXPECT_GT(c.estimate.peak_bytes, 0) << c.policy.ToString();
    EXPECT_GT(c.estimate.activation_bytes, 0) << c.policy.ToString();
  }
}

TEST(PlannerTest, GuidedRunsToCompletionWithoutRepeatsAtAnyParallelism) {
  for (const SearchSpec& spec : {DenseSpec(), MlaSpec(), MoeSpec()}) {
    for (int parallel : {1, 3, 16}) {
      auto s = MakeGuidedStrategy(spec);
      auto results = RunToEnd(*s, spec, parallel);
      EXPECT_GE(results.size(), InitialPlan(spec).size()) << spec.name;
      EXPECT_LE(static_cast<int>(results.size()), spec.search.max_trials);
    }
  }
}

TEST(PlannerTest, GuidedHonoursMaxTrials) {
  SearchSpec spec = MoeSpec();
  spec.search.max_trials = 3;
  auto s = MakeGuidedStrategy(spec);
  auto results = RunToEnd(*s, spec, 8);
  EXPECT_EQ(results.size(), 3u);
  EXPECT_EQ(results[0].policy.ToString(), "selective:[]");
}

TEST(PlannerTest, GuidedWaitsForOutstandingResultsBeforeDone) {
  SearchSpec spec = DenseSpec();
  auto s = MakeGuidedStrategy(spec);
  auto batch = s->Propose(100);
  EXPECT_FALSE(s->Done());
  for (const auto& c : batch) s->Observe(Simulate(spec, c.policy));
  // The initial plan is proposed in full before any result.
  EXPECT_EQ(batch.size(), InitialPlan(spec).size());
}

TEST(PlannerTest, RestoreContinuesWhereTheStrategyLeftOff) {
  SearchSpec spec = MoeSpec();
  auto a = MakeGuidedStrategy(spec);
  std::vector<Candidate> proposed;
  std::vector<TrialResult> results;
  for (int i = 0; i < 4; ++i) {
    for (auto& c : a->Propose(2)) {
      proposed.push_back(c);
      if (i < 3) {  // the last batch is still running when the "coordinator dies"
        results.push_back(Simulate(spec, c.policy));
        a->Observe(results.back());
      }
    }
  }
  auto b = MakeGuidedStrategy(spec);
  b->Restore(proposed, results);
  EXPECT_FALSE(b->Done());
  std::set<std::string> before;
  for (const auto& c : proposed) before.insert(c.policy.ToString());
  for (const auto& c : b->Propose(100))
    EXPECT_FALSE(before.count(c.policy.ToString())) << c.policy.ToString();
}

TEST(PlannerTest, ExhaustiveEnumeratesEveryValidPolicyOnce) {
  SearchSpec spec = MoeSpec();
  spec.search.strategy = StrategyKind::kExhaustive;
  auto s = MakeStrategy(spec);
  EXPECT_EQ(s->PlannedTotal(), static_cast<int>(EnumerateValidPolicies(spec).size()));
  auto results = RunToEnd(*s, spec, 5);
  EXPECT_EQ(results.size(), EnumerateValidPolicies(spec).size());
}

TEST(PlannerTest, ExhaustiveRestoreSkipsWhatWasProposed) {
  SearchSpec spec = DenseSpec();
  spec.search.strategy = StrategyKind::kExhaustive;
  auto a = MakeStrategy(spec);
  auto first = a->Propose(5);
  std::vector<TrialResult> results;
  for (auto& c : first) results.push_back(Simulate(spec, c.policy));
  auto b = MakeStrategy(spec);
  b->Restore(first, results);
  auto rest = RunToEnd(*b, spec, 100);
  EXPECT_EQ(rest.size() + first.size(), EnumerateValidPolicies(spec).size());
}

// On the simulated oracle the guided search should find nearly the exhaustive frontier's area
// for far fewer trials (bench/gpu/compare_main.cc measures this on the GPU).
TEST(PlannerTest, GuidedCoversMostOfTheExhaustiveHypervolumeOnTheModelOracle) {
  for (SearchSpec spec : {DenseSpec(), MlaSpec(), MoeSpec()}) {
    spec.search.memory_budget_gib = 1000;
    auto g = MakeGuidedStrategy(spec);
    auto guided = RunToEnd(*g, spec, 4);
    SearchSpec ex_spec = spec;
    ex_spec.search.strategy = StrategyKind::kExhaustive;
    auto e = MakeStrategy(ex_spec);
    auto exhaustive = RunToEnd(*e, ex_spec, 4);
    const uint64_t budget = spec.search.MemoryBudgetBytes();
    auto fe = ComputeFrontier(exhaustive, MemoryMetric::kReserved, budget);
    auto fg = ComputeFrontier(guided, MemoryMetric::kReserved, budget);
    double t_min = 1e300;
    for (const auto& p : fe) t_min = std::min(t_min, p.tokens_per_s);
    const double t_ref = 0.9 * t_min;
    const double ratio = Hypervolume(fg, budget, t_ref) / Hypervolume(fe, budget, t_ref);
    EXPECT_GE(ratio, 0.95) << spec.name << " guided " << guided.size() << " vs exhaustive "
                           << exhaustive.size();
    EXPECT_LT(guided.size(), exhaustive.size()) << spec.name;
  }
}

}  // namespace
}  // namespace remat::search

namespace remat::search {
namespace {

using testing::DenseSpec;

double MinPeak(const SearchSpec& spec, bool full) {
  double best = 1e300;
  for (const Policy& p : EnumerateValidPolicies(spec)) {
    if (p.IsFull() == full) best = std::min(best, EstimateMemory(spec, p).peak_bytes);
  }
  return best;
}

SearchSpec WithBudget(SearchSpec spec, double bytes, Objective objective) {
  spec.search.memory_budget_gib = bytes / (1024.0 * 1024.0 * 1024.0);
  spec.search.objective = objective;
  return spec;
}

// The control fits: nothing replays less, so nothing else is worth a trial.
TEST(PlannerRecommendTest, ControlThatFitsIsTheWholeSearch) {
  SearchSpec spec = DenseSpec();
  spec = WithBudget(spec, 1.2 * EstimateMemory(spec, Policy::None()).peak_bytes,
                    Objective::kRecommend);
  auto s = MakeGuidedStrategy(spec);
  auto results = RunToEnd(*s, spec, 4);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_EQ(results[0].policy.ToString(), "selective:[]");
  EXPECT_EQ(RecommendPolicy(spec, results)->choice.policy.ToString(), "selective:[]");
}

// A selective policy fits: full recompute is neither planned nor tried.
TEST(PlannerRecommendTest, NoFullRecomputeWhileASelectivePolicyFits) {
  SearchSpec spec = DenseSpec();
  const double control = EstimateMemory(spec, Policy::None()).peak_bytes;
  spec = WithBudget(spec, 0.5 * (control + MinPeak(spec, /*full=*/false)), Objective::kRecommend);
  for (const auto& c : InitialPlan(spec)) EXPECT_FALSE(c.policy.IsFull()) << c.policy.ToString();
  auto s = MakeGuidedStrategy(spec);
  auto results = RunToEnd(*s, spec, 1);
  for (const auto& r : results) EXPECT_FALSE(r.policy.IsFull()) << r.policy.ToString();
  auto rec = RecommendPolicy(spec, results);
  ASSERT_TRUE(rec.has_value());
  EXPECT_FALSE(rec->choice.policy.IsFull());
  // Fewer trials than the frontier objective, which maps the full-recompute end as well.
  SearchSpec frontier = spec;
  frontier.search.objective = Objective::kFrontier;
  auto f = MakeGuidedStrategy(frontier);
  EXPECT_LT(results.size(), RunToEnd(*f, frontier, 1).size());
}

// The model says no selective policy fits: full recompute is planned, and found.
TEST(PlannerRecommendTest, FullRecomputeWhenNoSelectivePolicyFits) {
  SearchSpec spec = DenseSpec();
  const double selective = MinPeak(spec, false), full = MinPeak(spec, true);
  ASSERT_LT(full, selective);
  spec = WithBudget(spec, 0.5 * (selective + full), Objective::kRecommend);
  bool planned_full = false;
  for (const auto& c : InitialPlan(spec)) planned_full |= c.policy.IsFull();
  EXPECT_TRUE(planned_full);
  auto s = MakeGuidedStrategy(spec);
  auto results = RunToEnd(*s, spec, 1);
  auto rec = RecommendPolicy(spec, results);
  ASSERT_TRUE(rec.has_value());
  EXPECT_TRUE(rec->choice.policy.IsFull());
}

}  // namespace
}  // namespace remat::search
