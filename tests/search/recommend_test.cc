// The recommendation rule (step 2): ties within the measurement noise go to the least
// recompute, not to the highest throughput.
#include <gtest/gtest.h>

#include "search/frontier.h"
#include "search/memory_model.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

TrialResult Measured(const std::string& policy, double gib, double tokens_per_s,
                     double spread = 0) {
  TrialResult t;
  t.policy = *ParsePolicy(policy);
  t.status = TrialStatus::kOk;
  t.tokens_per_s = tokens_per_s;
  t.step_time_s = 1;
  t.step_time_spread_s = spread;
  RankResult r;
  r.peak_allocated_bytes = r.peak_reserved_bytes = static_cast<uint64_t>(gib * kGiB);
  t.ranks.push_back(r);
  return t;
}

std::vector<std::string> Tied(const Recommendation& r) {
  std::vector<std::string> out;
  for (const auto& c : r.tied) out.push_back(c.policy.ToString());
  return out;
}

// The MoE replay's case: a three-label policy a little faster than [core_attn], within noise.
TEST(RecommendTest, NearTieGoesToTheLeastRecompute) {
  const SearchSpec spec = testing::MoeSpec();
  ASSERT_LT(EstimateMemory(spec, *ParsePolicy("selective:[core_attn]")).recompute_flops,
            EstimateMemory(spec, *ParsePolicy("selective:[core_attn,moe_act,layernorm]"))
                .recompute_flops);
  const std::vector<TrialResult> trials = {
      Measured("selective:[core_attn]", 60, 1000, /*spread=*/0.03),
      Measured("selective:[core_attn,moe_act,layernorm]", 55, 1025),
      Measured("full:uniform:1", 40, 800),
  };
  auto rec = RecommendPolicy(spec, trials);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->choice.policy.ToString(), "selective:[core_attn]");
  EXPECT_EQ(rec->best.policy.ToString(), "selective:[core_attn,moe_act,layernorm]");
  EXPECT_EQ(Tied(*rec), (std::vector<std::string>{"selective:[core_attn]",
                                                  "selective:[core_attn,moe_act,layernorm]"}));
  EXPECT_NEAR(rec->choice.below_best, 25.0 / 1025, 1e-9);
  EXPECT_NEAR(rec->choice.tolerance, 0.03, 1e-9);  // its own spread: 3% of its step time
  EXPECT_NE(rec->reason.find("replays the least"), std::string::npos) << rec->reason;
  EXPECT_NE(rec->reason.find("selective:[core_attn,moe_act,layernorm]"), std::string::npos);
}

// Outside the noise the faster policy wins, whatever it replays.
TEST(RecommendTest, BeyondTheNoiseTheFastestWins) {
  const SearchSpec spec = testing::MoeSpec();
  const std::vector<TrialResult> trials = {
      Measured("selective:[core_attn]", 60, 1000, 0.005),
      Measured("selective:[core_attn,moe_act,layernorm]", 55, 1025, 0.005),
  };
  auto rec = RecommendPolicy(spec, trials);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->choice.policy.ToString(), "selective:[core_attn,moe_act,layernorm]");
  EXPECT_EQ(rec->tied.size(), 1u);
  EXPECT_NE(rec->reason.find("no other policy"), std::string::npos) << rec->reason;
}

// Steady steps still leave a 1% band: 0.5% apart is a tie.
TEST(RecommendTest, OnePercentIsTheLeastBand) {
  const SearchSpec spec = testing::DenseSpec();
  const std::vector<TrialResult> trials = {
      Measured("selective:[]", 70, 1000),
      Measured("selective:[core_attn]", 60, 1005),
  };
  auto rec = RecommendPolicy(spec, trials);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->choice.policy.ToString(), "selective:[]");
  EXPECT_DOUBLE_EQ(rec->choice.tolerance, kMinNoiseTolerance);
  EXPECT_DOUBLE_EQ(rec->choice.recompute_flops, 0);
}

// The noise comes from the ranks' measured steps when the trial carries no spread.
TEST(RecommendTest, NoiseFromTheMeasuredSteps) {
  const SearchSpec spec = testing::DenseSpec();
  TrialResult slow = Measured("selective:[]", 70, 960);
  slow.ranks[0].step_times_s = {1.0, 1.06, 0.99};
  EXPECT_NEAR(slow.RelativeSpread(), 0.07, 1e-9);
  const std::vector<TrialResult> trials = {slow, Measured("selective:[core_attn]", 60, 1000)};
  auto rec = RecommendPolicy(spec, trials);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->choice.policy.ToString(), "selective:[]");  // 4% below, inside its 7%
}

// Policies that replay the same work (every full:uniform:N) tie on recompute: less memory wins.
TEST(RecommendTest, EqualRecomputeGoesToLessMemory) {
  const SearchSpec spec = testing::DenseSpec();
  const std::vector<TrialResult> trials = {
      Measured("full:uniform:1", 50, 1000),
      Measured("full:uniform:2", 48, 1001),
  };
  auto rec = RecommendPolicy(spec, trials);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->choice.policy.ToString(), "full:uniform:2");
}

// The headroom narrows what may be recommended (not the frontier).
TEST(RecommendTest, HeadroomComesOffTheBudget) {
  SearchSpec spec = testing::DenseSpec();
  spec.search.memory_budget_gib = 80;
  spec.search.memory_headroom_gib = 4;
  const std::vector<TrialResult> trials = {
      Measured("selective:[]", 79, 1000),
      Measured("selective:[core_attn]", 75, 900),
  };
  auto rec = RecommendPolicy(spec, trials);
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->choice.policy.ToString(), "selective:[core_attn]");
  EXPECT_EQ(rec->budget_bytes, 76 * kGiB);
  EXPECT_NE(rec->reason.find("headroom"), std::string::npos) << rec->reason;
  EXPECT_EQ(
      ComputeFrontier(trials, spec.search.memory_metric, spec.search.MemoryBudgetBytes()).size(),
      2u);
  spec.search.memory_headroom_gib = 6;
  EXPECT_FALSE(RecommendPolicy(spec, trials).has_value());
}

TEST(RecommendTest, NothingOkNothingRecommended) {
  const SearchSpec spec = testing::DenseSpec();
  TrialResult oom = Measured("selective:[]", 81, 0);
  oom.status = TrialStatus::kOom;
  EXPECT_FALSE(RecommendPolicy(spec, {oom}).has_value());
  EXPECT_FALSE(RecommendPolicy(spec, {}).has_value());
}

}  // namespace
}  // namespace remat::search
