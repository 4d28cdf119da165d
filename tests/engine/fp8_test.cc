// FP8 where the engine cannot run it (engine/fp8_linear.h): a trial of the Transformer Engine
// layer with model.fp8 on CPU ranks, or built against a LibTorch without FP8 GEMMs, ends invalid
// with one line naming model.fp8 and why, before any step (a result, never an abort).

#include <gtest/gtest.h>

#include <string>

#include "engine/fp8_linear.h"
#include "engine/trial_runner.h"
#include "search/spec.h"
#include "tests/engine/test_models.h"

namespace remat::engine {
namespace {

search::SearchSpec TeFp8(search::Device device) {
  search::SearchSpec s = testing::TinyDense();
  s.model.transformer_impl = search::TransformerImpl::kTransformerEngine;
  s.model.attention_backend = search::AttentionBackend::kFlash;
  s.model.fp8 = "hybrid";
  s.model.fp8_recipe = "tensorwise";
  s.search.device = device;
  return s;
}

search::TrialResult RunFp8(const search::SearchSpec& spec) {
  TrialOptions o;
  o.spec = spec;
  o.policy = search::Policy::None();
  return RunTrial(o);
}

TEST(Fp8EngineTest, CpuRanksAreRefusedNamingModelFp8) {
  // search.device cpu: refused by the engine's limits (search::BuiltinBackendProblem).
  const search::TrialResult r = RunFp8(TeFp8(search::Device::kCpu));
  EXPECT_EQ(r.status, search::TrialStatus::kInvalid) << r.message;
  EXPECT_EQ(r.message.rfind("model.fp8:", 0), 0u) << r.message;
  EXPECT_NE(r.message.find("search.device is cpu"), std::string::npos) << r.message;
  EXPECT_EQ(r.message.find('\n'), std::string::npos) << r.message;
  EXPECT_EQ(r.measured_steps, 0);
}

TEST(Fp8EngineTest, TheBuildOrTheDeviceDecidesAtTheStart) {
  search::SearchSpec s = TeFp8(search::Device::kAuto);
  const std::string why = Fp8Unsupported(s, at::Device(at::kCPU));
#ifdef REMAT_ENGINE_FP8
  EXPECT_NE(why.find("CPU ranks"), std::string::npos) << why;
#else
  EXPECT_NE(why.find("LibTorch " TORCH_VERSION), std::string::npos) << why;
#endif
  EXPECT_EQ(why.rfind("model.fp8:", 0), 0u) << why;
  s.model.fp8 = "";
  EXPECT_EQ(Fp8Unsupported(s, at::Device(at::kCPU)), "");
  // A trial that lands on CPU ranks (search.device auto without a GPU) ends invalid, whole.
  if (at::hasCUDA()) GTEST_SKIP() << "a CUDA device is present: auto would run there";
  const search::TrialResult r = RunFp8(TeFp8(search::Device::kAuto));
  EXPECT_EQ(r.status, search::TrialStatus::kInvalid) << r.message;
  EXPECT_EQ(r.message, why);
}

}  // namespace
}  // namespace remat::engine
