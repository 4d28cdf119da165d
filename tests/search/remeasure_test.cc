// Near-ties measured twice before the recommendation (search/remeasure.h): which policies, how
// two runs combine, and the bounds (once per policy, one round, never on replay).
#include "search/remeasure.h"

#include <gtest/gtest.h>

#include "search/frontier.h"
#include "search/units.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

// One ok rank with these measured steps (median = step time) and this reserved peak.
TrialResult Measure(const SearchSpec& spec, const std::string& policy, double gib,
                    std::vector<double> steps) {
  TrialResult r;
  r.policy = *ParsePolicy(policy);
  r.status = TrialStatus::kOk;
  RankResult rank;
  rank.peak_allocated_bytes = rank.peak_reserved_bytes = GibToBytes(gib);
  rank.step_times_s = steps;
  rank.step_time_s = MedianStepTime(steps);
  r.ranks = {rank};
  r.step_time_s = rank.step_time_s;
  const auto [lo, hi] = std::minmax_element(steps.begin(), steps.end());
  r.step_time_spread_s = *hi - *lo;
  r.tokens_per_s = TokensPerSecond(spec, r.step_time_s);
  r.loss = 2.0;
  return r;
}

SearchSpec Spec() {
  SearchSpec spec = testing::DenseSpec();
  spec.search.memory_budget_gib = 80;
  return spec;
}

std::vector<std::string> Policies(const std::vector<Remeasure>& v) {
  std::vector<std::string> out;
  for (const auto& r : v) out.push_back(r.policy.ToString());
  return out;
}

TEST(Remeasure, NearTiesOnTheFrontierAreNamed) {
  const SearchSpec spec = Spec();
  const std::vector<TrialResult> results = {
      Measure(spec, "selective:[]", 70, {0.500, 0.500, 0.500}),
      // 0.6% slower than the control, with less memory: on the frontier, within 1% of it.
      Measure(spec, "selective:[core_attn]", 50, {0.503, 0.503, 0.503}),
      // 10% slower: on the frontier, but clear of the others.
      Measure(spec, "selective:[mlp]", 40, {0.55, 0.55, 0.55}),
      // Far slower, least memory: on the frontier, alone.
      Measure(spec, "full:uniform:1", 30, {0.70, 0.70, 0.70}),
  };
  const std::vector<Remeasure> again = NearTiesToRemeasure(spec, results);
  EXPECT_EQ(Policies(again), (std::vector<std::string>{"selective:[core_attn]", "selective:[]"}));
  EXPECT_NE(again[0].reason.find("tied with the best (selective:[]) for the recommendation, 0.6%"),
            std::string::npos)
      << again[0].reason;
}

TEST(Remeasure, FrontierNearTiesAwayFromTheBestToo) {
  const SearchSpec spec = Spec();
  // The two low-memory points are 0.5% apart, far below the control: not the recommendation's
  // business, but the frontier's.
  const std::vector<TrialResult> results = {
      Measure(spec, "selective:[]", 70, {0.500, 0.500, 0.500}),
      Measure(spec, "full:block:1", 35, {0.700, 0.700, 0.700}),
      Measure(spec, "full:uniform:1", 30, {0.7035, 0.7035, 0.7035}),
  };
  const std::vector<Remeasure> again = NearTiesToRemeasure(spec, results);
  EXPECT_EQ(Policies(again), (std::vector<std::string>{"full:uniform:1", "full:block:1"}));
  EXPECT_NE(again[0].reason.find("frontier point within 0.5% of full:block:1"), std::string::npos)
      << again[0].reason;
}

TEST(Remeasure, TheRoundIsBoundedToAQuarterOfThePolicies) {
  const SearchSpec spec = Spec();
  // Eight policies, every one within the noise of every other: only two are measured again,
  // the ones that decide the recommendation (the choice and the best).
  std::vector<TrialResult> results;
  const char* policies[] = {"selective:[]",          "selective:[core_attn]",
                            "selective:[mlp]",       "selective:[layernorm]",
                            "selective:[core_attn,mlp]", "full:uniform:1",
                            "full:block:1",          "full:block:2"};
  double gib = 70;
  for (const char* p : policies) {
    results.push_back(Measure(spec, p, gib, {0.50, 0.53, 0.56}));
    gib -= 5;
  }
  results[3] = Measure(spec, "selective:[layernorm]", 55, {0.49, 0.52, 0.55});  // the best
  const std::vector<Remeasure> again = NearTiesToRemeasure(spec, results);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(Policies(again),
            (std::vector<std::string>{"selective:[layernorm]", "selective:[]"}));
}

TEST(Remeasure, NoisyTrialsWidenTheBand) {
  const SearchSpec spec = Spec();
  // 4% apart: outside 1%, but core_attn's own steps spread by 8%: within its noise.
  const std::vector<TrialResult> results = {
      Measure(spec, "selective:[]", 70, {0.50, 0.50, 0.50}),
      Measure(spec, "selective:[core_attn]", 50, {0.50, 0.52, 0.54}),
  };
  EXPECT_EQ(NearTiesToRemeasure(spec, results).size(), 2u);
  // Steady steps, 4% apart: no tie, nothing to re-measure.
  const std::vector<TrialResult> steady = {
      Measure(spec, "selective:[]", 70, {0.50, 0.50, 0.50}),
      Measure(spec, "selective:[core_attn]", 50, {0.52, 0.52, 0.52}),
  };
  EXPECT_TRUE(NearTiesToRemeasure(spec, steady).empty());
}

TEST(Remeasure, BoundedToOneRoundAndNeverOnReplay) {
  SearchSpec spec = Spec();
  std::vector<TrialResult> results = {
      Measure(spec, "selective:[]", 70, {0.500, 0.500, 0.500}),
      Measure(spec, "selective:[core_attn]", 50, {0.503, 0.503, 0.503}),
  };
  ASSERT_EQ(NearTiesToRemeasure(spec, results).size(), 2u);
  // Once any policy has two runs, the round has run: nothing more, however close.
  results.push_back(Measure(spec, "selective:[]", 70, {0.503, 0.503, 0.503}));
  EXPECT_TRUE(NearTiesToRemeasure(spec, results).empty());
  // A replay table holds one measurement per policy.
  spec.search.backend = Backend::kReplay;
  EXPECT_TRUE(NearTiesToRemeasure(spec, {results[0], results[1]}).empty());
}

TEST(Remeasure, TwoRunsArePooled) {
  const SearchSpec spec = Spec();
  const std::vector<TrialResult> results = {
      Measure(spec, "selective:[]", 70, {0.50, 0.50, 0.50}),
      Measure(spec, "selective:[core_attn]", 50, {0.49, 0.49, 0.49}),
      Measure(spec, "selective:[core_attn]", 51, {0.53, 0.52, 0.52}),
  };
  const std::vector<TrialResult> combined = CombineRemeasured(spec, results);
  ASSERT_EQ(combined.size(), 2u);
  const TrialResult& pooled = combined[1];
  EXPECT_EQ(pooled.policy.ToString(), "selective:[core_attn]");
  ASSERT_EQ(pooled.ranks.size(), 1u);
  EXPECT_EQ(pooled.ranks[0].step_times_s.size(), 6u);
  // Median of 0.49 x3, 0.52 x2, 0.53: (0.49 + 0.52) / 2.
  EXPECT_DOUBLE_EQ(pooled.step_time_s, 0.505);
  EXPECT_NEAR(pooled.step_time_spread_s, 0.04, 1e-12);
  EXPECT_DOUBLE_EQ(pooled.tokens_per_s, TokensPerSecond(spec, 0.505));
  EXPECT_EQ(pooled.PeakReservedBytes(), GibToBytes(51));  // the higher peak
  EXPECT_NE(pooled.message.find("measured 2 times"), std::string::npos) << pooled.message;
  // The recommendation sees one point per policy: the control (0.50 s) and the pooled core_attn
  // (0.505 s) are tied within the noise; the control replays nothing, so it is recommended.
  auto rec = RecommendPolicy(spec, combined);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->choice.policy.ToString(), "selective:[]");
}

TEST(Remeasure, AFailedSecondRunKeepsTheFirst) {
  const SearchSpec spec = Spec();
  TrialResult failed;
  failed.policy = *ParsePolicy("selective:[]");
  failed.status = TrialStatus::kFailed;
  const std::vector<TrialResult> combined = CombineRemeasured(
      spec, {Measure(spec, "selective:[]", 70, {0.50, 0.50, 0.50}), failed});
  ASSERT_EQ(combined.size(), 1u);
  EXPECT_EQ(combined[0].status, TrialStatus::kOk);
  EXPECT_DOUBLE_EQ(combined[0].step_time_s, 0.50);
  EXPECT_NE(combined[0].message.find("the other runs: failed"), std::string::npos)
      << combined[0].message;
}

}  // namespace
}  // namespace remat::search

namespace remat::search {
namespace {

// A backend that reports the median's interval but not the steps (step_time_spread_s unset):
// the tie band is the 1% floor, yet two candidates whose intervals overlap are measured again.
TEST(Remeasure, CandidatesWhoseIntervalsOverlapTheBestAreMeasuredAgain) {
  SearchSpec spec = Spec();
  auto with_interval = [&](const std::string& policy, double gib, double step, double half) {
    TrialResult r = Measure(spec, policy, gib, {step});
    r.ranks[0].step_times_s.clear();
    r.step_time_spread_s = 0;
    r.step_time_low_s = step - half;
    r.step_time_high_s = step + half;
    return r;
  };
  const std::vector<TrialResult> results = {
      with_interval("selective:[]", 70, 0.500, 0.020),           // the best
      with_interval("selective:[core_attn]", 50, 0.515, 0.010),  // 2.9% slower, overlapping
      with_interval("full:uniform:1", 30, 0.600, 0.010),         // far below
  };
  const auto rec = RecommendPolicy(spec, results);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->tied.size(), 1u);  // the band alone ties nothing
  const auto again = NearTiesToRemeasure(spec, results);
  EXPECT_EQ(Policies(again), (std::vector<std::string>{"selective:[core_attn]", "selective:[]"}));
  EXPECT_NE(again[0].reason.find("interval overlaps"), std::string::npos) << again[0].reason;
}

}  // namespace
}  // namespace remat::search

namespace remat::search {
namespace {

// Pooled runs are compared by how well their median is known: with enough steps for a 90%
// interval narrower than their range (10 steps: [x_(2), x_(9)]), the spread is that interval's
// width, so one slow step in either run does not widen the policy's tie band.
TEST(Remeasure, PooledSpreadIsTheMediansIntervalOnceItHasEnoughSteps) {
  const SearchSpec spec = Spec();
  const std::vector<TrialResult> results = {
      Measure(spec, "selective:[core_attn]", 50, {0.50, 0.51, 0.49, 0.50, 0.70}),
      Measure(spec, "selective:[core_attn]", 50, {0.30, 0.50, 0.51, 0.50, 0.49}),
  };
  EXPECT_NEAR(results[0].RelativeSpread(), 0.42, 1e-9);  // one run: its range (5 steps)
  const TrialResult pooled = CombineRemeasured(spec, results)[0];
  ASSERT_EQ(pooled.ranks[0].step_times_s.size(), 10u);
  EXPECT_DOUBLE_EQ(pooled.step_time_s, 0.50);
  // Sorted: 0.30 0.49 0.49 0.50 0.50 0.50 0.50 0.51 0.51 0.70; [x_(2), x_(9)] = [0.49, 0.51].
  EXPECT_NEAR(pooled.step_time_spread_s, 0.02, 1e-12);
  EXPECT_NEAR(pooled.RelativeSpread(), 0.04, 1e-9);
}

// RemeasureCandidates is NearTiesToRemeasure's choice without its guards: it names policies on
// a replay too (for a replay that holds further draws), and never one measured twice already.
TEST(Remeasure, CandidatesIgnoreTheGuardsButNotPoliciesMeasuredTwice) {
  SearchSpec spec = Spec();
  std::vector<TrialResult> results = {
      Measure(spec, "selective:[]", 70, {0.500, 0.500, 0.500}),
      Measure(spec, "selective:[core_attn]", 50, {0.503, 0.503, 0.503}),
  };
  spec.search.backend = Backend::kReplay;
  EXPECT_TRUE(NearTiesToRemeasure(spec, results).empty());
  EXPECT_EQ(Policies(RemeasureCandidates(spec, results)),
            (std::vector<std::string>{"selective:[core_attn]", "selective:[]"}));
  results.push_back(Measure(spec, "selective:[core_attn]", 50, {0.502, 0.502, 0.502}));
  EXPECT_EQ(Policies(RemeasureCandidates(spec, results)),
            (std::vector<std::string>{"selective:[]"}));
}

}  // namespace
}  // namespace remat::search
