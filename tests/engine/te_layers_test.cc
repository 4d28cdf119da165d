// The fused layers and the Transformer Engine layer in the engine (engine/te_layers.h): the same
// loss and gradient norm as the unfused local layer for the control and every valid policy
// (fp32, dropout 0), and the activation bytes per layer the memory model predicts for them
// (measured by the counting allocator on CPU: peak - static at 4 layers minus at 2 layers, halved).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/trial_runner.h"
#include "search/memory_model.h"
#include "search/policy.h"
#include "search/rules.h"
#include "tests/engine/test_models.h"

namespace remat::engine {
namespace {

using search::AttentionBackend;
using search::Policy;
using search::TrialResult;
using search::TrialStatus;

using testing::RelDiff;
using testing::RunInProcess;
Policy P(const std::string& text) { return testing::ParsedPolicy(text); }

// Megatron's fused path: fused SwiGLU, RoPE and bias-dropout-add, the native cross-entropy
// fusion, a fused attention kernel; with `te` the Transformer Engine layer (norms fused into the
// linears, TE's contiguous q, k, v).
search::SearchSpec Fused(search::SearchSpec s, bool te) {
  s.name += te ? "-te" : "-fused";
  s.model.transformer_impl =
      te ? search::TransformerImpl::kTransformerEngine : search::TransformerImpl::kLocal;
  s.model.attention_backend = AttentionBackend::kFlash;
  s.model.bias_activation_fusion = true;
  s.model.apply_rope_fusion = s.model.position_embedding_type == search::PositionEmbedding::kRope;
  s.model.bias_dropout_fusion = true;
  s.model.cross_entropy_loss_fusion = true;
  return s;
}

// The control, every valid single label and full recompute of `fused` (or the first `limit` of
// them) against the unfused local control.
void ExpectSameTraining(const search::SearchSpec& local, const search::SearchSpec& fused,
                        size_t limit = 1000) {
  ASSERT_EQ(search::BuiltinBackendProblem(fused), "");
  const TrialResult control = RunInProcess(local, Policy::None());
  ASSERT_EQ(control.status, TrialStatus::kOk) << control.message;
  std::vector<Policy> policies;
  for (const Policy& p : search::EnumerateValidPolicies(fused)) {
    if (p.IsFull() ? p.num_layers == 1 : p.labels.size() <= 1) policies.push_back(p);
  }
  if (policies.size() > limit) policies.resize(limit);
  for (const Policy& policy : policies) {
    const TrialResult r = RunInProcess(fused, policy);
    const std::string name = fused.name + " " + policy.ToString();
    ASSERT_EQ(r.status, TrialStatus::kOk) << name << ": " << r.message;
    EXPECT_LT(RelDiff(r.loss, control.loss), 1e-5) << name;
    EXPECT_LT(RelDiff(r.grad_norm, control.grad_norm), 1e-5) << name;
  }
}

TEST(TeLayersTest, DenseFusedAndTeLayersTrainAsTheUnfusedLayer) {
  const search::SearchSpec local = testing::TinyDense();
  ExpectSameTraining(local, Fused(local, /*te=*/false));
  ExpectSameTraining(local, Fused(local, /*te=*/true));
}

// LayerNorm, GELU (the fused GELU keeps what the unfused one keeps: unfused), biases (fused
// into SwiGLU and bias-dropout-add) and learned positions.
TEST(TeLayersTest, BiasesAndLayerNormTrainAsTheUnfusedLayer) {
  search::SearchSpec local = testing::TinyDenseDropout();
  local.model.attention_dropout = local.model.hidden_dropout = 0.0;
  ExpectSameTraining(local, Fused(local, /*te=*/true), 4);
  local.model.gated_linear_unit = true;  // bias + SwiGLU fused
  ExpectSameTraining(local, Fused(local, /*te=*/true), 4);
}

TEST(TeLayersTest, MoeAndMlaTrainAsTheUnfusedLayer) {
  const search::SearchSpec moe = testing::TinyMoe();
  ExpectSameTraining(moe, Fused(moe, /*te=*/true), 6);
  search::SearchSpec sequential = moe;  // weighted SwiGLU with the probabilities per expert
  sequential.model.moe_grouped_gemm = false;
  ExpectSameTraining(sequential, Fused(sequential, /*te=*/false), 2);
  const search::SearchSpec mla = testing::TinyMla();
  ExpectSameTraining(mla, Fused(mla, /*te=*/true), 6);
}

// With dropout the fused paths draw their own masks: not comparable to the unfused loss, but
// they train and recompute replays them exactly.
TEST(TeLayersTest, DropoutIsReplayedExactly) {
  const search::SearchSpec fused = Fused(testing::TinyDenseDropout(), /*te=*/true);
  const TrialResult control = RunInProcess(fused, Policy::None());
  ASSERT_EQ(control.status, TrialStatus::kOk) << control.message;
  for (const char* policy : {"selective:[core_attn]", "selective:[mlp]", "full:uniform:1"}) {
    const TrialResult r = RunInProcess(fused, P(policy));
    ASSERT_EQ(r.status, TrialStatus::kOk) << policy << ": " << r.message;
    EXPECT_LT(RelDiff(r.loss, control.loss), 1e-5) << policy;
    EXPECT_LT(RelDiff(r.grad_norm, control.grad_norm), 1e-5) << policy;
  }
}

// Activation bytes per layer, measured and modelled, for one spec and policy.
struct PerLayer {
  double measured = 0, modelled = 0;
};

PerLayer MeasurePerLayer(search::SearchSpec spec, const Policy& policy) {
  PerLayer out;
  double held[2] = {0, 0}, model[2] = {0, 0};
  const int depths[2] = {4, 2};
  for (int i = 0; i < 2; ++i) {
    spec.model.num_layers = depths[i];
    const TrialResult r = RunInProcess(spec, policy);
    EXPECT_EQ(r.status, TrialStatus::kOk) << r.message;
    held[i] = static_cast<double>(r.PeakAllocatedBytes()) - r.ranks.at(0).static_bytes;
    model[i] = search::EstimateMemory(spec, policy).layer_activation_bytes;
  }
  out.measured = (held[0] - held[1]) / 2;
  out.modelled = (model[0] - model[1]) / 2;
  std::printf("%-24s %-24s measured %9.0f B/layer, model %9.0f (model/measured %.3f)\n",
              spec.name.c_str(), policy.ToString().c_str(), out.measured, out.modelled,
              out.modelled / out.measured);
  return out;
}

search::SearchSpec Bf16(search::SearchSpec s) {
  s.train.precision = search::Precision::kBf16;
  s.model.seq_length = 128;  // per-layer bytes well above the allocator's small change
  return s;
}

// The Transformer Engine layer's saved tensors (docs/transformer-engine.md section 10): the
// control, mlp, core_attn and full recompute within a few percent of the memory model.
TEST(TeLayersTest, TeLayerActivationBytesMatchTheMemoryModel) {
  const search::SearchSpec te = Fused(Bf16(testing::TinyDense()), /*te=*/true);
  const PerLayer control = MeasurePerLayer(te, Policy::None());
  // core_attn keeps q, k, v as Megatron passes them: v's view pins the fused QKV output, so the
  // layer holds more than without it (the memory model's TeCoreAttnPinned).
  for (const char* policy :
       {"selective:[]", "selective:[mlp]", "selective:[core_attn]", "full:uniform:1"}) {
    const PerLayer p = MeasurePerLayer(te, P(policy));
    EXPECT_LT(RelDiff(p.modelled, p.measured), 0.04)
        << policy << ": measured " << p.measured << ", model " << p.modelled;
  }
  // layernorm has nothing to discard on a dense TE layer (its norms live in the linears): it is
  // not a valid policy there.
  for (const Policy& p : search::EnumerateValidPolicies(te)) {
    EXPECT_FALSE(p.Has(search::Label::kLayernorm)) << p.ToString();
  }
  // The fused SwiGLU keeps 3 F-wide tensors instead of 5; fused RoPE no tables; the fused
  // attention no s x s tensors: the TE layer holds far less than the unfused local one.
  const PerLayer unfused = MeasurePerLayer(Bf16(testing::TinyDense()), Policy::None());
  EXPECT_LT(control.measured, 0.7 * unfused.measured);
}

// Grouped experts with the fused weighted SwiGLU: moe_act frees only the activation's output.
TEST(TeLayersTest, TeMoeLayerActivationBytesMatchTheMemoryModel) {
  search::SearchSpec moe = Bf16(testing::TinyMoe());
  moe.model.moe_layer_freq.pattern.clear();  // every layer MoE: the depth pair differs by MoE layers
  const search::SearchSpec te = Fused(moe, /*te=*/true);
  for (const char* policy : {"selective:[]", "selective:[moe_act]", "selective:[layernorm]"}) {
    const PerLayer p = MeasurePerLayer(te, P(policy));
    EXPECT_LT(RelDiff(p.modelled, p.measured), 0.04)
        << policy << ": measured " << p.measured << ", model " << p.modelled;
  }
}

TEST(TeLayersTest, FusedLocalLayerActivationBytesMatchTheMemoryModel) {
  const search::SearchSpec fused = Fused(Bf16(testing::TinyDense()), /*te=*/false);
  for (const char* policy : {"selective:[]", "selective:[core_attn]", "selective:[layernorm]"}) {
    const PerLayer p = MeasurePerLayer(fused, P(policy));
    EXPECT_LT(RelDiff(p.modelled, p.measured), 0.04)
        << policy << ": measured " << p.measured << ", model " << p.modelled;
  }
}

// Megatron's native cross-entropy fusion holds one more fp32 logits buffer for a moment in the
// loss's forward (engine/ops.h SoftmaxExp). On a model whose peak is the loss (one layer, a
// vocabulary far wider than the hidden size, bf16) the engine's peak rises by that buffer, the
// memory model's by the same bytes, and training does not change.
TEST(TeLayersTest, NativeCrossEntropyFusionHoldsOneMoreLogitsBuffer) {
  search::SearchSpec unfused = Bf16(testing::TinyDense());
  unfused.model.num_layers = 1;
  unfused.model.vocab_size = 8192;
  search::SearchSpec fused = unfused;
  fused.model.cross_entropy_loss_fusion = true;
  ASSERT_EQ(fused.model.cross_entropy_fusion_impl, search::CrossEntropyFusionImpl::kNative);
  const TrialResult a = RunInProcess(unfused, Policy::None());
  const TrialResult b = RunInProcess(fused, Policy::None());
  ASSERT_EQ(a.status, TrialStatus::kOk) << a.message;
  ASSERT_EQ(b.status, TrialStatus::kOk) << b.message;
  EXPECT_LT(RelDiff(b.loss, a.loss), 1e-6);
  EXPECT_LT(RelDiff(b.grad_norm, a.grad_norm), 1e-6);
  const double tokens = static_cast<double>(unfused.model.seq_length) *
                        unfused.train.micro_batch_size;
  const double buffer = 4 * tokens * static_cast<double>(search::PaddedVocabSize(fused));
  const double measured = static_cast<double>(b.PeakAllocatedBytes()) -
                          static_cast<double>(a.PeakAllocatedBytes());
  const double modelled = search::EstimateMemory(fused, Policy::None()).peak_bytes -
                          search::EstimateMemory(unfused, Policy::None()).peak_bytes;
  std::printf("native fusion: buffer %.0f, measured %+.0f, model %+.0f\n", buffer, measured,
              modelled);
  EXPECT_LT(RelDiff(measured, buffer), 0.02) << measured;
  EXPECT_LT(RelDiff(modelled, buffer), 0.02) << modelled;
}

}  // namespace
}  // namespace remat::engine
