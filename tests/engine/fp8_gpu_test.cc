// FP8 linears on a GPU (label gpu; compiled with REMAT_WITH_CUDA, skipped below compute capability
// 8.9 or without LibTorch FP8): against the bf16 linear, the forward and both gradients agree
// within FP8's tolerance, and what the forward keeps for backward is the input's FP8 transpose
// alone (1 byte per element, docs/transformer-engine.md section 7) beside the weight workspace
// (2 bytes per weight element), as the memory model (search/fp8_memory.h) counts.

#include <c10/cuda/CUDACachingAllocator.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "engine/fp8_linear.h"
#include "engine/ops.h"
#include "search/spec.h"

namespace remat::engine {
namespace {

// Bytes the live tensors asked for (allocated_bytes would count the unsplit remainder of a
// large block too).
int64_t Requested() {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).requested_bytes[0].current;
}

// Relative Frobenius error of a against b.
double RelErr(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kFloat) - b.to(at::kFloat)).norm().item<double>() /
         b.to(at::kFloat).norm().item<double>();
}

class Fp8GpuTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    search::SearchSpec s;
    s.model.fp8 = "hybrid";
    s.model.fp8_recipe = GetParam();
    if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
    const std::string why = Fp8Unsupported(s, at::Device(at::kCUDA, 0));
    if (!why.empty()) GTEST_SKIP() << why;
    model_ = s.model;
  }
  search::ModelSpec model_;
};

TEST_P(Fp8GpuTest, MatchesBf16AndKeepsTheFp8Input) {
#ifdef REMAT_ENGINE_FP8
  const int64_t tokens = 2048, in = 1024, out = 1536;
  auto opts = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::manual_seed(3);
  at::Tensor x = at::randn({tokens / 2, 2, in}, opts).requires_grad_(true);
  at::Tensor w = (at::randn({out, in}, opts) * 0.02).requires_grad_(true);
  at::Tensor g = at::randn({tokens / 2, 2, out}, opts);
  Runtime rt;
  rt.device = at::Device(at::kCUDA, 0);
  Fp8Linears fp8(model_);
  // Delayed scaling quantizes with the previous use's amax: warm it up over two steps.
  for (int step = 0; step < 2; ++step) {
    fp8.NewStep();
    at::Tensor y = fp8.Apply(rt, 0, x, w, at::Tensor(), LinearMode::kColumn);
    y.backward(g);
    x.mutable_grad() = at::Tensor();
    w.mutable_grad() = at::Tensor();
  }
  fp8.NewStep();
  c10::cuda::CUDACachingAllocator::emptyCache();
  const int64_t before = Requested();
  at::Tensor y = fp8.Apply(rt, 0, x, w, at::Tensor(), LinearMode::kColumn);
  const int64_t held = Requested() - before;
  // Output (bf16) + the input's FP8 transpose + its fp32 scale; the weight workspace is remade
  // on this step's first use in place of the last step's (net 0).
  const int64_t expected = tokens * out * 2 + tokens * in + 4;
  EXPECT_NEAR(static_cast<double>(held), static_cast<double>(expected), 1024.0)
      << "held " << held << " expected " << expected;
  {
    // linear_proj's save_original (tensorwise): only the output; delayed keeps the FP8 copy.
    const int64_t before_original = Requested();
    at::Tensor y2 = fp8.Apply(rt, 1, x, w, at::Tensor(), LinearMode::kRow, true);
    const int64_t held2 = Requested() - before_original - 2 * out * in;  // key 1's workspace
    const int64_t kept = std::string(GetParam()) == "delayed" ? tokens * in + 4 : 0;
    EXPECT_NEAR(static_cast<double>(held2), static_cast<double>(tokens * out * 2 + kept), 1024.0);
    y2.backward(g);  // quantizes the saved bf16 input in backward
    EXPECT_TRUE(std::isfinite(w.grad().to(at::kFloat).norm().item<double>()));
    w.mutable_grad() = at::Tensor();
    x.mutable_grad() = at::Tensor();
  }
  EXPECT_EQ(fp8.WorkspaceBytes(), static_cast<uint64_t>(4 * out * in));  // keys 0 and 1
  y.backward(g);
  at::Tensor ref_x = x.detach().clone().requires_grad_(true);
  at::Tensor ref_w = w.detach().clone().requires_grad_(true);
  at::Tensor ref = at::linear(ref_x, ref_w);
  ref.backward(g);
  EXPECT_LT(RelErr(y, ref), 0.05);
  EXPECT_LT(RelErr(x.grad(), ref_x.grad()), 0.1);  // e5m2 gradients: 2 mantissa bits
  EXPECT_LT(RelErr(w.grad(), ref_w.grad()), 0.1);
#endif
}

INSTANTIATE_TEST_SUITE_P(Recipes, Fp8GpuTest, ::testing::Values("tensorwise", "delayed"));

}  // namespace
}  // namespace remat::engine
