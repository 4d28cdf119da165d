// Depth proxies on the real engine (CPU): the peak predicted from 2 and 4 layers matches the
// peak measured on the 8-layer model, per policy.
#include <gtest/gtest.h>

#include "search/depth_proxy.h"
#include "tests/engine/test_models.h"
#include "engine/trial_runner.h"

namespace remat::engine {
namespace {

// The tiny dense model at 8 layers: deep enough for proxies at 2 and 4.
search::SearchSpec Spec() {
  search::SearchSpec s = testing::TinyDense();
  s.name = "proxy";
  s.model.num_layers = 8;
  return s;
}

TEST(DepthProxyEngineTest, PredictionMatchesTheDeepModel) {
  for (const char* text : {"selective:[]", "selective:[core_attn]", "full:uniform:1", "full:block:1"}) {
    TrialOptions full;
    full.spec = Spec();
    full.policy = *search::ParsePolicy(text);
    TrialOptions proxy = full;
    proxy.spec.search.proxy_layers = {2, 4};
    const search::TrialResult measured = RunTrial(full);
    const search::TrialResult predicted = RunTrial(proxy);
    ASSERT_EQ(measured.status, search::TrialStatus::kOk) << text << ": " << measured.message;
    ASSERT_EQ(predicted.status, search::TrialStatus::kOk) << text << ": " << predicted.message;
    EXPECT_TRUE(predicted.predicted);
    EXPECT_FALSE(measured.predicted);
    ASSERT_EQ(predicted.proxies.size(), 2u);
    EXPECT_EQ(predicted.proxies[1].num_layers, 4);
    const double ratio = static_cast<double>(predicted.PeakAllocatedBytes()) /
                         static_cast<double>(measured.PeakAllocatedBytes());
    EXPECT_NEAR(ratio, 1.0, 0.02) << text;
    EXPECT_NEAR(static_cast<double>(predicted.ranks[0].static_bytes) /
                    static_cast<double>(measured.ranks[0].static_bytes), 1.0, 0.01) << text;
  }
}

TEST(DepthProxyEngineTest, AProxyThatCannotBeExtrapolatedIsInvalid) {
  TrialOptions o;
  o.spec = Spec();
  o.spec.search.proxy_layers = {2, 4};
  o.policy = search::Policy::Full(search::RecomputeMethod::kBlock, 3);
  const search::TrialResult r = RunTrial(o);
  EXPECT_EQ(r.status, search::TrialStatus::kInvalid) << r.message;
}

}  // namespace
}  // namespace remat::engine
