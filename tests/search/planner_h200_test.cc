// The guided strategy on real measurements: the exhaustive H200 searches of docs/results.md,
// replayed. Every policy the guided search proposes is answered from the measured table, so the
// figures here are what the guided search would have found on that GPU. Two runs on different
// days' machines (tables `h200-MODEL-exhaustive-table.json` and `...-table-r2.json`): the strategy
// must hold on both, which keeps it from being tuned to one run's noise. The harness is
// tests/search/replay_surfaces.h; `remat-search-bench --source .` prints the same figures.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "search/equivalence.h"
#include "specfile/spec_file.h"
#include "tests/search/replay_surfaces.h"

namespace remat::search {
namespace {

// A measured table and the spec it is replayed with (examples/replay/h200-NAME.yaml). `run` is
// "" for the first run's table, "-r2" for the second's; `budget_gib` > 0 replays at that budget
// instead of the spec's.
struct MeasuredTable {
  SearchSpec spec;
  replay::Table table;
};
MeasuredTable Load(const std::string& name, const std::string& run, double budget_gib = 0) {
  MeasuredTable out;
  auto spec =
      spec::LoadSpecFile(std::string(REMAT_SOURCE_DIR) + "/examples/replay/h200-" + name + ".yaml");
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  auto table = spec::LoadReplayTableFile(std::string(REMAT_SOURCE_DIR) + "/docs/results/h200-" +
                                         name + "-exhaustive-table" + run + ".json");
  EXPECT_TRUE(table.ok()) << table.status().message();
  if (!spec.ok() || !table.ok()) return out;
  out.spec = *spec;
  if (budget_gib > 0) out.spec.search.memory_budget_gib = budget_gib;
  for (const auto& [k, entry] : *table) out.table[k] = entry.result;
  return out;
}

// The guided search replayed on a measured table (Load). `draws`: further runs of the table's
// policies, which the re-measure round is served.
replay::Outcome Evaluate(const std::string& name, const std::string& run,
                         Objective objective = Objective::kFrontier, double budget_gib = 0,
                         const replay::Draws& draws = {}) {
  MeasuredTable m = Load(name, run, budget_gib);
  m.spec.search.objective = objective;
  const replay::Outcome o = replay::Replay(m.spec, m.table, draws);
  std::printf("[%s] %s\n", Name(objective), replay::Describe(name + run, o).c_str());
  return o;
}

// The second run of every policy of a table (docs/results/h200-NAME-RUN-redraws-1.json, written by
// bench/search/redraws.py), measured on the machine that measured the table right after it: the
// same policies, every allocated peak equal to the table's to the byte.
replay::Draws SecondRuns(const std::string& name, const std::string& run, size_t policies) {
  const std::string dir = std::string(REMAT_SOURCE_DIR) + "/docs/results/h200-" + name;
  auto table = spec::LoadReplayTableFile(dir + "-exhaustive-table" + run + ".json");
  auto again = spec::LoadReplayTableFile(dir + run + "-redraws-1.json");
  EXPECT_TRUE(table.ok() && again.ok()) << name << run;
  replay::Draws draws;
  if (!table.ok() || !again.ok()) return draws;
  EXPECT_EQ(table->size(), policies);
  EXPECT_EQ(again->size(), policies);
  for (const auto& [policy, entry] : *again) {
    EXPECT_EQ(table->count(policy), 1u) << policy;
    if (!table->count(policy)) continue;
    EXPECT_EQ(entry.result.PeakAllocatedBytes(), table->at(policy).result.PeakAllocatedBytes())
        << policy;
    draws[policy].push_back(entry.result);
  }
  return draws;
}

// The first goal was 0.95 of the hypervolume for a quarter of the trials; the later one is 0.97
// with a quarter on 60-150 policies (the MLA tables, 76). These surfaces are small (6-8 layers) and
// noisy (MoE step times scatter by 15-50% between a trial's steps), so the bounds here guard
// against sliding back rather than state the goal; docs/results.md has the figures.
// The hypervolume is the exhaustive table's with each equivalence class's members pooled
// (search/equivalence.h): members are draws of one policy, so the best of their draws is luck.
void ExpectEfficient(const replay::Outcome& o, double max_trial_ratio, double min_hypervolume) {
  EXPECT_GE(o.pooled_hypervolume_ratio, min_hypervolume);
  EXPECT_GE(o.pooled_hypervolume_ratio + 1e-9, o.hypervolume_ratio - 0.02);
  EXPECT_LE(static_cast<double>(o.guided_trials) / o.exhaustive_trials, max_trial_ratio);
}

// Dense stays over the quarter: its initial plan is 5 of its 24 policies (the control, the first
// boundaries core_attn and mlp, full:block:1 and uniform:1), and the full:block family (8 members)
// is most of its frontier; the best 4 points of the exhaustive frontier hold 0.965 of its
// hypervolume. 11 trials (46%) since the plan is sized to the table; 12 (50%) before; 10 (42%)
// since the plan's full:block guess allows for the model's error (block:1 ran out of memory).
TEST(PlannerOnH200Measurements, Dense) { ExpectEfficient(Evaluate("dense", ""), 0.46, 0.97); }
TEST(PlannerOnH200Measurements, DenseSecondRun) {
  ExpectEfficient(Evaluate("dense", "-r2"), 0.46, 0.97);
}
// In the first MoE run selective:[core_attn,layernorm,shared_experts] measured 4% faster than
// selective:[core_attn] while replaying more: noise the model cannot predict, which costs 0.06 of
// the hypervolume. The first two MoE runs were measured with the engine before its SwiGLU kept
// Megatron's extra F-wide tensor; the memory model now counts that tensor, so its
// predictions sit further from those tables' peaks (run 1: 0.940 -> 0.920). The third run was
// measured after the fix (2026-12-02, docs/results.md) and holds the high bar.
// 12-14 of 44 trials since the plan is sized to the table (15-17 before; the goal's 11 is missed).
TEST(PlannerOnH200Measurements, Moe) { ExpectEfficient(Evaluate("moe", ""), 0.32, 0.91); }
TEST(PlannerOnH200Measurements, MoeSecondRun) {
  ExpectEfficient(Evaluate("moe", "-r2"), 0.32, 0.97);
}
TEST(PlannerOnH200Measurements, MoeThirdRunAfterTheSwigluFix) {
  ExpectEfficient(Evaluate("moe", "-r3"), 0.32, 0.97);
}
// The fourth run (2026-12-03) measured every policy adaptively (until the median's 90% interval
// was within 2%, 5-20 steps; 38 of 44 reached it), so the noise-aware stop has real intervals
// to act on: held to the goals themselves, a quarter of the policies, 0.95 of the pooled
// hypervolume and a recommendation within 3% of the best that fits.
TEST(PlannerOnH200Measurements, MoeFourthRunMeasuredAdaptively) {
  const replay::Outcome o = Evaluate("moe", "-r4");
  ExpectEfficient(o, 0.25, 0.95);
  EXPECT_GE(o.recommendation_throughput_ratio, 0.97);
}
// Likewise selective:[core_attn,layernorm] in the first MLA run: 5% faster than [core_attn].
TEST(PlannerOnH200Measurements, Mla) { ExpectEfficient(Evaluate("mla", ""), 0.22, 0.93); }
// The second run held 0.99 until the model counted a GPU's softmax-backward temporary and cuBLAS
// workspaces (2026-12-03): the plan then rightly skips full:block:1 (out of memory) for
// full:block:2, and a slow draw of full:block:6 (9% over its class's full:uniform:1) left
// full:block:5 and 4 predicted under the gain worth a trial: 0.947. With the two draws' mean
// anchoring the block family's end (search/predict.h) 0.992 for 16 trials (docs/results.md).
// 0.955 since the frontier search is optimistic about labels no trial has run: it runs
// selective:[core_attn,moe] two trials earlier, and with the frontier those trials leave,
// full:block:5 (predicted from the slow full:block:6 draw) is predicted under full:uniform:1 and
// the search settles without full:block:4 and 5. Held to the goal's 0.95.
TEST(PlannerOnH200Measurements, MlaSecondRun) {
  ExpectEfficient(Evaluate("mla", "-r2"), 0.22, 0.95);
}
// The third MLA run (2026-12-03, night) was measured after the search changes of that day, as a
// held-out table: forced load balancing, adaptively (73 of 76 met the 2% target), at 130 GiB so
// every policy ran; replayed at the spec's 80 GiB. The plan is within -0.016..+0.094 GiB of every
// peak. 21 trials (27.6%, two over the goal's quarter) while the fit test's margin was the
// largest memory-prediction error: being optimistic about `moe`, which no plan trial runs, cost
// two trials, and five policies predicted 1.1-1.7% over the budget were tried (all over it).
// With the errors' 90th percentile (search/predict.h), 19 (25.0%) for the same frontier; 17
// (22.4%) and 0.971 (0.957 with the frontier's policies at their pooled figures) since the
// predictions charge each label what the search's pairs of trials measure: it measures other
// policies with the shared experts (charged a fraction of the model's charge) and settles
// without selective:[core_attn,moe_act,mla_up_proj], which took it from 0.967 to 0.981 before.
TEST(PlannerOnH200Measurements, MlaThirdRunForcedBalancingHeldOut) {
  const replay::Outcome o = Evaluate("mla", "-r3");
  ExpectEfficient(o, 0.25, 0.95);
  EXPECT_GE(o.recommendation_throughput_ratio, 0.99);
}
// The 96-policy MLA + MoE table was measured with every policy running (130 GiB), so it is
// replayed at three budgets across its frontier: 46 GiB (42.2-45.7 GiB of it fits), 58 (the
// spec's) and 68 GiB (all but the control and the single labels). 14-21 trials of 96 since the
// frontier search measures what could still become the recommendation once its frontier settles
// (11-16 before, when at 46 GiB it recommended a policy 0.81 as fast as the best that fits).
// At 68 GiB the recommendation is 0.912 of the best (selective:[moe_act,shared_experts], one
// 5-step draw that its prediction, anchored on a slow draw of selective:[moe_act], puts below
// selective:[core_attn]): docs/results.md (2026-12-02, r3); 0.868 since the model counts a GPU's
// softmax-backward temporary and cuBLAS workspaces (2026-12-03), the same miss: 40 policies tie
// with the best within the table's step ranges. 22 trials (23%) at 68 GiB since the search runs
// a moe-recomputing policy before it settles (optimistic about a label no trial has run). At 46
// GiB 0.908 (without the further runs the bench serves its re-measures) since the predictions
// charge each label what the search's pairs measure: on this learned-routing table the frontier
// the search reported before stood on lucky draws (1.122 of the pooled hypervolume, 0.797 with
// its policies at their pooled figures; now 0.839 and 0.939 in the bench: docs/results.md).
TEST(PlannerOnH200Measurements, MlaMoe16AtThreeBudgets) {
  for (double gib : {46.0, 58.0, 68.0}) {
    SCOPED_TRACE(gib);
    const replay::Outcome o = Evaluate("mla-moe16", "", Objective::kFrontier, gib);
    ExpectEfficient(o, 0.23, gib < 50 ? 0.90 : 0.96);
    EXPECT_GE(o.recommendation_throughput_ratio, gib < 60 ? 0.97 : 0.86);
  }
}

// The second run of that table (2026-12-03) measured every policy adaptively (until the median's
// 90% interval was within 2%, or 20 steps). 72 of its trials never settled within the 8 warm-up
// steps and their steps kept falling as the learned routing changed (the last five of 20 a
// median 13% under the first five; not so with forced balancing), so only 9 of 96 reached the
// target (median half-width 4.5%): docs/results.md. Held to the goals' hypervolume at
// 58 and 68 GiB; at 46 GiB the search stops before the moe-recomputing class and full:uniform:2
// (42.1 and 43.6 GiB, both draws luckier than their equals), 0.929 of the pooled hypervolume.
// 68 GiB took 25 of 96 trials, one over the goal's quarter, since the block family's end is the
// mean of its two draws (full:block:15 is then worth a trial); 24 since the tie band is the
// median's interval where a trial has one (search/noise.h RelativeNoise), and the search then
// settles on full:block:2, 0.956 of the best fitting (selective:[moe_act,layernorm,mla_up_proj],
// which it does not measure): on this table, whose steps drift with the router's learning, two
// memory-identical policies measure a median 11% apart. Since the predictions charge each label
// what the search's pairs measure, 68 GiB takes 26 trials (27.1%) and recommends
// selective:[moe_act,layernorm,mla_up_proj], the best fitting (1.000).
TEST(PlannerOnH200Measurements, MlaMoe16SecondRunMeasuredAdaptively) {
  for (double gib : {46.0, 58.0, 68.0}) {
    SCOPED_TRACE(gib);
    const replay::Outcome o = Evaluate("mla-moe16", "-r2", Objective::kFrontier, gib);
    ExpectEfficient(o, gib < 60 ? 0.25 : 0.28, gib < 50 ? 0.92 : 0.95);
    EXPECT_GE(o.recommendation_throughput_ratio, gib < 60 ? 0.97 : 0.99);
  }
}

// The same model with model.moe_router_force_load_balancing on, measured twice on fresh machine
// starts (r3, r4; docs/results.md): 95 of 96 trials met the 2% target in each. Routing leaves
// every allocated peak where it was, to the byte, in both runs. Replayed, r4 meets the goals at
// all three budgets. At 46 GiB both runs met them only once the frontier search was optimistic
// about labels no trial has run (0.930 and 0.869 of the pooled hypervolume before, 0.991 and
// 0.961 after): the step-cost model charges `moe` 13.2% of the step where r3 measures 8.7%, and
// believed, it kept every moe-recomputing policy (the low-memory end of the frontier) unmeasured.
// r3's recommendation at 58 GiB was 0.958 of the best fitting while the tie band was a trial's
// whole step range (r3's long noisy trials span 5-7%): selective:[core_attn], 4.2% slower than
// full:block:7 (r4: 6%), tied with it and replays less; 1.000 with the band from the median's
// interval (search/noise.h RelativeNoise). At 68 GiB 0.961: r3 measures the best fitting
// 4% ahead of the policy the search recommends, r4 1.1% (docs/results.md). Held where they are,
// so a change that loses ground on these tables shows. r3 at 68 GiB takes 27 trials (28.1%)
// since the predictions charge each label what the search's pairs measure (20 before): the
// shared experts charged a fraction of the model's charge, it measures four more policies with
// them near the budget, none of which moves the frontier or the recommendation.
TEST(PlannerOnH200Measurements, MlaMoe16WithForcedBalancingTwice) {
  auto r3 = spec::LoadReplayTableFile(std::string(REMAT_SOURCE_DIR) +
                                      "/docs/results/h200-mla-moe16-exhaustive-table-r3.json");
  auto r4 = spec::LoadReplayTableFile(std::string(REMAT_SOURCE_DIR) +
                                      "/docs/results/h200-mla-moe16-exhaustive-table-r4.json");
  ASSERT_TRUE(r3.ok() && r4.ok());
  ASSERT_EQ(r3->size(), 96u);
  ASSERT_EQ(r4->size(), 96u);
  for (const auto& [policy, entry] : *r3) {
    ASSERT_EQ(r4->count(policy), 1u) << policy;
    EXPECT_EQ(r4->at(policy).result.PeakAllocatedBytes(), entry.result.PeakAllocatedBytes())
        << policy;
  }
  for (double gib : {46.0, 58.0, 68.0}) {
    SCOPED_TRACE(gib);
    const replay::Outcome o3 = Evaluate("mla-moe16", "-r3", Objective::kFrontier, gib);
    ExpectEfficient(o3, gib < 60 ? 0.25 : 0.29, 0.95);
    EXPECT_GE(o3.recommendation_throughput_ratio, gib < 60 ? 0.97 : 0.95);
    const replay::Outcome o4 = Evaluate("mla-moe16", "-r4", Objective::kFrontier, gib);
    ExpectEfficient(o4, 0.25, 0.95);
    EXPECT_GE(o4.recommendation_throughput_ratio, 0.97);
  }
}

// A fifth run of that table with forced balancing (2026-12-04), and a second run of every
// policy on the same machine right after it (docs/results/h200-mla-moe16-r5-redraws-1.json), so
// the replayed re-measure round is served what the GPU measured again, as a search on that
// machine would have been. Same peaks as r3 to the byte; one policy's two runs differ by a
// median 2.0% (4.9% at the 90th percentile). At 46 GiB two lucky full:block draws (block:14
// 4.5% faster than its second run) settled the search before any `moe` policy; their
// re-measures lower the frontier and the search resumes for the moe class (0.900 of the pooled
// hypervolume without resuming, 0.980 with three trials more). Since the predictions charge each
// label what the search's own pairs of trials measure (search/predict.h), the shared experts'
// replay (0.3 of its FLOPs' share here) no longer keeps the policies with it unmeasured and the
// recorded table needs no resume (0.987 of the pooled hypervolume with its frontier's policies
// at their pooled figures, 0.911 before); the resume is still what some deals of the table need
// (held below). At 68 GiB the recommendation is 0.967 of the best fitting: the exhaustive table's
// own recommendation is the same 0.967 (the tie rule on one draw per policy), held there.
TEST(PlannerOnH200Measurements, MlaMoe16FifthRunWithItsSecondRuns) {
  const replay::Draws draws = SecondRuns("mla-moe16", "-r5", 96);
  for (double gib : {46.0, 58.0, 68.0}) {
    SCOPED_TRACE(gib);
    const replay::Outcome o = Evaluate("mla-moe16", "-r5", Objective::kFrontier, gib, draws);
    ExpectEfficient(o, 0.25, 0.95);
    EXPECT_GE(o.recommendation_throughput_ratio, gib < 60 ? 0.97 : 0.96);
    EXPECT_EQ(o.remeasures_without_draw, 0u);
    EXPECT_GE(o.delivered_hypervolume_ratio, gib < 60 ? 0.95 : 0.97);
  }
  // Deals of the table at 46 GiB (each policy's figure one of its two runs) where a lucky draw
  // settles the search early: the re-measures' pooled runs open the gap and it resumes.
  const MeasuredTable m = Load("mla-moe16", "-r5", 46);
  int resumed = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    const replay::Deal deal = replay::Redeal(m.table, draws, seed);
    const replay::Outcome o = replay::Replay(m.spec, deal.table, deal.draws);
    bool any = false;
    for (const std::string& p : o.order)
      any |= p.find("(after the re-measures)") != std::string::npos;
    resumed += any;
  }
  std::printf("mla-moe16-r5 @46: the search resumed after its re-measures in %d of 20 deals\n",
              resumed);
  EXPECT_GE(resumed, 1);
}

// A third dense table and a fifth MoE one (2026-12-04), each with a second run of every policy
// on the machine that measured it (docs/results.md). Dense: the two runs within 0.5% of each
// other, and a second machine's whole table and second runs within 0.9% of the first's; the
// frontier is found (0.997 of the pooled hypervolume) but with 10 of its 24 policies: the plan is
// five of them (the control, out of memory at 80 GiB; core_attn; mlp, over the budget;
// full:block:2 and uniform:1), and with those five the best sixth trial of all (full:block:3)
// reaches 0.927, so the quarter (six trials) is out of reach for a search that walks the plan
// (any six trials chosen knowing the table: 0.978).
// MoE with forced balancing: every trial met the 2% target in both passes, yet the second pass
// ran a median 5.2% faster than the first (up to 15% on moe-recomputing policies); the replay
// meets the goals (11 of 44 trials, 0.955, 0.988).
TEST(PlannerOnH200Measurements, DenseThirdAndMoeFifthRunsWithTheirSecondRuns) {
  const replay::Outcome dense =
      Evaluate("dense", "-r3", Objective::kFrontier, 0, SecondRuns("dense", "-r3", 24));
  ExpectEfficient(dense, 0.42, 0.99);
  EXPECT_GE(dense.recommendation_throughput_ratio, 0.97);
  EXPECT_EQ(dense.plan_trials, 5u);
  EXPECT_EQ(dense.goal_trials, 6u);
  EXPECT_LT(dense.best_pooled_at_goal_after_plan, replay::kTableHypervolumeGoal);
  EXPECT_GE(dense.best_pooled_at_goal, replay::kTableHypervolumeGoal);
  const replay::Outcome moe =
      Evaluate("moe", "-r5", Objective::kFrontier, 0, SecondRuns("moe", "-r5", 44));
  // Not ExpectEfficient: the pooled reference takes in the faster second pass, so the pooled
  // ratio sits under the single-draw one by more than its 0.02.
  EXPECT_LE(moe.guided_trials, 11u);
  EXPECT_GE(moe.pooled_hypervolume_ratio, 0.95);
  EXPECT_GE(moe.recommendation_throughput_ratio, 0.97);
  EXPECT_EQ(moe.remeasures_without_draw, 0u);
}

// The tables with a second run of every policy dealt again 20 times (replay::Redeal: each
// policy's table figure one of its two runs): in how many deals the frontier search meets each
// goal, held where it is (remat-search-bench prints 50 deals: docs/results.md); the hypervolume
// both by the search's own measurements and by its frontier's policies at their pooled figures
// (what it delivers). One recorded table is one draw of its noise; a change that helps it by luck
// and loses the others shows here.
TEST(PlannerOnH200Measurements, GoalsOverDealsOfTheTablesWithSecondRuns) {
  struct Case {
    const char* name;
    const char* run;
    size_t policies;
    double gib;
    // Deals of 20 that meet each goal, at least.
    int trials, hypervolume, delivered, recommendation;
  };
  const Case cases[] = {{"dense", "-r3", 24, 0, 0, 20, 20, 20},
                        {"moe", "-r5", 44, 0, 13, 16, 12, 19},
                        {"mla-moe16", "-r5", 96, 46, 20, 11, 9, 20},
                        {"mla-moe16", "-r5", 96, 58, 20, 18, 18, 20},
                        {"mla-moe16", "-r5", 96, 68, 20, 19, 19, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.name) + c.run + " @" + std::to_string(c.gib));
    const MeasuredTable m = Load(c.name, c.run, c.gib);
    const replay::Draws draws = SecondRuns(c.name, c.run, c.policies);
    ASSERT_TRUE(replay::HasFurtherRunOfEach(m.table, draws));
    int trials = 0, hypervolume = 0, delivered = 0, recommendation = 0;
    for (uint64_t seed = 1; seed <= 20; ++seed) {
      const replay::Deal deal = replay::Redeal(m.table, draws, seed);
      const replay::Outcome o = replay::Replay(m.spec, deal.table, deal.draws);
      trials += o.guided_trials <= replay::GoalShare(c.policies) * c.policies;
      hypervolume += o.pooled_hypervolume_ratio >= replay::kTableHypervolumeGoal;
      delivered += o.delivered_hypervolume_ratio >= replay::kTableHypervolumeGoal;
      recommendation += o.recommendation_throughput_ratio >= replay::kRecommendationGoal;
    }
    std::printf(
        "%s%s @%.0f: 20 deals meet the trials %d, hypervolume %d (delivered %d), recommendation "
        "%d\n",
        c.name, c.run, c.gib, trials, hypervolume, delivered, recommendation);
    EXPECT_GE(trials, c.trials);
    EXPECT_GE(hypervolume, c.hypervolume);
    EXPECT_GE(delivered, c.delivered);
    EXPECT_GE(recommendation, c.recommendation);
  }
}

// The mla-moe16 table's further runs (docs/results/h200-mla-moe16-redraws-N.json, written by
// bench/search/redraws.py from the trials' JSON lines): 24 policies measured three times. Each
// redraw is another measurement of a policy of the table: the same allocated peak to the byte
// (docs/results.md), other steps; so a replayed re-measure is served what a GPU measured again.
TEST(PlannerOnH200Measurements, MlaMoe16RedrawsAreOtherRunsOfTheTablesPolicies) {
  auto table = spec::LoadReplayTableFile(std::string(REMAT_SOURCE_DIR) +
                                         "/docs/results/h200-mla-moe16-exhaustive-table.json");
  ASSERT_TRUE(table.ok()) << table.status().message();
  for (int n : {1, 2}) {
    SCOPED_TRACE(n);
    auto draws = spec::LoadReplayTableFile(std::string(REMAT_SOURCE_DIR) +
                                           "/docs/results/h200-mla-moe16-redraws-" +
                                           std::to_string(n) + ".json");
    ASSERT_TRUE(draws.ok()) << draws.status().message();
    EXPECT_EQ(draws->size(), 24u);
    for (const auto& [policy, entry] : *draws) {
      ASSERT_EQ(table->count(policy), 1u) << policy;
      const TrialResult& first = table->at(policy).result;
      const TrialResult& again = entry.result;
      EXPECT_EQ(again.PeakAllocatedBytes(), first.PeakAllocatedBytes()) << policy;
      ASSERT_EQ(again.ranks.size(), 1u);
      EXPECT_EQ(again.ranks[0].step_times_s.size(), 5u) << policy;
      EXPECT_NE(again.ranks[0].step_times_s, first.ranks[0].step_times_s) << policy;
    }
  }
}

// Megatron's code says the members of an equivalence class keep the same tensors
// (search/equivalence.h); every H200 table agrees (the forced-routing MLA + MoE tables and the
// held-out MLA one too, measured after this test was written): each member peaks where its
// representative does, to the byte, or both run out of memory.
TEST(PlannerOnH200Measurements, ClassMembersPeakExactlyWhereTheirRepresentativeDoes) {
  int compared = 0;
  for (const char* name : {"dense", "moe", "mla", "mla-moe16"}) {
    for (const char* run : {"", "-r2", "-r3", "-r4", "-r5"}) {
      if (!std::filesystem::exists(std::string(REMAT_SOURCE_DIR) + "/docs/results/h200-" + name +
                                   "-exhaustive-table" + run + ".json")) {
        continue;
      }
      auto spec = spec::LoadSpecFile(std::string(REMAT_SOURCE_DIR) + "/examples/replay/h200-" +
                                     name + ".yaml");
      auto table = spec::LoadReplayTableFile(std::string(REMAT_SOURCE_DIR) + "/docs/results/h200-" +
                                             name + "-exhaustive-table" + run + ".json");
      ASSERT_TRUE(spec.ok() && table.ok()) << name << run;
      for (const auto& c : EquivalenceClasses(*spec)) {
        const auto rep = table->find(c.representative.ToString());
        ASSERT_NE(rep, table->end()) << c.representative.ToString();
        for (const auto& o : c.others) {
          const auto m = table->find(o.representative.ToString());
          ASSERT_NE(m, table->end()) << o.representative.ToString();
          const bool ok = rep->second.result.status == TrialStatus::kOk;
          EXPECT_EQ(ok, m->second.result.status == TrialStatus::kOk) << o.representative.ToString();
          if (ok) {
            EXPECT_EQ(rep->second.result.PeakAllocatedBytes(),
                      m->second.result.PeakAllocatedBytes())
                << name << run << " " << o.representative.ToString();
            EXPECT_EQ(rep->second.result.PeakReservedBytes(), m->second.result.PeakReservedBytes())
                << name << run << " " << o.representative.ToString();
          }
          ++compared;
        }
      }
    }
  }
  EXPECT_GE(compared, 268);  // 16 tables: 268 members beside their representatives
}

// The recommend objective: a handful of trials. Where the exhaustive recommendation is a policy
// measured faster than the model allows (full:block:2 on dense, where the unfused core_attn
// replay is slower than its FLOPs say; the noisy MoE and MLA first runs), the guide's rule wins:
// full recompute is not tried while a selective policy fits, and an untried policy is not chased
// unless it is predicted to beat the recommendation by more than the noise.
TEST(PlannerOnH200Measurements, RecommendObjective) {
  for (const char* name : {"dense", "moe", "mla"}) {
    for (const char* run : {"", "-r2", "-r3"}) {
      if (std::string(run) == "-r3" && std::string(name) != "moe") continue;  // MoE only
      const replay::Outcome o = Evaluate(name, run, Objective::kRecommend);
      EXPECT_LE(o.guided_trials, 3u) << name << run;
      ASSERT_TRUE(o.guided.has_value()) << name << run;
      EXPECT_EQ(o.guided->choice.policy.ToString(), "selective:[core_attn]") << name << run;
    }
  }
}

}  // namespace
}  // namespace remat::search
