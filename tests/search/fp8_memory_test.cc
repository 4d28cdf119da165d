// FP8 in the memory model (search/fp8_memory.h, docs/transformer-engine.md section 7): Transformer
// Engine's weight workspaces or FP8 weights in the static bytes, and the FP8-saved inputs of its
// linears in a layer's activations, recipe by recipe.

#include <gtest/gtest.h>

#include "search/fp8_memory.h"
#include "search/memory_model.h"
#include "search/policy.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

using testing::DenseSpec;
using testing::MoeSpec;

SearchSpec Te(SearchSpec s) {
  s.model.transformer_impl = TransformerImpl::kTransformerEngine;
  s.model.attention_backend = AttentionBackend::kFlash;
  s.model.bias_activation_fusion = true;
  s.model.apply_rope_fusion = true;
  s.train.use_distributed_optimizer = true;
  return s;
}

SearchSpec Fp8(SearchSpec s, const char* recipe) {
  s.model.fp8 = "hybrid";
  s.model.fp8_recipe = recipe;
  return s;
}

double StaticBytes(const SearchSpec& s) { return EstimateMemory(s, Policy::None()).static_bytes; }

// QKV, projection, fc1 (gate + up) and fc2 of the dense layers, counted from the shape.
double LinearWeights(const SearchSpec& s) {
  const ModelSpec& m = s.model;
  const double h = m.hidden_size, d = m.EffectiveKvChannels(), a = m.num_attention_heads;
  const double g = m.EffectiveQueryGroups(), f = m.EffectiveFfnHiddenSize();
  return m.num_layers * (h * (a + 2 * g) * d + a * d * h + 3 * h * f);
}

TEST(Fp8MemoryTest, WeightWorkspacesByRecipe) {
  const SearchSpec bf16 = Te(DenseSpec());
  const double w = LinearWeights(bf16);
  const double base = StaticBytes(bf16);
  EXPECT_NEAR(StaticBytes(Fp8(bf16, "tensorwise")) - base, 2 * w, 1e-6 * w);
  EXPECT_NEAR(StaticBytes(Fp8(bf16, "delayed")) - base, 2 * w, 1e-6 * w);
  EXPECT_NEAR(StaticBytes(Fp8(bf16, "mxfp8")) - base, (2 + 1.0 / 16) * w, 1e-6 * w);
  EXPECT_NEAR(StaticBytes(Fp8(bf16, "blockwise")) - base, (2 + 8.0 / 16384) * w, 1e-6 * w);
  // FP8 weights: one byte replaces the bf16 weight's two, and a transpose is made for backward.
  SearchSpec gather = Fp8(bf16, "tensorwise");
  gather.train.fp8_param_gather = true;
  EXPECT_NEAR(StaticBytes(gather) - base, 0, 1e-6 * w);
  gather.model.fp8_recipe = "mxfp8";
  EXPECT_NEAR(StaticBytes(gather) - base, w / 16, 1e-6 * w);
}

TEST(Fp8MemoryTest, SavedInputsBytesPerElement) {
  EXPECT_EQ(Fp8SavedBytesPerElement(Fp8(DenseSpec(), "delayed").model), 1);
  EXPECT_EQ(Fp8SavedBytesPerElement(Fp8(DenseSpec(), "tensorwise").model), 1);
  EXPECT_EQ(Fp8SavedBytesPerElement(Fp8(DenseSpec(), "mxfp8").model), 1 + 1.0 / 32);
  EXPECT_EQ(Fp8SavedBytesPerElement(Fp8(DenseSpec(), "blockwise").model), 1 + 1.0 / 32);
}

TEST(Fp8MemoryTest, DenseLayerSavesNormOutputsAndFc2InputInFp8) {
  const SearchSpec bf16 = Te(DenseSpec());
  const double T = bf16.model.seq_length * bf16.train.micro_batch_size;
  const double h = bf16.model.hidden_size, f = bf16.model.EffectiveFfnHiddenSize();
  const double ad = bf16.model.num_attention_heads * bf16.model.EffectiveKvChannels();
  const LayerActivations base = EstimateLayerActivations(bf16, 0);
  for (const char* recipe : {"tensorwise", "mxfp8"}) {
    const SearchSpec s = Fp8(bf16, recipe);
    const double f8 = Fp8SavedBytesPerElement(s.model);
    const LayerActivations a = EstimateLayerActivations(s, 0);
    EXPECT_DOUBLE_EQ(a.layernorm, 2 * f8 * T * h) << recipe;                 // was 2 * 2 T h
    EXPECT_DOUBLE_EQ(base.mlp - a.mlp, (2 - f8) * T * f) << recipe;          // fc2's input
    EXPECT_DOUBLE_EQ(a.attn_other, base.attn_other) << recipe;               // context stays bf16
    EXPECT_DOUBLE_EQ(a.attn_inputs, base.attn_inputs) << recipe;             // attention is bf16
  }
  // Delayed scaling: linear_proj keeps an FP8 copy of the context beside the bf16 one.
  const LayerActivations delayed = EstimateLayerActivations(Fp8(bf16, "delayed"), 0);
  EXPECT_DOUBLE_EQ(delayed.attn_other - base.attn_other, 1 * T * ad);
}

TEST(Fp8MemoryTest, MoeLayerSavesExpertInputsInFp8) {
  const SearchSpec bf16 = Te(MoeSpec());
  const SearchSpec s = Fp8(bf16, "tensorwise");
  const LayerActivations base = EstimateLayerActivations(bf16, 0);
  const LayerActivations a = EstimateLayerActivations(s, 0);
  const double T = bf16.model.seq_length * bf16.train.micro_batch_size;
  const double N = T * bf16.model.moe_router_topk;  // token copies the experts process
  const double h = bf16.model.hidden_size, fm = *bf16.model.moe_ffn_hidden_size;
  const double fs = *bf16.model.moe_shared_expert_intermediate_size;
  EXPECT_DOUBLE_EQ(base.moe_router - a.moe_router, 1 * N * h);   // expert fc1's input
  EXPECT_DOUBLE_EQ(base.moe_act - a.moe_act, 1 * N * fm);        // expert fc2's input
  // Shared experts: fc2's input in FP8, and fc1's own FP8 copy of the bf16 norm output.
  EXPECT_DOUBLE_EQ(a.shared_experts - base.shared_experts, T * h - T * fs);
  // The MoE layer's pre-MLP norm is a separate TENorm: its output stays bf16.
  EXPECT_DOUBLE_EQ(a.layernorm, 1 * T * h + 2 * T * h);
}

}  // namespace
}  // namespace remat::search
