#include "search/depth_proxy.h"

#include <gtest/gtest.h>

#include "search/memory_model.h"
#include "search/rules.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

SearchSpec Deep() {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = 32;
  s.search.proxy_layers = {2, 4};
  return s;
}

TrialResult Measured(const Policy& p, uint64_t alloc, uint64_t reserved, double step) {
  TrialResult r;
  r.policy = p;
  r.status = TrialStatus::kOk;
  r.step_time_s = step;
  r.model_tflops = 100;
  RankResult rr;
  rr.peak_allocated_bytes = alloc;
  rr.peak_reserved_bytes = reserved;
  rr.static_bytes = alloc / 2;
  rr.step_time_s = step;
  r.ranks = {rr};
  return r;
}

TEST(DepthProxyTest, ValidatesDepths) {
  EXPECT_TRUE(ValidateSpec(Deep()).ok());
  SearchSpec s = Deep();
  s.search.proxy_layers = {4};
  EXPECT_EQ(ValidateSpec(s).message().rfind("search.proxy_layers:", 0), 0u);
  s.search.proxy_layers = {4, 2};
  EXPECT_FALSE(ValidateSpec(s).ok());
  s.search.proxy_layers = {2, 32};
  EXPECT_NE(ValidateSpec(s).message().find("shallower than model.num_layers"), std::string::npos);
  s.search.proxy_layers = {2, 3};
  s.parallel.pipeline_model_parallel_size = 2;
  EXPECT_NE(ValidateSpec(s).message().find("multiples"), std::string::npos);
  SearchSpec moe = testing::MoeSpec();
  moe.model.num_layers = 8;
  moe.model.moe_layer_freq.every = 2;  // alternating: no single per-layer cost
  moe.search.proxy_layers = {2, 4};
  EXPECT_NE(ValidateSpec(moe).message().find("one kind"), std::string::npos);
  moe.model.moe_layer_freq.every = 1;
  moe.model.moe_layer_freq.pattern = {0, 1, 1, 1, 1, 1, 1, 1};  // a leading dense layer is fine
  EXPECT_TRUE(ValidateSpec(moe).ok()) << ValidateSpec(moe).message();
}

TEST(DepthProxyTest, BlockDeeperThanTheShallowProxyCannotBeExtrapolated) {
  SearchSpec s = Deep();
  EXPECT_TRUE(ValidatePolicy(s, Policy::Full(RecomputeMethod::kBlock, 1)).ok());
  Status st = ValidatePolicy(s, Policy::Full(RecomputeMethod::kBlock, 2));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("search.proxy_layers"), std::string::npos);
  EXPECT_TRUE(ValidatePolicy(s, Policy::Full(RecomputeMethod::kUniform, 2)).ok());
  EXPECT_FALSE(ValidatePolicy(s, Policy::Full(RecomputeMethod::kUniform, 4)).ok());
  for (const auto& p : EnumerateValidPolicies(s)) EXPECT_TRUE(ProxyPolicyProblem(s, p).empty());
}

TEST(DepthProxyTest, AtDepthCutsLayersAndPattern) {
  SearchSpec s = testing::MoeSpec();
  s.model.num_layers = 8;
  s.model.moe_layer_freq.pattern = {0, 1, 1, 1, 1, 1, 1, 1};
  s.search.proxy_layers = {2, 4};
  SearchSpec cut = AtDepth(s, 4);
  EXPECT_EQ(cut.model.num_layers, 4);
  EXPECT_EQ(cut.model.moe_layer_freq.pattern.size(), 4u);
  EXPECT_TRUE(cut.search.proxy_layers.empty());
  EXPECT_TRUE(ValidateSpec(cut).ok());
}

TEST(DepthProxyTest, ExtendsTheLineThroughBothDepthsPerRank) {
  SearchSpec s = Deep();
  Policy p = Policy::None();
  // fixed 10 GiB + 1 GiB per layer; 0.1 s + 0.05 s per layer.
  const uint64_t g = 1ull << 30;
  TrialResult a = Measured(p, 12 * g, 13 * g, 0.2);
  TrialResult b = Measured(p, 14 * g, 15 * g, 0.3);
  TrialResult r = PredictFullDepth(s, a, b);
  EXPECT_TRUE(r.predicted);
  EXPECT_EQ(r.status, TrialStatus::kOk);
  EXPECT_EQ(r.ranks.at(0).peak_allocated_bytes, 42 * g);
  EXPECT_EQ(r.ranks.at(0).peak_reserved_bytes, 43 * g);
  EXPECT_NEAR(r.step_time_s, 1.7, 1e-9);
  EXPECT_NEAR(r.tokens_per_s, TokensPerSecond(s, 1.7), 1e-6);
  ASSERT_EQ(r.proxies.size(), 2u);
  EXPECT_EQ(r.proxies[0].num_layers, 2);
  EXPECT_EQ(r.proxies[1].num_layers, 4);
  EXPECT_NE(r.message.find("predicted for 32 layers from proxies at 2 and 4"), std::string::npos);
}

TEST(DepthProxyTest, AFailedProxyGivesItsStatus) {
  SearchSpec s = Deep();
  TrialResult a = Measured(Policy::None(), 1, 1, 0.1);
  TrialResult b = a;
  b.status = TrialStatus::kOom;
  b.message = "out of memory";
  TrialResult r = PredictFullDepth(s, a, b);
  EXPECT_EQ(r.status, TrialStatus::kOom);
  EXPECT_NE(r.message.find("proxy at 4 layers: oom"), std::string::npos);
}

// The analytic model is affine in depth, so two shallow estimates predict the deep one.
TEST(DepthProxyTest, PredictsTheAnalyticModelsDeepPeak) {
  for (SearchSpec s : {testing::DenseSpec(), testing::MoeSpec()}) {
    s.model.num_layers = 24;
    s.search.proxy_layers = {3, 5};
    for (const Policy& p : {Policy::None(), Policy::Selective({Label::kCoreAttn}),
                            Policy::Full(RecomputeMethod::kUniform, 1),
                            Policy::Full(RecomputeMethod::kBlock, 2)}) {
      auto as_result = [&](int layers) {
        const MemoryEstimate e = EstimateMemory(AtDepth(s, layers), p);
        return Measured(p, static_cast<uint64_t>(e.peak_bytes), static_cast<uint64_t>(e.peak_bytes), 1);
      };
      TrialResult r = PredictFullDepth(s, as_result(3), as_result(5));
      const double truth = EstimateMemory(AtDepth(s, 24), p).peak_bytes;
      EXPECT_NEAR(r.ranks[0].peak_allocated_bytes / truth, 1.0, 0.01) << s.name << " " << p.ToString();
    }
  }
}

}  // namespace
}  // namespace remat::search
