// What core_attn and mlp recompute free under the Transformer Engine layer
// (docs/transformer-engine.md section 10), as the memory model counts them.

#include <gtest/gtest.h>

#include "search/memory_model.h"
#include "search/policy.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

Policy P(const std::string& text) { return *ParsePolicy(text); }

double Held(const SearchSpec& s, const std::string& policy) {
  return EstimateMemory(s, P(policy)).layer_activation_bytes;
}

SearchSpec TeDense() {
  SearchSpec s = testing::DenseSpec();  // 32 heads, 8 groups, d 128, RoPE, seq 4096, b 1
  s.model.transformer_impl = TransformerImpl::kTransformerEngine;
  s.model.attention_backend = AttentionBackend::kFlash;
  return s;
}

// The core_attn checkpoint keeps q, k, v as Megatron passes them: the rotated q and k and v's
// view, which pins the fused QKV output. Beyond the kernel's own q, k, v copies that is
// e T (a + g) d / t; the kernel's log-sum-exp (4 T a) goes: a net growth per layer.
TEST(TeLabels, CoreAttnPinsTheFusedQkvOutput) {
  const SearchSpec s = TeDense();
  const double T = 4096, e = 2, a = 32, g = 8, d = 128, layers = s.model.num_layers;
  const double growth = e * T * (a + g) * d - 4 * T * a;
  EXPECT_DOUBLE_EQ(Held(s, "selective:[core_attn]") - Held(s, "selective:[]"), layers * growth);
  // The local layer's flash attention keeps the same tensors either way: the label frees the
  // log-sum-exp only.
  SearchSpec local = s;
  local.model.transformer_impl = TransformerImpl::kLocal;
  EXPECT_DOUBLE_EQ(Held(local, "selective:[]") - Held(local, "selective:[core_attn]"),
                   layers * 4 * T * a);
}

// TE's fc1 holds the pre-MLP norm: Megatron's mlp checkpoint starts from the residual, so the
// norm's output and statistics go with the MLP internals.
TEST(TeLabels, MlpFreesTheFusedNormToo) {
  SearchSpec s = TeDense();
  const double T = 4096, e = 2, h = 4096, layers = s.model.num_layers;
  SearchSpec local = s;
  local.model.transformer_impl = TransformerImpl::kLocal;
  const double te_saving = Held(s, "selective:[]") - Held(s, "selective:[mlp]");
  const double local_saving = Held(local, "selective:[]") - Held(local, "selective:[mlp]");
  EXPECT_DOUBLE_EQ(te_saving - local_saving, layers * (e * T * h + 4 * T));  // RMSNorm: fp32 rstd
}

}  // namespace
}  // namespace remat::search
