// The guided strategy on large surfaces (step 4): 70B-class and other models of 76-168
// valid policies, "measured" by the synthetic tables of tests/search/replay_surfaces.h (the
// memory/FLOP model with realistic errors, allocator caching and step-time noise), several noise
// seeds each. `remat-search-bench` prints the same figures for docs/results.md.
//
// Goals: frontier objective, at least 0.97 of the exhaustive hypervolume with at most 15% of its
// trials on 150+ policies and 25% on 60-150; recommend objective, the exhaustive recommendation
// (within noise) with at most 10% of its trials.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <set>

#include "tests/search/replay_surfaces.h"

namespace remat::search {
namespace {

constexpr int kSeeds = 4;

struct Figures {
  double worst_share = 0, mean_share = 0, worst_hv = 1, mean_hv = 0;
  int matches = 0;
  size_t policies = 0;
};

Figures Replayed(const std::string& name, Objective objective) {
  auto surface = replay::MakeSurface(name);
  EXPECT_TRUE(surface.has_value()) << name;
  Figures f;
  if (!surface) return f;
  surface->spec.search.objective = objective;
  surface->spec.search.max_trials = 1000;
  for (int seed = 1; seed <= kSeeds; ++seed) {
    const auto table =
        replay::SyntheticTable(surface->spec, surface->step_time_s, surface->noise, seed);
    const replay::Outcome o = replay::Replay(surface->spec, table);
    std::printf("[%s] %s\n", Name(objective),
                replay::Describe(name + " seed " + std::to_string(seed), o).c_str());
    const double share = static_cast<double>(o.guided_trials) / o.exhaustive_trials;
    f.policies = o.exhaustive_trials;
    f.worst_share = std::max(f.worst_share, share);
    f.mean_share += share / kSeeds;
    f.worst_hv = std::min(f.worst_hv, o.hypervolume_ratio);
    f.mean_hv += o.hypervolume_ratio / kSeeds;
    f.matches += o.recommendation_matches ? 1 : 0;
  }
  return f;
}

TEST(PlannerOnLargeSurfaces, SyntheticTablesAreLargeAndDeterministic) {
  auto s = replay::MakeSurface("llama70b-unfused");
  ASSERT_TRUE(s.has_value());
  const auto a = replay::SyntheticTable(s->spec, s->step_time_s, s->noise, 7);
  const auto b = replay::SyntheticTable(s->spec, s->step_time_s, s->noise, 7);
  EXPECT_GE(a.size(), 150u);
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, r] : a) {
    EXPECT_EQ(r.step_time_s, b.at(k).step_time_s) << k;
    EXPECT_EQ(r.PeakReservedBytes(), b.at(k).PeakReservedBytes()) << k;
  }
  EXPECT_FALSE(replay::MakeSurface("no-such-surface").has_value());
}

// 80 layers, unfused attention: 168 policies.
TEST(PlannerOnLargeSurfaces, Llama70bUnfusedFrontier) {
  const Figures f = Replayed("llama70b-unfused", Objective::kFrontier);
  EXPECT_GE(f.policies, 150u);
  EXPECT_LE(f.worst_share, 0.15);
  EXPECT_GE(f.worst_hv, 0.97);
}

// 80 layers, flash attention: the control fits, and the frontier below it is the full:block
// family, whose reserved peaks fall on a 1 GiB grid. The goal (0.97 on average) is met since the
// hypervolume thresholds moved (search/planner.cc, 2026-12-02 r2: 0.965 -> 0.972 mean, 12.6% ->
// 14.0% of the policies), with little room: the worst seed is 0.967. What is still missed
// (docs/results.md): the smallest N of full:block:N on each 1 GiB step, predicted from
// grid-rounded neighbours 0.2-0.8 GiB too high.
TEST(PlannerOnLargeSurfaces, Llama70bFlashFrontier) {
  const Figures f = Replayed("llama70b-flash", Objective::kFrontier);
  EXPECT_GE(f.policies, 150u);
  EXPECT_LE(f.worst_share, 0.15);
  EXPECT_GE(f.mean_hv, 0.97);
  EXPECT_GE(f.worst_hv, 0.96);
}

// 48 layers: 104 policies.
TEST(PlannerOnLargeSurfaces, Dense48Frontier) {
  const Figures f = Replayed("dense48", Objective::kFrontier);
  EXPECT_GE(f.policies, 60u);
  EXPECT_LE(f.worst_share, 0.25);
  EXPECT_GE(f.worst_hv, 0.97);
}

// 32 MoE layers, 80 policies, MoE step-time noise (3% per step and one step in twenty 30% slow):
// the exhaustive frontier is made of lucky measurements that no prediction can find, so the
// goal of 0.97 is missed (docs/results.md); the bounds keep it from falling further. Seed 2's
// 0.879 became 0.845 when the model (and with it the surface) counted flash's rotated q/k and
// RoPE's cos/sin tables (2026-12-02).
TEST(PlannerOnLargeSurfaces, MixtralLikeFrontier) {
  const Figures f = Replayed("mixtral-like", Objective::kFrontier);
  EXPECT_GE(f.policies, 60u);
  EXPECT_LE(f.worst_share, 0.25);
  EXPECT_GE(f.worst_hv, 0.84);
}

TEST(PlannerOnLargeSurfaces, RecommendObjective) {
  for (const std::string& name : replay::SurfaceNames()) {
    const Figures f = Replayed(name, Objective::kRecommend);
    EXPECT_LE(f.worst_share, 0.10) << name;
    EXPECT_EQ(f.matches, kSeeds) << name;
  }
}

}  // namespace
}  // namespace remat::search

namespace remat::search {
namespace {

// The noise-aware stop (search/planner.h): with every trial's interval known to the target, the
// search ends no later than with the same medians taken as exact, and the table measured
// adaptively (search/noise.h) puts more steps where they are noisy.
TEST(PlannerOnLargeSurfaces, KnownNoiseStopsNoLaterThanExactFigures) {
  auto surface = replay::MakeSurface("mixtral-like");
  ASSERT_TRUE(surface.has_value());
  surface->spec.search.max_trials = 1000;
  const auto table = replay::SyntheticTable(surface->spec, surface->step_time_s, surface->noise, 1);
  size_t steps = 0, ok = 0, met = 0;
  replay::Table exact = table;
  for (auto& [k, r] : exact) {
    if (r.status != TrialStatus::kOk) continue;
    ++ok;
    steps += r.ranks[0].step_times_s.size();
    EXPECT_GE(r.ranks[0].step_times_s.size(), 5u) << k;
    EXPECT_LE(r.ranks[0].step_times_s.size(), 20u) << k;
    r.step_time_spread_s = 0;
    r.ranks[0].step_times_s.clear();
  }
  EXPECT_GT(steps, 5 * ok);  // 3% jitter and outliers: some trials measure past the minimum
  const replay::Outcome noisy = replay::Replay(surface->spec, table);
  const replay::Outcome plain = replay::Replay(surface->spec, exact);
  for (const auto& [k, r] : table) {
    met += r.status == TrialStatus::kOk && r.ranks[0].step_times_s.size() < 20;
  }
  EXPECT_GT(met, 0u);
  EXPECT_LE(noisy.guided_trials, plain.guided_trials);
  EXPECT_NE(noisy.notes.find("memory predictions"), std::string::npos) << noisy.notes;
}

// Another run of a synthetic table (a re-measure's draw) keeps every policy's memory and status
// and draws its steps afresh; draw 0 is the table itself.
TEST(PlannerOnLargeSurfaces, SyntheticDrawsKeepMemoryAndRedrawSteps) {
  auto surface = replay::MakeSurface("dense48");
  ASSERT_TRUE(surface.has_value());
  const auto& spec = surface->spec;
  const auto table = replay::SyntheticTable(spec, surface->step_time_s, surface->noise, 3);
  const auto same = replay::SyntheticTable(spec, surface->step_time_s, surface->noise, 3, 0);
  const auto draws = replay::SyntheticDraws(spec, surface->step_time_s, surface->noise, 3, 2);
  size_t ok = 0, redrawn = 0;
  for (const auto& [policy, r] : table) {
    EXPECT_EQ(same.at(policy).step_time_s, r.step_time_s) << policy;
    if (r.status != TrialStatus::kOk) {
      EXPECT_EQ(draws.count(policy), 0u) << policy;
      continue;
    }
    ++ok;
    ASSERT_EQ(draws.at(policy).size(), 2u) << policy;
    for (const TrialResult& d : draws.at(policy)) {
      EXPECT_EQ(d.PeakReservedBytes(), r.PeakReservedBytes()) << policy;
      EXPECT_EQ(d.PeakAllocatedBytes(), r.PeakAllocatedBytes()) << policy;
      if (d.ranks[0].step_times_s != r.ranks[0].step_times_s) ++redrawn;
    }
    EXPECT_NE(draws.at(policy)[0].ranks[0].step_times_s, draws.at(policy)[1].ranks[0].step_times_s)
        << policy;
  }
  EXPECT_GT(ok, 50u);
  EXPECT_EQ(redrawn, 2 * ok);
}

// A table dealt again from its runs: each policy keeps exactly its recorded runs (the table's
// figure is one of them, the draws the others), seed 0 is the table as recorded, and the deals
// differ from policy to policy (every run of a two-run policy is the table's figure in some deal,
// and no deal swaps all policies or none).
TEST(PlannerOnLargeSurfaces, RedealKeepsEachPolicysRuns) {
  auto surface = replay::MakeSurface("mixtral-like");
  ASSERT_TRUE(surface.has_value());
  const auto& spec = surface->spec;
  const auto table = replay::SyntheticTable(spec, surface->step_time_s, surface->noise, 4);
  const auto draws = replay::SyntheticDraws(spec, surface->step_time_s, surface->noise, 4, 1);
  ASSERT_TRUE(replay::HasFurtherRunOfEach(table, draws));
  auto runs_of = [](const replay::Table& t, const replay::Draws& d, const std::string& policy) {
    std::vector<double> out{t.at(policy).step_time_s};
    if (auto it = d.find(policy); it != d.end()) {
      for (const TrialResult& r : it->second) out.push_back(r.step_time_s);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  std::map<std::string, std::set<double>> seen;  // each two-run policy's table figures
  for (uint64_t seed = 0; seed <= 20; ++seed) {
    const replay::Deal deal = replay::Redeal(table, draws, seed);
    ASSERT_EQ(deal.table.size(), table.size());
    size_t swapped = 0, two_runs = 0;
    for (const auto& [policy, r] : table) {
      EXPECT_EQ(runs_of(deal.table, deal.draws, policy), runs_of(table, draws, policy)) << policy;
      EXPECT_EQ(deal.table.at(policy).PeakReservedBytes(), r.PeakReservedBytes()) << policy;
      if (r.status != TrialStatus::kOk) continue;
      ++two_runs;
      swapped += deal.table.at(policy).step_time_s != r.step_time_s;
      seen[policy].insert(deal.table.at(policy).step_time_s);
    }
    if (seed == 0) {
      EXPECT_EQ(swapped, 0u);
    } else {
      EXPECT_GT(swapped, 0u) << seed;
      EXPECT_LT(swapped, two_runs) << seed;
    }
  }
  for (const auto& [policy, figures] : seen) EXPECT_EQ(figures.size(), 2u) << policy;
  replay::Draws missing = draws;
  missing.erase(missing.begin());
  EXPECT_FALSE(replay::HasFurtherRunOfEach(table, missing));
}

// The replay runs the coordinator's re-measure round and serves each re-measure a different
// recorded measurement: with a draw for every policy, every policy the round names is measured
// again (with the policies' draws, the same search names the same policies); without draws only
// those with an unmeasured class member can be, and the others are counted, not served the
// table's figure again.
TEST(PlannerOnLargeSurfaces, ReplayedRemeasuresAreServedOtherDraws) {
  for (const std::string name : {"llama70b-flash", "mixtral-like"}) {
    SCOPED_TRACE(name);
    auto surface = replay::MakeSurface(name);
    ASSERT_TRUE(surface.has_value());
    surface->spec.search.max_trials = 1000;
    const auto& spec = surface->spec;
    const auto table = replay::SyntheticTable(spec, surface->step_time_s, surface->noise, 2);
    const auto draws = replay::SyntheticDraws(spec, surface->step_time_s, surface->noise, 2, 1);
    const replay::Outcome with = replay::Replay(spec, table, draws);
    const replay::Outcome without = replay::Replay(spec, table);
    EXPECT_GT(with.remeasures, 0u);
    EXPECT_EQ(with.remeasures_without_draw, 0u);
    EXPECT_EQ(with.remeasures, without.remeasures + without.remeasures_without_draw);
    EXPECT_EQ(with.guided_trials, without.guided_trials);  // the strategy's own trials
    size_t marked = 0;
    for (const std::string& p : with.order) marked += p.find("(re-measure: ") != std::string::npos;
    EXPECT_EQ(marked, with.remeasures);
  }
}

// The bench's bound (the most any k trials of a table reach, alone and beside the plan's points)
// against every k-subset of small random frontiers, and the figures a replay reports beside it.
TEST(PlannerOnLargeSurfaces, BestHypervolumeOfIsTheBestSubset) {
  std::mt19937_64 rng(7);
  const uint64_t budget = 100;
  for (int round = 0; round < 50; ++round) {
    const size_t n = 1 + rng() % 8;
    std::vector<FrontierPoint> frontier;
    uint64_t memory = rng() % 10;
    double tokens = 10 + rng() % 10;
    for (size_t i = 0; i < n; ++i) {  // a frontier: memory and throughput rise together
      frontier.push_back(
          {Policy::Full(RecomputeMethod::kBlock, static_cast<int>(i + 1)), memory, tokens});
      memory += 1 + rng() % 15;
      tokens += 1 + rng() % 10;
    }
    std::shuffle(frontier.begin(), frontier.end(), rng);
    // Forced points anywhere: on or off the frontier, dominated, over the budget, under t_ref.
    std::vector<FrontierPoint> forced;
    for (size_t i = 0, f = rng() % 4; i < f; ++i) {
      forced.push_back({Policy::None(), rng() % 120, static_cast<double>(rng() % 60)});
    }
    for (size_t k = 0; k <= n + 1; ++k) {
      double best = 0, best_forced = 0;
      for (uint32_t mask = 0; mask < (1u << n); ++mask) {
        if (static_cast<size_t>(__builtin_popcount(mask)) > k) continue;
        std::vector<FrontierPoint> chosen;
        for (size_t i = 0; i < n; ++i) {
          if (mask & (1u << i)) chosen.push_back(frontier[i]);
        }
        best = std::max(best, Hypervolume(chosen, budget, 5.0));
        chosen.insert(chosen.end(), forced.begin(), forced.end());
        best_forced = std::max(best_forced, Hypervolume(chosen, budget, 5.0));
      }
      EXPECT_NEAR(replay::BestHypervolumeOf(frontier, k, budget, 5.0), best, 1e-9 * best)
          << "round " << round << ", k " << k;
      EXPECT_NEAR(replay::BestHypervolumeOf(frontier, k, budget, 5.0, forced), best_forced,
                  1e-9 * best_forced)
          << "round " << round << ", k " << k << ", " << forced.size() << " forced";
    }
  }
  auto surface = replay::MakeSurface("mixtral-like");
  ASSERT_TRUE(surface.has_value());
  surface->spec.search.max_trials = 1000;
  const auto table = replay::SyntheticTable(surface->spec, surface->step_time_s, surface->noise, 1);
  const replay::Outcome o = replay::Replay(surface->spec, table);
  EXPECT_EQ(o.goal_trials, o.exhaustive_trials / 4);  // 80 policies: a quarter
  EXPECT_LE(o.best_pooled_at_goal, 1.0 + 1e-12);
  EXPECT_GT(o.plan_trials, 0u);
  EXPECT_LE(o.best_pooled_at_goal_after_plan, o.best_pooled_at_goal + 1e-12);
  ASSERT_EQ(o.pooled_by_trials.size(), o.order.size());
  EXPECT_DOUBLE_EQ(o.pooled_by_trials.back(), o.pooled_hypervolume_ratio);
  EXPECT_GT(o.exhaustive_throughput_ratio, 0.0);
  // The guided frontier's policies at their pooled figures are points of the pooled exhaustive
  // table: never more than its hypervolume, however lucky the guided draws (seeds 1-5 of this
  // noisy surface: the pooled ratio runs over 1 on some of them, measured on lucky draws).
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    const auto t =
        replay::SyntheticTable(surface->spec, surface->step_time_s, surface->noise, seed);
    const auto d =
        replay::SyntheticDraws(surface->spec, surface->step_time_s, surface->noise, seed, 1);
    const replay::Outcome r = replay::Replay(surface->spec, t, d);
    EXPECT_GT(r.delivered_hypervolume_ratio, 0.5) << seed;
    EXPECT_LE(r.delivered_hypervolume_ratio, 1.0 + 1e-12) << seed;
  }
}

}  // namespace
}  // namespace remat::search
