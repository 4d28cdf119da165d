#include "search/frontier.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace remat::search {
namespace {

TrialResult Make(const std::string& policy, TrialStatus status, uint64_t reserved, double tps,
                 uint64_t allocated = 0) {
  TrialResult t;
  t.policy = *ParsePolicy(policy);
  t.status = status;
  t.tokens_per_s = tps;
  RankResult r;
  r.peak_reserved_bytes = reserved;
  r.peak_allocated_bytes = allocated ? allocated : reserved;
  t.ranks.push_back(r);
  return t;
}

std::vector<std::string> Names(const std::vector<FrontierPoint>& f) {
  std::vector<std::string> out;
  for (const auto& p : f) out.push_back(p.policy.ToString());
  return out;
}

TEST(FrontierTest, KeepsNonDominatedOkPointsWithinBudgetOrderedByMemory) {
  std::vector<TrialResult> trials = {
      Make("selective:[]", TrialStatus::kOk, 100, 10),
      Make("selective:[core_attn]", TrialStatus::kOk, 80, 9),
      Make("selective:[layernorm]", TrialStatus::kOk, 90, 8),     // dominated by core_attn
      Make("full:uniform:1", TrialStatus::kOk, 50, 7),
      Make("full:block:2", TrialStatus::kOom, 10, 0),             // not ok
      Make("selective:[mlp]", TrialStatus::kOk, 120, 11),         // over budget
  };
  auto f = ComputeFrontier(trials, MemoryMetric::kReserved, 110);
  EXPECT_EQ(Names(f), (std::vector<std::string>{"full:uniform:1", "selective:[core_attn]",
                                                "selective:[]"}));
}

TEST(FrontierTest, MetricChoosesTheMemoryAxis) {
  std::vector<TrialResult> trials = {
      Make("selective:[]", TrialStatus::kOk, /*reserved=*/200, 10, /*allocated=*/100),
      Make("selective:[core_attn]", TrialStatus::kOk, 150, 9, 140),
  };
  EXPECT_EQ(Names(ComputeFrontier(trials, MemoryMetric::kAllocated, 1000)),
            (std::vector<std::string>{"selective:[]"}));
  EXPECT_EQ(Names(ComputeFrontier(trials, MemoryMetric::kReserved, 1000)),
            (std::vector<std::string>{"selective:[core_attn]", "selective:[]"}));
}

TEST(FrontierTest, BudgetIsInclusiveAndExactTiesBothStay) {
  std::vector<TrialResult> trials = {
      Make("selective:[core_attn]", TrialStatus::kOk, 100, 10),
      Make("selective:[layernorm]", TrialStatus::kOk, 100, 10),
  };
  auto f = ComputeFrontier(trials, MemoryMetric::kReserved, 100);
  EXPECT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].policy.ToString(), "selective:[core_attn]");  // tie: policy string
}

TEST(FrontierTest, NothingFitsSaysWhatCameClosest) {
  std::vector<TrialResult> trials = {
      Make("selective:[]", TrialStatus::kOom, 90ull << 30, 0),
      Make("full:uniform:1", TrialStatus::kOk, 85ull << 30, 5),
  };
  auto f = ComputeFrontier(trials, MemoryMetric::kReserved, 80ull << 30);
  EXPECT_TRUE(f.empty());
  std::string msg = NothingFitsMessage(trials, MemoryMetric::kReserved, 80ull << 30);
  EXPECT_NE(msg.find("closest: full:uniform:1 at 85.00 GiB"), std::string::npos) << msg;
}

// The frontier against a brute-force definition on random points.
TEST(FrontierTest, MatchesBruteForceOnRandomPoints) {
  std::mt19937 rng(7);
  const auto all = std::vector<std::string>{
      "selective:[]", "selective:[core_attn]", "selective:[layernorm]", "selective:[mlp]",
      "selective:[core_attn,layernorm]", "selective:[core_attn,mlp]", "selective:[layernorm,mlp]",
      "selective:[core_attn,layernorm,mlp]", "full:uniform:1", "full:block:1", "full:block:2"};
  for (int round = 0; round < 300; ++round) {
    std::vector<TrialResult> trials;
    for (const auto& p : all) {
      if (rng() % 4 == 0) continue;
      TrialStatus st = rng() % 5 == 0 ? TrialStatus::kOom : TrialStatus::kOk;
      trials.push_back(Make(p, st, 1 + rng() % 20, 1 + rng() % 20));  // small ranges: many ties
    }
    const uint64_t budget = 5 + rng() % 20;
    auto f = ComputeFrontier(trials, MemoryMetric::kReserved, budget);
    std::set<std::string> expected;
    for (const auto& a : trials) {
      if (a.status != TrialStatus::kOk || a.PeakReservedBytes() > budget) continue;
      bool dominated = false;
      for (const auto& b : trials) {
        if (b.status != TrialStatus::kOk || b.PeakReservedBytes() > budget) continue;
        const bool le = b.PeakReservedBytes() <= a.PeakReservedBytes() && b.tokens_per_s >= a.tokens_per_s;
        const bool strict = b.PeakReservedBytes() < a.PeakReservedBytes() || b.tokens_per_s > a.tokens_per_s;
        dominated |= le && strict;
      }
      if (!dominated) expected.insert(a.policy.ToString());
    }
    auto names = Names(f);
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), expected) << "round " << round;
    for (size_t i = 1; i < f.size(); ++i) {
      EXPECT_LE(f[i - 1].memory_bytes, f[i].memory_bytes);
    }
  }
}

TEST(FrontierTest, HypervolumeOfKnownShapes) {
  std::vector<FrontierPoint> one = {{Policy::None(), 50, 10}};
  // Rectangle from memory 50 to budget 100, throughput 5 to 10.
  EXPECT_DOUBLE_EQ(Hypervolume(one, 100, 5), 50.0 * 5.0);
  std::vector<FrontierPoint> two = {{Policy::None(), 80, 10},
                                    {Policy::Full(RecomputeMethod::kUniform, 1), 40, 6}};
  // [40,80) x (6-5) + [80,100] x (10-5)
  EXPECT_DOUBLE_EQ(Hypervolume(two, 100, 5), 40.0 * 1 + 20.0 * 5);
  // Adding a dominated point changes nothing; points below t_ref or over budget add nothing.
  auto more = two;
  more.push_back({*ParsePolicy("selective:[mlp]"), 90, 9});
  more.push_back({*ParsePolicy("selective:[layernorm]"), 10, 4});
  more.push_back({*ParsePolicy("selective:[core_attn]"), 120, 50});
  EXPECT_DOUBLE_EQ(Hypervolume(more, 100, 5), Hypervolume(two, 100, 5));
  EXPECT_DOUBLE_EQ(Hypervolume({}, 100, 5), 0.0);
}

TEST(FrontierTest, FragmentationIsFlaggedWhenReservedFarExceedsAllocated) {
  TrialResult t = Make("selective:[]", TrialStatus::kOk, 40ull << 30, 1, 30ull << 30);
  t.ranks.push_back(t.ranks[0]);
  t.ranks[1].rank = 1;
  t.ranks[1].peak_reserved_bytes = 31ull << 30;  // close to allocated: fine
  auto findings = DiagnoseFragmentation(t, 80ull << 30);
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_NE(findings[0].find("rank 0"), std::string::npos);
  EXPECT_NE(findings[0].find("expandable_segments:True"), std::string::npos);
  TrialResult small = Make("selective:[]", TrialStatus::kOk, 300ull << 20, 1, 100ull << 20);
  EXPECT_TRUE(DiagnoseFragmentation(small, 80ull << 30).empty());  // gap under 256 MiB
}

// A layout proxy lists every rank of its layout (1,024 for the 405B example), its stages a few
// MiB apart: one finding names them all, quoting the rank that reserves the most.
TEST(FrontierTest, FragmentationOfManyRanksIsOneFinding) {
  TrialResult t = Make("selective:[moe]", TrialStatus::kOk, 68ull << 30, 1, 59ull << 30);
  for (int r = 1; r < 24; ++r) {
    t.ranks.push_back(t.ranks[0]);
    t.ranks.back().rank = r;
    if (r >= 8) t.ranks.back().peak_reserved_bytes = 70ull << 30;  // the next stage
    if (r >= 16) t.ranks.back().peak_reserved_bytes = 60ull << 30;  // close to allocated: fine
  }
  t.ranks.push_back(t.ranks[0]);
  t.ranks.back().rank = 30;
  const auto findings = DiagnoseFragmentation(t, 80ull << 30);
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_EQ(findings[0].rfind("selective:[moe]: ranks 0-15, 30 reserved up to 70.00 GiB but "
                              "allocated only 59.00 GiB there (15-19% more across them)",
                              0),
            0u)
      << findings[0];
}

// Allocated memory over the budget by itself is capacity: no allocator setting fixes it.
TEST(FrontierTest, AllocatedOverTheBudgetIsCapacityNotFragmentation) {
  TrialResult t = Make("selective:[]", TrialStatus::kOom, 40ull << 30, 1, 30ull << 30);
  auto findings = DiagnoseFragmentation(t, 24ull << 30);
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_NE(findings[0].find("capacity, not fragmentation"), std::string::npos) << findings[0];
  EXPECT_EQ(findings[0].find("expandable_segments"), std::string::npos) << findings[0];
}

}  // namespace
}  // namespace remat::search

namespace remat::search {
namespace {

// A trial whose median step has the interval [median - half, median + half] (search/noise.h);
// tokens/s = 1000 / step.
TrialResult Noisy(const std::string& policy, uint64_t memory, double step, double half) {
  TrialResult t = Make(policy, TrialStatus::kOk, memory, 1000 / step);
  t.step_time_s = step;
  t.step_time_low_s = step - half;
  t.step_time_high_s = step + half;
  return t;
}

TEST(NoiseAwareFrontierTest, APointInsideTheIntervalOfALowerMemoryPointIsNotSeparate) {
  const std::vector<TrialResult> trials = {
      Noisy("full:uniform:1", 50, 1.00, 0.05),          // 1000 tokens/s, up to 1052.6
      Noisy("selective:[core_attn]", 60, 0.97, 0.005),  // 1030.9: inside uniform:1's interval
      Noisy("selective:[]", 80, 0.90, 0.01),            // 1111: above every interval kept
  };
  EXPECT_EQ(Names(ComputeFrontier(trials, MemoryMetric::kReserved, 100)),
            (std::vector<std::string>{"full:uniform:1", "selective:[core_attn]", "selective:[]"}));
  std::vector<double> upper;
  const auto f = NoiseAwareFrontier(trials, MemoryMetric::kReserved, 100, &upper);
  EXPECT_EQ(Names(f), (std::vector<std::string>{"full:uniform:1", "selective:[]"}));
  ASSERT_EQ(upper.size(), 2u);
  EXPECT_NEAR(upper[0], 1000 / 0.95, 1e-9);
  EXPECT_NEAR(upper[1], 1000 / 0.89, 1e-9);
  // A steadier low-memory end leaves the middle point outside its interval: separate again.
  std::vector<TrialResult> steady = trials;
  steady[0] = Noisy("full:uniform:1", 50, 1.00, 0.01);
  EXPECT_EQ(Names(NoiseAwareFrontier(steady, MemoryMetric::kReserved, 100)),
            Names(ComputeFrontier(steady, MemoryMetric::kReserved, 100)));
}

TEST(NoiseAwareFrontierTest, WithoutIntervalsItIsTheFrontier) {
  std::mt19937_64 gen(3);
  std::uniform_int_distribution<uint64_t> mem(1, 100);
  std::uniform_real_distribution<double> tps(1, 10);
  const char* policies[] = {"selective:[]", "selective:[core_attn]", "selective:[layernorm]",
                            "selective:[mlp]", "full:uniform:1", "full:block:1", "full:block:2"};
  for (int round = 0; round < 50; ++round) {
    std::vector<TrialResult> trials;
    for (const char* p : policies) trials.push_back(Make(p, TrialStatus::kOk, mem(gen), tps(gen)));
    const auto exact = ComputeFrontier(trials, MemoryMetric::kReserved, 90);
    const auto noisy = NoiseAwareFrontier(trials, MemoryMetric::kReserved, 90);
    // Equal up to exact duplicates, which the noise-aware frontier keeps once.
    std::set<std::pair<uint64_t, double>> a, b;
    for (const auto& p : exact) a.insert({p.memory_bytes, p.tokens_per_s});
    for (const auto& p : noisy) b.insert({p.memory_bytes, p.tokens_per_s});
    EXPECT_EQ(a, b);
  }
}

}  // namespace
}  // namespace remat::search

namespace remat::search {
namespace {

TEST(NoiseAwareFrontierTest, TheCapLimitsHowFarANoisyPointShadows) {
  const std::vector<TrialResult> trials = {
      Noisy("full:uniform:1", 50, 1.00, 0.20),          // stopped at its cap: +-20%
      Noisy("selective:[core_attn]", 60, 0.95, 0.005),  // 1052.6, 5% above it
  };
  EXPECT_EQ(Names(NoiseAwareFrontier(trials, MemoryMetric::kReserved, 100)),
            (std::vector<std::string>{"full:uniform:1"}));
  std::vector<double> upper;
  EXPECT_EQ(Names(NoiseAwareFrontier(trials, MemoryMetric::kReserved, 100, &upper, 0.02)),
            (std::vector<std::string>{"full:uniform:1", "selective:[core_attn]"}));
  EXPECT_NEAR(upper[0], 1020, 1e-9);
}

}  // namespace
}  // namespace remat::search
