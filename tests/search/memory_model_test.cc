#include "search/memory_model.h"

#include <gtest/gtest.h>

#include <cmath>

#include "search/rules.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

using testing::DenseSpec;
using testing::MlaSpec;
using testing::MoeSpec;

// The setting of Korthikanti et al.'s Table 2: unfused attention, GELU, F = 4h, LayerNorm,
// biases, dropout 0.1, 16-bit softmax, learned positions, multi-head attention.
SearchSpec PaperSpec() {
  SearchSpec s;
  s.model.num_layers = 4;
  s.model.hidden_size = 1024;
  s.model.num_attention_heads = 16;
  s.model.seq_length = 1024;
  s.model.vocab_size = 1000;
  s.model.attention_softmax_in_fp32 = false;
  s.train.micro_batch_size = 2;
  return s;  // everything else is Megatron Core's default, which is the paper's setting
}

// LayerNorm keeps fp32 mean and rstd per token, twice per layer; the paper leaves them out.
double NormStats(const SearchSpec& s) {
  const double t = s.parallel.sequence_parallel ? s.parallel.tensor_model_parallel_size : 1;
  return 2 * 8.0 * s.model.seq_length * s.train.micro_batch_size / t;
}

Policy P(const char* text) { return ParsePolicy(text).value(); }

TEST(PaperFormula, NoParallelismWithinOnePercent) {
  const SearchSpec s = PaperSpec();
  const double paper = PaperActivationBytesPerLayer(s);
  EXPECT_DOUBLE_EQ(paper, 1024.0 * 2 * 1024 * (34 + 5.0 * 16 * 1024 / 1024));
  const double ours = EstimateLayerActivations(s, 0).Total();
  EXPECT_NEAR(ours, paper, 0.01 * paper);
  EXPECT_DOUBLE_EQ(ours - NormStats(s), paper);  // exactly the paper's tensors
}

TEST(PaperFormula, TensorParallel) {
  for (int t : {2, 4, 8}) {
    SearchSpec s = PaperSpec();
    s.parallel.tensor_model_parallel_size = t;
    const double paper = PaperActivationBytesPerLayer(s);
    const double sbh = 1024.0 * 2 * 1024;
    EXPECT_DOUBLE_EQ(paper, sbh * (10 + 24.0 / t + 5.0 * 16 * 1024 / (1024.0 * t)));
    const double ours = EstimateLayerActivations(s, 0).Total();
    EXPECT_NEAR(ours, paper, 0.01 * paper) << "t=" << t;
    EXPECT_DOUBLE_EQ(ours - NormStats(s), paper) << "t=" << t;
  }
}

TEST(PaperFormula, TensorAndSequenceParallel) {
  for (int t : {2, 4, 8}) {
    SearchSpec s = PaperSpec();
    s.parallel.tensor_model_parallel_size = t;
    s.parallel.sequence_parallel = true;
    const double paper = PaperActivationBytesPerLayer(s);
    const double sbh = 1024.0 * 2 * 1024;
    EXPECT_DOUBLE_EQ(paper, sbh * (34.0 / t + 5.0 * 16 * 1024 / (1024.0 * t)));
    const double ours = EstimateLayerActivations(s, 0).Total();
    EXPECT_NEAR(ours, paper, 0.01 * paper) << "t=" << t;
    EXPECT_DOUBLE_EQ(ours - NormStats(s), paper) << "t=" << t;
  }
}

TEST(PaperFormula, SelectiveCoreAttnLeavesThirtyFourSbh) {
  // The paper's selective recompute removes exactly the 5as^2b term.
  const SearchSpec s = PaperSpec();
  const LayerActivations a = EstimateLayerActivations(s, 0);
  const double sbh = 1024.0 * 2 * 1024;
  EXPECT_DOUBLE_EQ(a.Total() - a.core_attn - NormStats(s), 34 * sbh);
  EXPECT_DOUBLE_EQ(a.core_attn, 5.0 * 16 * 1024 * 1024 * 2);
}

TEST(Activations, Fp32SoftmaxAddsTwoBytesPerScore) {
  SearchSpec s = PaperSpec();
  const double bf16_softmax = EstimateLayerActivations(s, 0).Total();
  s.model.attention_softmax_in_fp32 = true;
  const double fp32_softmax = EstimateLayerActivations(s, 0).Total();
  const double a = 16, seq = 1024, b = 2;
  EXPECT_DOUBLE_EQ(fp32_softmax - bf16_softmax, a * seq * seq * b * 2);
}

TEST(Activations, DropoutMasksOnlyWithDropout) {
  SearchSpec s = PaperSpec();
  const LayerActivations with = EstimateLayerActivations(s, 0);
  s.model.attention_dropout = 0;
  s.model.hidden_dropout = 0;
  const LayerActivations without = EstimateLayerActivations(s, 0);
  const double scores = 16.0 * 1024 * 1024 * 2, sbh = 1024.0 * 2 * 1024;
  // Attention: the mask (1 byte) and the dropout output (2 bytes) per score go; the softmax
  // output (2 bytes) stays. Hidden: two 1-byte masks per token and channel.
  EXPECT_DOUBLE_EQ(with.core_attn - without.core_attn, 3 * scores);
  EXPECT_DOUBLE_EQ(with.Total() - without.Total(), 3 * scores + 2 * sbh);
}

TEST(Activations, Fp32PrecisionDoublesEveryActivation) {
  SearchSpec s = PaperSpec();
  s.model.attention_dropout = 0;  // masks stay 1 byte whatever the precision
  s.model.hidden_dropout = 0;
  const double bf16 = EstimateLayerActivations(s, 0).Total() - NormStats(s);
  s.train.precision = Precision::kFp32;
  const double fp32 = EstimateLayerActivations(s, 0).Total() - NormStats(s);
  EXPECT_DOUBLE_EQ(fp32, 2 * bf16);
}

TEST(Activations, SwigluKeepsFiveFfnWidths) {
  SearchSpec s = PaperSpec();
  const double tokens = 2048, f = 4096;
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(s, 0).mlp, 2 * 2 * tokens * f);  // GELU in, out
  s.model.gated_linear_unit = true;
  // fc1 output [2F], silu output [F], x_linear + glu_linear_offset [F] (Megatron's glu makes it
  // even at offset 0), gated product [F] (fusions off).
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(s, 0).mlp, 5 * 2 * tokens * f);
}

TEST(Activations, GqaCoreAttnKeepsGroupsAndDiscardsExpandedKv) {
  SearchSpec s = DenseSpec();  // 32 heads, 8 groups, RoPE, unfused
  const LayerActivations a = EstimateLayerActivations(s, 0);
  const double tokens = 4096, d = 128, e = 2;
  const double q = 32 * d, kv = 8 * d;
  // Checkpoint keeps rotated q and k and the fused QKV output (v is a view into it).
  EXPECT_DOUBLE_EQ(a.attn_inputs, e * tokens * (q + kv + (q + 2 * kv)));
  // Without recompute: rotated q and k, v repeated to all heads (copies).
  const double plain = e * tokens * 3 * q;
  const double scores = 32.0 * 4096 * 4096;
  EXPECT_DOUBLE_EQ(a.core_attn, scores * (4 + 2) + plain - a.attn_inputs);
}

// A fused kernel keeps q, k and v as core attention receives them, as core_attn's checkpoint
// does: RoPE's rotated q and k are new tensors, and v is a view that keeps the whole fused QKV
// output alive. The H200 layout proxies of Llama-3 70B and 405B (flash, GQA, RoPE) measured
// these; counting only the fused output left the model 4-11% low.
TEST(Activations, FlashKeepsRotatedQkAndTheFusedQkvOutput) {
  SearchSpec s = DenseSpec();  // 32 heads, 8 groups, RoPE
  s.model.attention_backend = AttentionBackend::kFlash;
  const double tokens = 4096, d = 128, e = 2;
  const double q = 32 * d, kv = 8 * d;
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(s, 0).attn_inputs, e * tokens * (q + kv + (q + 2 * kv)));
  // Learned positions: GQA's head reshape still copies q; k and v are views.
  s.model.position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(s, 0).attn_inputs, e * tokens * (q + (q + 2 * kv)));
  // MHA with learned positions: all three are views of the fused output.
  s.model.num_query_groups.reset();
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(s, 0).attn_inputs, e * tokens * 3 * q);
}

// Megatron's unfused apply_rotary_pos_emb casts cos and sin to the activation dtype on each of
// its two calls per layer and the multiplications save them: 4 [s, rot] tables per layer and
// micro-batch, independent of the batch size and TP (the CPU engine measured exactly this gap).
TEST(Activations, RopeHoldsFourCosSinTablesPerLayer) {
  SearchSpec s = DenseSpec();
  const double s_len = 4096, d = 128, e = 2;
  const double rope = EstimateLayerActivations(s, 0).attn_other;
  s.model.position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  const double learned = EstimateLayerActivations(s, 0).attn_other;
  EXPECT_DOUBLE_EQ(rope - learned, 4 * e * s_len * d);
  // MLA ropes inside the up-projection region: mla_up_proj discards the tables with it.
  const SearchSpec mla = MlaSpec();  // 16 heads, qk 128, pe 64, v 128
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(mla, 0).mla_up_proj,
                   e * s_len * 16 * (2 * (128 + 64) + 128) + 4 * e * s_len * 64);
}

TEST(Activations, FlashKeepsNoScores) {
  SearchSpec s = DenseSpec();
  s.model.attention_backend = AttentionBackend::kFlash;
  const LayerActivations a = EstimateLayerActivations(s, 0);
  EXPECT_DOUBLE_EQ(a.core_attn, 4.0 * 4096 * 32);  // fp32 logsumexp per query and head
  EXPECT_LT(a.core_attn, 0.01 * a.Total());
  s.search.device = Device::kCpu;  // no cuBLAS workspaces: the buffers are the scores' alone
  EXPECT_EQ(EstimateMemory(s, Policy::None()).buffer_bytes, 0);
}

// What a CUDA device adds: cuBLAS's two 32 MiB workspaces (the forward's thread and autograd's)
// to every rank's persistent buffers, and in unfused attention's backward the CUDA softmax
// backward's grad * output temporary: one more score tensor in the softmax's dtype.
TEST(StaticMemory, CudaAddsCublasWorkspacesAndTheSoftmaxBackwardsTemporary) {
  const double workspaces = 2 * 32.0 * 1024 * 1024;
  for (AttentionBackend backend : {AttentionBackend::kFlash, AttentionBackend::kUnfused}) {
    SearchSpec cuda = DenseSpec();  // search.device auto: a GPU
    cuda.model.attention_backend = backend;
    SearchSpec cpu = cuda;
    cpu.search.device = Device::kCpu;
    const MemoryEstimate g = EstimateMemory(cuda, Policy::None());
    const MemoryEstimate c = EstimateMemory(cpu, Policy::None());
    EXPECT_DOUBLE_EQ(g.buffer_bytes - c.buffer_bytes, workspaces);
    EXPECT_DOUBLE_EQ(g.static_bytes - c.static_bytes, workspaces);
    EXPECT_DOUBLE_EQ(g.activation_bytes, c.activation_bytes);
  }
  for (bool fp32 : {true, false}) {
    ModelSpec m = DenseSpec().model;
    m.attention_softmax_in_fp32 = fp32;
    const double softmax_bytes = fp32 ? 4 : 2;
    EXPECT_DOUBLE_EQ(UnfusedScoreChain(m, 2, true).backward_peak -
                         UnfusedScoreChain(m, 2, false).backward_peak,
                     softmax_bytes);
    EXPECT_DOUBLE_EQ(UnfusedScoreChain(m, 2, true).held, UnfusedScoreChain(m, 2, false).held);
  }
  // DenseSpec's control: its attention backward becomes the peak on a GPU, higher than the CPU's
  // peak by at most the temporary (one fp32 score tensor, b * a * s * s * 4).
  SearchSpec cuda = DenseSpec();
  SearchSpec cpu = cuda;
  cpu.search.device = Device::kCpu;
  const double rise = EstimateMemory(cuda, Policy::None()).peak_bytes -
                      EstimateMemory(cpu, Policy::None()).peak_bytes - workspaces;
  EXPECT_GT(rise, 0);
  EXPECT_LE(rise, 4.0 * 32 * 4096 * 4096);
}

TEST(Activations, MoeRegionsScaleWithTopk) {
  SearchSpec s = MoeSpec();  // 8 experts, top-2, F_moe 4096, shared 4096, SwiGLU
  const LayerActivations a = EstimateLayerActivations(s, 0);
  const double tokens = 4096, e = 2, f = 4096;
  EXPECT_DOUBLE_EQ(a.mlp, 0);
  EXPECT_DOUBLE_EQ(a.moe_expert_fc1, e * tokens * 2 * f * 2);
  EXPECT_DOUBLE_EQ(a.moe_act, e * tokens * 2 * f * 4);  // silu, x_linear + offset, product, ·probs
  EXPECT_DOUBLE_EQ(a.shared_experts, e * tokens * f * 5);
  s.model.moe_router_topk = 4;
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(s, 0).moe_act, 2 * a.moe_act);
}

TEST(StaticMemory, EighteenBytesPerHandCountedParameter) {
  SearchSpec s;
  s.search.device = Device::kCpu;  // the score buffer alone, without cuBLAS's workspaces
  s.model.num_layers = 2;
  s.model.hidden_size = 64;
  s.model.num_attention_heads = 4;
  s.model.ffn_hidden_size = 256;
  s.model.seq_length = 32;
  s.model.vocab_size = 100;
  // Per layer: 2 LayerNorms 2*(64+64); QKV 64*192 + 192; proj 64*64 + 64;
  // fc1 64*256 + 256; fc2 256*64 + 64.
  const double layer = 256 + (12288 + 192) + (4096 + 64) + (16384 + 256) + (16384 + 64);
  // Word embedding (the vocabulary padded to 128 rows, as Megatron does), learned positions,
  // final LayerNorm, untied output layer.
  const double total = 2 * layer + 128 * 64 + 2048 + 128 + 128 * 64;
  EXPECT_DOUBLE_EQ(total, 118528);
  EXPECT_DOUBLE_EQ(ParameterCount(s), total);
  MemoryEstimate e = EstimateMemory(s, Policy::None());
  EXPECT_DOUBLE_EQ(e.parameters, total);
  EXPECT_DOUBLE_EQ(e.static_bytes - e.buffer_bytes, 18 * total);
  EXPECT_DOUBLE_EQ(e.buffer_bytes, 2.0 * 4 * 32 * 32);  // baddbmm input [b*heads, s, s]

  s.train.use_distributed_optimizer = true;
  s.parallel.data_parallel_size = 4;
  e = EstimateMemory(s, Policy::None());
  EXPECT_DOUBLE_EQ(e.static_bytes - e.buffer_bytes, (6 + 12.0 / 4) * total);

  s.train.use_distributed_optimizer = false;
  s.train.precision = Precision::kFp32;
  e = EstimateMemory(s, Policy::None());
  EXPECT_DOUBLE_EQ(e.static_bytes - e.buffer_bytes, 16 * total);

  // TP 2: column-parallel weights and biases and row-parallel weights split, norms and
  // row-parallel biases replicated; the vocabulary padded to 256 rows, 128 per rank.
  s.train.precision = Precision::kBf16;
  s.parallel.tensor_model_parallel_size = 2;
  const double tp_layer = 256 + 6240 + (2048 + 64) + 8320 + (8192 + 64);
  EXPECT_DOUBLE_EQ(ParameterCount(s), 2 * tp_layer + 8192 + 2048 + 128 + 8192);
}

TEST(StaticMemory, RmsNormGqaNoBias) {
  SearchSpec s;
  s.model.num_layers = 1;
  s.model.hidden_size = 64;
  s.model.num_attention_heads = 4;
  s.model.num_query_groups = 2;
  s.model.ffn_hidden_size = 128;
  s.model.gated_linear_unit = true;
  s.model.normalization = Normalization::kRMSNorm;
  s.model.add_bias_linear = false;
  s.model.position_embedding_type = PositionEmbedding::kRope;
  s.model.seq_length = 32;
  s.model.vocab_size = 100;
  // Norms 2*64; QKV 64*(64+2*32); proj 64*64; fc1 64*256; fc2 128*64; embedding (padded to
  // 128 rows), final norm, output layer.
  const double total = 128 + 64 * 128 + 4096 + 64 * 256 + 128 * 64 + 8192 + 64 + 8192;
  EXPECT_DOUBLE_EQ(ParameterCount(s), total);
}

TEST(StaticMemory, MlaMatchesMegatronsFormula) {
  SearchSpec s = MlaSpec();  // RMSNorm, no biases, no q compression, dense layers
  const double h = 2048, a = 16, qk = 128, pe = 64, v = 128, kvl = 512, f = 10944, V = 102400;
  // Megatron's theoretical_memory_usage: q_term + kvl*(h + a*(qk+v) + norm) + h*pe + a*v*h.
  const double attn = h * a * (qk + pe) + kvl * (h + a * (qk + v) + 1) + h * pe + a * v * h;
  const double mlp = 2 * h * f * 1.5;
  const double layer = attn + mlp + 2 * h;
  EXPECT_DOUBLE_EQ(ParameterCount(s), 4 * layer + 2 * V * h + h);
  s.model.q_lora_rank = 1536;
  const double ql = 1536;
  const double attn_q = ql * (h + a * (qk + pe) + 1) + kvl * (h + a * (qk + v) + 1) + h * pe +
                        a * v * h;
  EXPECT_DOUBLE_EQ(ParameterCount(s), 4 * (attn_q + mlp + 2 * h) + 2 * V * h + h);
}

TEST(StaticMemory, ExpertsSplitOverExpertParallelRanks) {
  SearchSpec s = MoeSpec();
  const double one = ParameterCount(s);
  s.parallel.expert_model_parallel_size = 4;
  s.parallel.data_parallel_size = 4;
  const double per_expert = 3.0 * 4096 * 4096;  // SwiGLU fc1 [h, 2F] + fc2 [F, h]
  // 4 MoE layers, 8 experts each: EP 4 keeps 2 of them per layer.
  EXPECT_DOUBLE_EQ(one - ParameterCount(s), 4 * (8 - 2) * per_expert);
}

TEST(Policies, FullBelowCoreAttnBelowNoneUnfused) {
  for (const SearchSpec& s : {PaperSpec(), DenseSpec()}) {
    const double none = EstimateMemory(s, Policy::None()).peak_bytes;
    const double core = EstimateMemory(s, P("selective:[core_attn]")).peak_bytes;
    const double full = EstimateMemory(s, P("full:uniform:1")).peak_bytes;
    EXPECT_LT(full, core);
    EXPECT_LT(core, none);
  }
}

TEST(Policies, SelectivePeakFallsByAboutLMinusOneLayers) {
  // One layer's recomputed scores are live again during its backward (reference section 8).
  SearchSpec s = PaperSpec();
  s.model.num_layers = 8;
  const double saving = EstimateLayerActivations(s, 0).core_attn;
  const MemoryEstimate none = EstimateMemory(s, Policy::None());
  const MemoryEstimate core = EstimateMemory(s, P("selective:[core_attn]"));
  EXPECT_DOUBLE_EQ(none.activation_bytes - core.activation_bytes, 8 * saving);
  const double drop = none.peak_bytes - core.peak_bytes;
  EXPECT_GT(drop, 6.5 * saving);
  EXPECT_LT(drop, 7.5 * saving);
  EXPECT_GT(core.transient_bytes, saving);
}

TEST(Policies, CoreAttnSavesAlmostNothingUnderFlash) {
  SearchSpec s = DenseSpec();
  s.model.attention_backend = AttentionBackend::kFlash;
  const double layers = EstimateMemory(s, Policy::None()).layer_activation_bytes;
  const double saving = LabelSavingBytes(s, Label::kCoreAttn);
  EXPECT_GT(saving, 0);
  EXPECT_LT(saving, 0.01 * layers);
  // ... while it replays the whole attention core.
  EXPECT_DOUBLE_EQ(LabelRecomputeFlops(s, Label::kCoreAttn), 4 * 2.0 * 4096 * 4096 * 32 * 128);
  SearchSpec unfused = DenseSpec();
  EXPECT_GT(LabelSavingBytes(unfused, Label::kCoreAttn), 50 * saving);
}

TEST(Policies, MlaUpProjSavesTheExpandedQkv) {
  const SearchSpec s = MlaSpec();
  // Expanded query, key, value and the RoPE cos/sin tables of the region.
  const double per_layer = 2.0 * 4096 * 16 * (2 * (128 + 64) + 128) + 4 * 2.0 * 4096 * 64;
  EXPECT_DOUBLE_EQ(LabelSavingBytes(s, Label::kMlaUpProj), 4 * per_layer);
  EXPECT_GT(LabelRecomputeFlops(s, Label::kMlaUpProj), 0);
  EXPECT_EQ(LabelSavingBytes(DenseSpec(), Label::kMlaUpProj), 0);
  // mla_up_proj and core_attn discard disjoint regions: together they save the sum.
  const double none = EstimateMemory(s, Policy::None()).activation_bytes;
  const double both = EstimateMemory(s, P("selective:[core_attn,mla_up_proj]")).activation_bytes;
  EXPECT_DOUBLE_EQ(none - both, LabelSavingBytes(s, Label::kMlaUpProj) +
                                    LabelSavingBytes(s, Label::kCoreAttn));
}

TEST(Policies, MoeActSavesOnGroupedMoe) {
  const SearchSpec s = MoeSpec();
  EXPECT_GT(LabelSavingBytes(s, Label::kMoeAct), 0);
  EXPECT_LT(EstimateMemory(s, P("selective:[moe_act]")).peak_bytes,
            EstimateMemory(s, Policy::None()).peak_bytes);
  // Its replay is elementwise: far cheaper than replaying the experts.
  EXPECT_LT(100 * LabelRecomputeFlops(s, Label::kMoeAct), LabelRecomputeFlops(s, Label::kMoe));
}

TEST(Policies, MlpSavesNothingOnAnAllMoeModel) {
  SearchSpec s = MoeSpec();  // moe_layer_freq 1: every layer MoE
  EXPECT_EQ(LabelSavingBytes(s, Label::kMlp), 0);
  EXPECT_EQ(LabelRecomputeFlops(s, Label::kMlp), 0);
  EXPECT_DOUBLE_EQ(EstimateMemory(s, P("selective:[mlp]")).peak_bytes,
                   EstimateMemory(s, Policy::None()).peak_bytes);
  // With a dense first layer, mlp acts there only; moe_act only on the MoE layers.
  s.model.moe_layer_freq.pattern = {0, 1, 1, 1};
  EXPECT_DOUBLE_EQ(LabelSavingBytes(s, Label::kMlp), EstimateLayerActivations(s, 0).mlp);
  EXPECT_DOUBLE_EQ(LabelSavingBytes(s, Label::kMoeAct), 3 * EstimateLayerActivations(s, 1).moe_act);
}

TEST(Policies, MoeSupersedesMoeActAndSharedExperts) {
  const SearchSpec s = MoeSpec();
  const MemoryEstimate moe = EstimateMemory(s, P("selective:[moe]"));
  const MemoryEstimate all = EstimateMemory(s, P("selective:[moe_act,moe,shared_experts]"));
  EXPECT_DOUBLE_EQ(moe.activation_bytes, all.activation_bytes);
  EXPECT_DOUBLE_EQ(moe.recompute_flops, all.recompute_flops);
  EXPECT_DOUBLE_EQ(LabelSavingBytes(s, Label::kMoe),
                   4 * EstimateLayerActivations(s, 0).Moe());
  EXPECT_GT(LabelSavingBytes(s, Label::kMoe),
            LabelSavingBytes(s, Label::kMoeAct) + LabelSavingBytes(s, Label::kSharedExperts));
}

TEST(Policies, FullRecomputeKeepsOneInputPerGroup) {
  SearchSpec s = DenseSpec();
  s.model.num_layers = 7;
  const double input = 2.0 * 4096 * 4096;
  for (int n = 1; n <= 7; ++n) {
    const MemoryEstimate e = EstimateMemory(s, Policy::Full(RecomputeMethod::kUniform, n));
    EXPECT_DOUBLE_EQ(e.layer_activation_bytes, std::ceil(7.0 / n) * input) << n;
  }
  // A bigger group rematerialises more at once.
  EXPECT_LT(EstimateMemory(s, P("full:uniform:1")).transient_bytes,
            EstimateMemory(s, P("full:uniform:3")).transient_bytes);
  // distribute_saved_activations splits the kept inputs over TP.
  s.parallel.tensor_model_parallel_size = 2;
  s.model.distribute_saved_activations = true;
  EXPECT_DOUBLE_EQ(EstimateMemory(s, P("full:uniform:1")).layer_activation_bytes, 7 * input / 2);
}

TEST(Policies, MonotonicInBlockLayers) {
  SearchSpec s = DenseSpec();
  s.model.num_layers = 6;
  MemoryEstimate prev = EstimateMemory(s, Policy::None());
  for (int n = 1; n <= 6; ++n) {
    const MemoryEstimate e = EstimateMemory(s, Policy::Full(RecomputeMethod::kBlock, n));
    EXPECT_LT(e.activation_bytes, prev.activation_bytes) << n;
    EXPECT_LE(e.peak_bytes, prev.peak_bytes) << n;
    EXPECT_GT(e.recompute_flops, prev.recompute_flops) << n;
    prev = e;
  }
  // Every layer checkpointed alone: block:L is uniform:1.
  EXPECT_DOUBLE_EQ(prev.peak_bytes, EstimateMemory(s, P("full:uniform:1")).peak_bytes);
  // N beyond the stage is clamped.
  EXPECT_DOUBLE_EQ(EstimateMemory(s, P("full:block:9")).peak_bytes, prev.peak_bytes);
}

TEST(Policies, SmallestFittingBlock) {
  SearchSpec s = DenseSpec();
  const double b2 = EstimateMemory(s, P("full:block:2")).peak_bytes;
  const double b3 = EstimateMemory(s, P("full:block:3")).peak_bytes;
  ASSERT_LT(b3, b2);
  EXPECT_EQ(SmallestFittingBlock(s, b2), 2);
  EXPECT_EQ(SmallestFittingBlock(s, (b2 + b3) / 2), 3);
  EXPECT_EQ(SmallestFittingBlock(s, 1.0), std::nullopt);
}

TEST(Logits, Fp32SoftmaxOfTheLogitsIsHeld) {
  SearchSpec s = PaperSpec();  // vocabulary 1000, padded to 1024
  const double tokens = 2048;
  EXPECT_DOUBLE_EQ(EstimateMemory(s, Policy::None()).logits_bytes, 4 * tokens * 1024 + 9 * tokens);
  s.parallel.tensor_model_parallel_size = 2;
  EXPECT_DOUBLE_EQ(EstimateMemory(s, Policy::None()).logits_bytes, 4 * tokens * 512 + 9 * tokens);
  s.parallel.pipeline_model_parallel_size = 2;  // only the last stage has the output layer
  const MemoryEstimate e = EstimateMemory(s, Policy::None());
  ASSERT_EQ(e.stages.size(), 2u);
  EXPECT_EQ(e.stages[0].logits_bytes, 0);
  EXPECT_DOUBLE_EQ(e.stages[1].logits_bytes, 4 * tokens * 512 + 9 * tokens);
}

TEST(Flops, HandComputedSmallModel) {
  SearchSpec s;
  s.model.num_layers = 1;
  s.model.hidden_size = 4;
  s.model.num_attention_heads = 2;
  s.model.ffn_hidden_size = 16;
  s.model.seq_length = 8;
  s.model.vocab_size = 256;  // a multiple of 128 * TP: no padding
  // T = 8 tokens, b*s^2 = 64. q = k = v = 4 (2 heads of 2).
  // Attention linear: 3*2*(h*(q+k+v) + q*h) = 6*(4*12 + 16) = 384 per token.
  // MLP: 3*2*h*F*2 = 768 per token. Logits: 3*2*h*V = 6144 per token.
  // Core: 3*2*q/2*2 = 24 per b*s^2.
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(s), 8 * (384 + 768 + 6144) + 64 * 24);
  EXPECT_DOUBLE_EQ(EstimateMemory(s, Policy::None()).model_flops, 59904);
  // Replays, forward only: core 2*b*s^2*heads*d; MLP GEMMs 2*T*h*F*2 plus GELU (8 per element).
  EXPECT_DOUBLE_EQ(LabelRecomputeFlops(s, Label::kCoreAttn), 2 * 64 * 2 * 2);
  EXPECT_DOUBLE_EQ(LabelRecomputeFlops(s, Label::kMlp), 2 * 8 * 4 * 16 * 2 + 8 * 8 * 16);
  EXPECT_DOUBLE_EQ(LabelRecomputeFlops(s, Label::kLayernorm), 2 * 8 * 4 * 8);
  // Full recompute replays the layer's forward: a third of its model FLOPs plus elementwise.
  const double layer_model = 8 * (384 + 768) + 64 * 24;
  const double elementwise = 8 * 8 * 16 + 2 * 8 * 4 * 8;
  EXPECT_DOUBLE_EQ(EstimateMemory(s, P("full:uniform:1")).recompute_flops,
                   layer_model / 3 + elementwise);
  s.parallel.tensor_model_parallel_size = 2;
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(s), 59904 / 2);
}

TEST(Flops, MoeAndMlaFollowMegatron) {
  SearchSpec s = MoeSpec();
  const double h = 4096, T = 4096, F = 14336, fm = 4096, k = 2, V = 128256;
  const double q = 4096, kv = 1024;
  const double attn = 6 * (h * (q + 2 * kv) + q * h);
  const double ffn = 6 * h * (fm * k * 3 * 4 + fm * 3 * 4);
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(s), T * (ffn + 4 * attn + 6 * h * V) + T * T * 6 * q * 4);
  (void)F;
  SearchSpec m = MlaSpec();
  const double a = 16, qk = 128, pe = 64, v = 128, kvl = 512, hm = 2048;
  const double mla = 6 * (hm * a * (qk + pe) + kvl * (hm + a * (qk + v) + 1) + hm * pe + a * v * hm);
  const double core = 6 * (a * (qk + pe) / 2 + a * v / 2);
  const double mlp = 6 * hm * 10944 * 3;
  EXPECT_DOUBLE_EQ(ModelFlopsPerStep(m),
                   T * (4 * mlp + 4 * mla + 6 * hm * 102400) + T * T * core * 4);
}

TEST(Peak, IsStaticPlusActivationsPlusTransient) {
  for (const SearchSpec& s : {PaperSpec(), DenseSpec(), MlaSpec(), MoeSpec()}) {
    for (const char* p : {"selective:[]", "selective:[core_attn]", "full:uniform:2",
                          "full:block:1"}) {
      const MemoryEstimate e = EstimateMemory(s, P(p));
      EXPECT_DOUBLE_EQ(e.peak_bytes, e.static_bytes + e.activation_bytes + e.transient_bytes);
      EXPECT_GE(e.transient_bytes, 0);
      EXPECT_GT(e.activation_bytes, e.layer_activation_bytes);
    }
  }
}

TEST(PipelineStages, EmbeddingOnTheFirstStageOutputLayerOnTheLast) {
  SearchSpec s = PaperSpec();
  s.parallel.pipeline_model_parallel_size = 2;
  const double h = 1024, vocab = 1024, positions = 1024 * 1024;
  MemoryEstimate e = EstimateMemory(s, Policy::None());
  // Same layers on both stages: the first adds word + position embeddings, the last the final
  // LayerNorm and the output layer.
  EXPECT_DOUBLE_EQ(e.stages[0].parameters - e.stages[1].parameters,
                   vocab * h + positions - (2 * h + vocab * h));
  // Tied embeddings: with PP > 1 the last stage still keeps its copy of the word embedding.
  s.model.share_embeddings_and_output_weights = true;
  const MemoryEstimate tied = EstimateMemory(s, Policy::None());
  EXPECT_DOUBLE_EQ(tied.stages[1].parameters, e.stages[1].parameters);
  s.parallel.pipeline_model_parallel_size = 1;
  EXPECT_DOUBLE_EQ(EstimateMemory(s, Policy::None()).parameters,
                   tied.stages[0].parameters + tied.stages[1].parameters - vocab * h);
}

// The Transformer Engine layer and Megatron's fusions (docs/transformer-engine.md).

// Megatron's fused SwiGLU (bias_activation_fusion) keeps fc1's output [2F], which it needs to
// recompute the gate, and makes one product [F]: 3 F-wide tensors instead of the unfused 5.
TEST(Fusions, FusedSwigluKeepsThreeFfnWidths) {
  SearchSpec s = DenseSpec();
  const double tokens = 4096, e = 2, f = 14336;
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(s, 0).mlp, 5 * e * tokens * f);
  s.model.bias_activation_fusion = true;
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(s, 0).mlp, 3 * e * tokens * f);
  // Shared experts are such an MLP; the routed experts' activation keeps one output per token.
  SearchSpec moe = MoeSpec();
  const LayerActivations unfused = EstimateLayerActivations(moe, 0);
  moe.model.bias_activation_fusion = true;
  const LayerActivations fused = EstimateLayerActivations(moe, 0);
  EXPECT_DOUBLE_EQ(fused.shared_experts, unfused.shared_experts * 3 / 5);
  EXPECT_DOUBLE_EQ(fused.moe_act, unfused.moe_act / 4);
}

// Fused RoPE keeps no cos/sin tables per layer.
TEST(Fusions, FusedRopeKeepsNoTables) {
  SearchSpec s = DenseSpec();
  const double rope = EstimateLayerActivations(s, 0).attn_other;
  s.model.apply_rope_fusion = true;
  EXPECT_DOUBLE_EQ(rope - EstimateLayerActivations(s, 0).attn_other, 4 * 2.0 * 4096 * 128);
}

// Transformer Engine's fused attention copies the strided v: it keeps q, k and v (W_f wide), not
// the whole fused QKV output behind a view.
TEST(TransformerEngine, FusedAttentionKeepsQkvCopies) {
  SearchSpec s = DenseSpec();  // 32 heads, 8 groups, RoPE
  s.model.attention_backend = AttentionBackend::kFlash;
  s.model.transformer_impl = TransformerImpl::kTransformerEngine;
  const double tokens = 4096, d = 128, e = 2;
  EXPECT_DOUBLE_EQ(EstimateLayerActivations(s, 0).attn_inputs, e * tokens * (32 + 16) * d);
}

// A dense layer's norms are fused into the linears after them: `layernorm` discards nothing and
// is no valid label; on an MoE layer the pre-MLP norm is separate and is discarded.
TEST(TransformerEngine, LayernormDiscardsOnlySeparateNorms) {
  SearchSpec dense = DenseSpec();
  dense.model.transformer_impl = TransformerImpl::kTransformerEngine;
  EXPECT_DOUBLE_EQ(EstimateMemory(dense, P("selective:[layernorm]")).activation_bytes,
                   EstimateMemory(dense, Policy::None()).activation_bytes);
  EXPECT_FALSE(ValidatePolicy(dense, P("selective:[layernorm]")).ok());
  SearchSpec moe = MoeSpec();
  const double local_saving = EstimateMemory(moe, Policy::None()).activation_bytes -
                              EstimateMemory(moe, P("selective:[layernorm]")).activation_bytes;
  moe.model.transformer_impl = TransformerImpl::kTransformerEngine;
  const double te_saving = EstimateMemory(moe, Policy::None()).activation_bytes -
                           EstimateMemory(moe, P("selective:[layernorm]")).activation_bytes;
  EXPECT_GT(te_saving, 0);
  EXPECT_NEAR(te_saving, local_saving / 2, 1);
}

// Static bytes per parameter with the distributed optimizer over DP 4: 2 (bf16 weight) + the
// gradient buffer (4 in fp32, 2 in bf16) + the optimizer's state / DP: fp32 master and moments
// (12), or the precision-aware optimizer's remainder (2) and moments in their dtypes.
TEST(StaticMemory, GradientBufferAndOptimizerDtypes) {
  SearchSpec s = DenseSpec();
  s.parallel.data_parallel_size = 4;
  s.train.use_distributed_optimizer = true;
  const double params = ParameterCount(s);
  auto static_bytes = [&](const SearchSpec& spec) {
    return EstimateMemory(spec, Policy::None()).static_bytes;
  };
  const double fp32_grads = static_bytes(s);
  s.train.grad_reduce_in_fp32 = false;
  EXPECT_NEAR(fp32_grads - static_bytes(s), 2 * params, 1e-6 * params);
  const double bf16_grads = static_bytes(s);
  s.train.use_precision_aware_optimizer = true;
  s.train.exp_avg_dtype = DType::kBf16;
  s.train.exp_avg_sq_dtype = DType::kBf16;
  // (12 - (2 + 2 + 2)) / 4 bytes less per parameter.
  EXPECT_NEAR(bf16_grads - static_bytes(s), 1.5 * params, 1e-6 * params);
  // Megatron-FSDP sharding the gradients and the weights too.
  s.train.use_precision_aware_optimizer = false;
  s.train.exp_avg_dtype = s.train.exp_avg_sq_dtype = DType::kFp32;
  s.train.use_distributed_optimizer = false;
  s.train.use_megatron_fsdp = true;
  s.train.data_parallel_sharding_strategy = ShardingStrategy::kOptimGradsParams;
  EXPECT_NEAR(bf16_grads - static_bytes(s), (2 + 2) * 0.75 * params, 1e-6 * params);
}

}  // namespace
}  // namespace remat::search
