// bf16 main gradients and the precision-aware optimizer in the engine (engine/te_optimizer.h):
// the trial's static bytes are exactly the memory model's static term for every gradient /
// optimizer dtype combination, the int16 remainder trick keeps the fp32 master exact, and a run
// with the precision-aware optimizer at fp32 state takes the same steps as Megatron's fp32 master
// weights. In-process on CPU.

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/te_optimizer.h"
#include "engine/trial_runner.h"
#include "search/memory_model.h"
#include "search/policy.h"
#include "tests/engine/test_models.h"

namespace remat::engine {
namespace {

using search::DType;
using search::Policy;
using search::TrialResult;
using search::TrialStatus;

double RelDiff(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

search::SearchSpec Bf16Dense() {
  search::SearchSpec s = testing::TinyDense();
  s.train.precision = search::Precision::kBf16;
  s.search.warmup_steps = 2;  // two optimizer updates before the measured step
  s.search.warmup_max_steps = 2;
  return s;
}

TrialResult RunSpec(const search::SearchSpec& spec) {
  TrialOptions o;
  o.spec = spec;
  o.policy = Policy::None();
  return RunTrial(o);
}

// The engine's static bytes against search::EstimateMemory's static term (less the persistent
// attention buffer, which the engine's static figure leaves out).
void ExpectStaticMatchesModel(const search::SearchSpec& spec, const std::string& what) {
  ASSERT_TRUE(search::BuiltinBackendProblem(spec).empty()) << search::BuiltinBackendProblem(spec);
  const TrialResult r = RunSpec(spec);
  ASSERT_EQ(r.status, TrialStatus::kOk) << what << ": " << r.message;
  EXPECT_TRUE(std::isfinite(r.loss)) << what;
  const search::MemoryEstimate est = search::EstimateMemory(spec, Policy::None());
  const double predicted = est.static_bytes - est.buffer_bytes;
  EXPECT_EQ(static_cast<double>(r.ranks.at(0).static_bytes), predicted)
      << what << ": measured " << r.ranks.at(0).static_bytes << ", model " << predicted;
}

TEST(TeOptimizerTest, StaticBytesEqualTheMemoryModel) {
  search::SearchSpec s = Bf16Dense();
  ExpectStaticMatchesModel(s, "bf16, fp32 gradients (18 B/param)");
  s.train.grad_reduce_in_fp32 = false;
  ExpectStaticMatchesModel(s, "bf16 gradients (16 B/param)");
  s.train.use_precision_aware_optimizer = true;
  ExpectStaticMatchesModel(s, "precision-aware, fp32 state as remainders (14 B/param)");
  s.train.main_grads_dtype = DType::kBf16;
  s.train.exp_avg_dtype = DType::kBf16;
  s.train.exp_avg_sq_dtype = DType::kBf16;
  ExpectStaticMatchesModel(s, "precision-aware, bf16 moments (10 B/param)");
  s.train.main_params_dtype = DType::kFp16;
  s.train.exp_avg_dtype = DType::kFp16;
  ExpectStaticMatchesModel(s, "precision-aware, fp16 master, fp16/bf16 moments (10 B/param)");
  s.train.grad_reduce_in_fp32 = true;
  ExpectStaticMatchesModel(s, "precision-aware with fp32 gradients (12 B/param)");
}

TEST(TeOptimizerTest, FewerStaticBytesLowerThePeakByAsMuch) {
  search::SearchSpec s = Bf16Dense();
  const TrialResult fp32_grads = RunSpec(s);
  s.train.grad_reduce_in_fp32 = false;
  s.train.use_precision_aware_optimizer = true;
  s.train.main_grads_dtype = DType::kBf16;
  s.train.exp_avg_dtype = s.train.exp_avg_sq_dtype = DType::kBf16;
  const TrialResult lean = RunSpec(s);
  ASSERT_EQ(fp32_grads.status, TrialStatus::kOk) << fp32_grads.message;
  ASSERT_EQ(lean.status, TrialStatus::kOk) << lean.message;
  const double saved = static_cast<double>(fp32_grads.ranks[0].static_bytes) -
                       static_cast<double>(lean.ranks[0].static_bytes);
  const double peak_saved = static_cast<double>(fp32_grads.PeakAllocatedBytes()) -
                            static_cast<double>(lean.PeakAllocatedBytes());
  EXPECT_GT(saved, 0);
  // The gradient buffer is live across the backward, the moments at the peak too: the peak falls
  // by the static saving (to within the step's small fp32 working chunks).
  EXPECT_LT(std::abs(peak_saved - saved), 0.02 * saved) << "static " << saved << ", peak " << peak_saved;
}

// FusedAdam's fp32 master as bf16 parameter + int16 remainder is the fp32 master itself: a run
// with the precision-aware optimizer at fp32 state follows plain fp32 master weights.
TEST(TeOptimizerTest, RemainderMasterTakesTheSameStepsAsFp32Master) {
  search::SearchSpec s = Bf16Dense();
  const TrialResult plain = RunSpec(s);
  s.train.use_precision_aware_optimizer = true;
  const TrialResult aware = RunSpec(s);
  ASSERT_EQ(plain.status, TrialStatus::kOk) << plain.message;
  ASSERT_EQ(aware.status, TrialStatus::kOk) << aware.message;
  EXPECT_LT(RelDiff(aware.loss, plain.loss), 1e-5);
  EXPECT_LT(RelDiff(aware.grad_norm, plain.grad_norm), 1e-3);
}

TEST(TeOptimizerTest, Bf16GradientsTrainClose) {
  search::SearchSpec s = Bf16Dense();
  const TrialResult fp32_grads = RunSpec(s);
  s.train.grad_reduce_in_fp32 = false;
  const TrialResult bf16_grads = RunSpec(s);
  ASSERT_EQ(bf16_grads.status, TrialStatus::kOk) << bf16_grads.message;
  EXPECT_LT(RelDiff(bf16_grads.loss, fp32_grads.loss), 1e-2);
  EXPECT_LT(RelDiff(bf16_grads.grad_norm, fp32_grads.grad_norm), 2e-2);
}

TEST(TeOptimizerTest, RemainderSplitIsExact) {
  at::Tensor master = at::randn({10000}, at::kFloat) * 3;
  master.narrow(0, 0, 4).copy_(at::tensor({0.0f, -0.0f, 1e-30f, -65504.0f}));
  at::Tensor param = at::empty({10000}, at::kBFloat16);
  at::Tensor rem = at::empty({10000}, at::kShort);
  SplitMaster(master, param, rem);
  EXPECT_TRUE(at::equal(MasterFromRemainder(param, rem), master));
  // The bf16 parameter is the master rounded to nearest (ties, vanishingly rare here, aside).
  const at::Tensor diff = (param.to(at::kFloat) - master).abs();
  const at::Tensor rne = (master.to(at::kBFloat16).to(at::kFloat) - master).abs();
  EXPECT_TRUE(at::le(diff, rne).all().item<bool>());
}

TEST(TeOptimizerTest, Fp8MomentsAreRefusedWithTheReason) {
  search::SearchSpec s = Bf16Dense();
  s.train.use_precision_aware_optimizer = true;
  s.train.exp_avg_dtype = DType::kFp8;
  EXPECT_NE(search::BuiltinBackendProblem(s).find("exp_avg_dtype"), std::string::npos);
}

}  // namespace
}  // namespace remat::engine
