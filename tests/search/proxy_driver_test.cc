// The depth-proxy driver (search/proxy_driver.h): which depths run with which spec, the failure
// rule, the shared timeout, and the one memory-cap rule.
#include "search/proxy_driver.h"

#include <gtest/gtest.h>

#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

SearchSpec Deep() {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = 32;
  s.search.proxy_layers = {2, 4};
  s.search.memory_budget_gib = 70;
  s.search.trial_timeout_s = 100;
  return s;
}

// A run whose peak and step time are affine in the depth, taking 10 s of the trial's time.
TrialResult Affine(const SearchSpec& cut) {
  TrialResult r;
  r.status = TrialStatus::kOk;
  r.step_time_s = 0.1 * cut.model.num_layers;
  r.wall_s = 10;
  RankResult rr;
  rr.peak_allocated_bytes = 1000 + 100 * static_cast<uint64_t>(cut.model.num_layers);
  rr.peak_reserved_bytes = rr.peak_allocated_bytes;
  rr.step_time_s = r.step_time_s;
  r.ranks = {rr};
  return r;
}

TEST(ProxyDriverTest, RunsEachDepthCutAndUncappedSharingTheTimeoutAndPredicts) {
  std::vector<SearchSpec> seen;
  const Policy policy = Policy::Selective({Label::kCoreAttn});
  TrialResult r = RunDepthProxies(Deep(), policy, [&](const SearchSpec& cut, int layers) {
    EXPECT_EQ(cut.model.num_layers, layers);
    seen.push_back(cut);
    return Affine(cut);
  });
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].model.num_layers, 2);
  EXPECT_EQ(seen[1].model.num_layers, 4);
  for (const SearchSpec& cut : seen) {
    EXPECT_FALSE(MemoryCapped(cut));
    EXPECT_TRUE(cut.search.proxy_layers.empty());
  }
  EXPECT_DOUBLE_EQ(seen[0].search.trial_timeout_s, 100);
  EXPECT_DOUBLE_EQ(seen[1].search.trial_timeout_s, 90);  // the first depth took 10 s
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  EXPECT_TRUE(r.predicted);
  EXPECT_EQ(r.policy.ToString(), policy.ToString());
  ASSERT_EQ(r.ranks.size(), 1u);
  EXPECT_EQ(r.ranks[0].peak_allocated_bytes, 1000u + 100u * 32u);
  EXPECT_NEAR(r.step_time_s, 3.2, 1e-9);
  EXPECT_TRUE(MemoryCapped(Deep()));
}

TEST(ProxyDriverTest, TheFirstFailedDepthEndsTheTrialAndIsNamed) {
  int runs = 0;
  TrialResult r = RunDepthProxies(Deep(), Policy::Selective({Label::kCoreAttn}),
                                  [&](const SearchSpec& cut, int) {
                                    ++runs;
                                    TrialResult t = Affine(cut);
                                    t.status = TrialStatus::kOom;
                                    t.message = "CUDA out of memory";
                                    return t;
                                  });
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(r.status, TrialStatus::kOom);
  EXPECT_EQ(r.message, "proxy at 2 layers: oom: CUDA out of memory");
}

TEST(ProxyDriverTest, APolicyTheDepthsCannotExtrapolateIsInvalidWithoutRunning) {
  int runs = 0;
  TrialResult r = RunDepthProxies(Deep(), Policy::Full(RecomputeMethod::kBlock, 2),
                                  [&](const SearchSpec& cut, int) {
                                    ++runs;
                                    return Affine(cut);
                                  });
  EXPECT_EQ(runs, 0);
  EXPECT_EQ(r.status, TrialStatus::kInvalid);
  EXPECT_NE(r.message.find("fewer layers per stage"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace remat::search
