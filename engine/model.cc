#include "engine/model.h"

#include "engine/context_parallel.h"
#include "engine/fp8_linear.h"
#include "engine/te_layers.h"
#include "engine/model_params.h"
#include "engine/moe_dispatch.h"
#include "engine/mtp_block.h"
#include "engine/te_cross_entropy.h"
#include "search/pipeline_layout.h"

#include <torch/version.h>

#include <cmath>
#include <stdexcept>

namespace remat::engine {

using search::Label;
using search::ModelSpec;

namespace {

// TransformerConfig.glu_linear_offset's default (the spec has no field for it).
constexpr double kGluLinearOffset = 0.0;

constexpr double kNormEps = 1e-5;  // Megatron's layernorm_epsilon

struct Recompute {
  bool core_attn = false, moe_act = false, layernorm = false, mla_up_proj = false, mlp = false,
       moe = false, shared_experts = false;
  bool full = false;
  search::RecomputeMethod method = search::RecomputeMethod::kUniform;
  int num_layers = 0;
};

Recompute RecomputeOf(const search::Policy& p) {
  Recompute r;
  if (p.IsFull()) {
    r.full = true;
    r.method = p.method;
    r.num_layers = p.num_layers;
    return r;
  }
  r.core_attn = p.Has(Label::kCoreAttn);
  r.moe_act = p.Has(Label::kMoeAct);
  r.layernorm = p.Has(Label::kLayernorm);
  r.mla_up_proj = p.Has(Label::kMlaUpProj);
  r.mlp = p.Has(Label::kMlp);
  r.moe = p.Has(Label::kMoe);
  r.shared_experts = p.Has(Label::kSharedExperts);
  return r;
}

at::Tensor One(const std::vector<at::Tensor>& v) { return v.at(0); }

// model.moe_router_force_load_balancing: Megatron's benchmark routing (TopKRouter.forward applies
// apply_random_logits, a RandomSTE: Megatron-LM megatron/core/transformer/moe/router.py and
// moe_utils.py at d98e8a6). The forward sees standard-normal logits, so every expert gets about
// the same number of tokens whatever the weights; the backward passes the gradient to the real
// logits unchanged (a straight-through estimator). Drawn from the device generator, which the
// checkpoints capture and replay (ops.cc), so a recomputed router routes as the first forward did.
at::Tensor ForcedBalanceLogits(const at::Tensor& logits) {
  return logits + (at::randn_like(logits) - logits).detach();
}

}  // namespace

std::string UnsupportedReason(const search::SearchSpec& spec, const search::Policy& policy) {
  // The spec-wide rules have one home each (search/spec.h): Megatron's in ValidateSpec, this
  // engine's limits in BuiltinBackendProblem, which the coordinator checks at submit. Checked
  // again here for callers that come straight to the engine.
  if (const search::Status valid = search::ValidateSpec(spec); !valid.ok()) {
    return valid.message();
  }
  if (std::string problem = search::BuiltinBackendProblem(spec); !problem.empty()) return problem;
  if (search::MtpLayerCount(spec) > 0 && policy.IsFull() &&
      policy.method == search::RecomputeMethod::kUniform && policy.num_layers != 1) {
    // Megatron-LM multi_token_prediction.py at d98e8a6 (_checkpointed_forward) asserts it.
    return "recompute_num_layers must be 1 for MTP recompute (full:uniform:N with N != 1 and "
           "model.mtp_num_layers > 0 fails in Megatron)";
  }
  if (policy.Has(Label::kGdnNormOut)) {
    return "the builtin engine has no Gated DeltaNet model: gdn_norm_out cannot be measured here";
  }
  // flash runs everywhere: scaled_dot_product_attention on a GPU with LibTorch >= 2.5, else the
  // memory-equivalent reference kernel (engine/te_layers.h).
  return "";
}

struct GptModel::Impl : ModelParams {
  search::SearchSpec spec;
  const ModelSpec& m;
  Recompute rc;
  const Runtime& rt;
  at::ScalarType dtype;

  int tp, tp_rank, heads, groups, kv_channels, hidden, seq, ffn, vocab_padded;
  int ep, ep_rank, etp, local_experts;
  bool sp;
  at::Tensor causal_mask;    // [s, s] bool, true above the diagonal (masked)
  at::Tensor score_buffer;   // Megatron's persistent baddbmm input: [b*heads, s, s]

  std::vector<search::StageChunk> chunks;  // this pipeline rank's
  bool first_stage = true, last_stage = true;
  // Transformer Engine's FP8 linears (model.fp8 under transformer_engine), else null.
  std::unique_ptr<Fp8Linears> fp8;

  Impl(const search::SearchSpec& s, const search::Policy& p, const Runtime& r, at::ScalarType dt)
      : spec(s), m(spec.model), rc(RecomputeOf(p)), rt(r), dtype(dt) {
    tp = spec.parallel.tensor_model_parallel_size;
    tp_rank = rt.tp_rank();
    heads = m.num_attention_heads;
    groups = m.EffectiveQueryGroups();
    kv_channels = m.EffectiveKvChannels();
    hidden = m.hidden_size;
    seq = m.seq_length;
    ffn = m.EffectiveFfnHiddenSize();
    vocab_padded = static_cast<int>(search::PaddedVocabSize(spec));
    sp = spec.parallel.sequence_parallel && tp > 1;
    ep = rt.ep_size();
    ep_rank = rt.ep_rank();
    etp = rt.etp_size();
    local_experts = m.IsMoe() ? *m.num_moe_experts / ep : 0;
    const int pp_rank = rt.pp.size() > 0 ? rt.pp.rank : 0;
    chunks = search::ChunksOf(spec, pp_rank);
    first_stage = pp_rank == 0;
    last_stage = pp_rank == spec.parallel.pipeline_model_parallel_size - 1;
    Declare(spec, rt, chunks, first_stage, last_stage);
    if (!m.fp8.empty() && m.transformer_impl == search::TransformerImpl::kTransformerEngine) {
      fp8 = std::make_unique<Fp8Linears>(m);
    }
  }

  const at::Tensor& P(int index) const { return params[index].value; }
  at::Tensor PO(int index) const { return index >= 0 ? params[index].value : at::Tensor(); }

  // ---- Building blocks --------------------------------------------------------------------------

  // A linear Transformer Engine runs in FP8 under Megatron (QKV, projection, fc1, fc2 of the
  // dense MLP, shared and sequential experts; not the router, not the output layer).
  // `save_original`: linear_proj, which keeps the bf16 context under non-delayed recipes.
  at::Tensor TeLinear(const at::Tensor& x, int w, int b, LinearMode mode,
                      bool save_original = false) const {
    if (fp8) return fp8->Apply(rt, w, x, P(w), PO(b), mode, save_original);
    return Linear(rt, x, P(w), PO(b), mode);
  }

  at::Tensor Norm(const at::Tensor& x, int w, int b) const {
    if (m.EffectiveNormalization() == search::Normalization::kRMSNorm) return RmsNorm(x, P(w), kNormEps);
    return LayerNorm(x, P(w), P(b), kNormEps);
  }

  // Megatron's apply_rotary_pos_emb (bshd, not interleaved): t [s, b, n, d], freqs [s, 1, 1, d].
  // Fused (apply_rope_fusion): Transformer Engine's kernel, no cos/sin tables kept.
  at::Tensor Rope(const at::Tensor& t, const at::Tensor& freqs) const {
    if (m.apply_rope_fusion) return FusedRope(t, freqs);
    const int64_t rot = freqs.size(-1);
    at::Tensor pass = t.narrow(-1, rot, t.size(-1) - rot);
    at::Tensor x = t.narrow(-1, 0, rot);
    at::Tensor cos = at::cos(freqs).to(t.scalar_type());
    at::Tensor sin = at::sin(freqs).to(t.scalar_type());
    std::vector<at::Tensor> halves = x.chunk(2, -1);
    at::Tensor rotated = at::cat({halves[1].neg(), halves[0]}, -1);
    at::Tensor out = x * cos + rotated * sin;
    return at::cat({out, pass}, -1);
  }

  at::Tensor RopeFreqs(int64_t dim) const {
    auto opts = at::TensorOptions().dtype(at::kFloat).device(rt.device);
    at::Tensor inv =
        at::pow(10000.0, at::arange(0, dim, 2, opts) / static_cast<double>(dim)).reciprocal();
    at::Tensor pos = LocalPositions(rt, seq, opts);  // this CP rank's positions
    at::Tensor freqs = at::outer(pos, inv);
    return at::cat({freqs, freqs}, -1).view({pos.size(0), 1, 1, dim});
  }

  // Megatron's FusedScaleMaskSoftmax.forward_torch_softmax (scale folded into baddbmm).
  at::Tensor ScaleMaskSoftmax(const at::Tensor& scores) const {
    const bool half = scores.scalar_type() != at::kFloat;
    at::Tensor x = (half && m.attention_softmax_in_fp32) ? scores.to(at::kFloat) : scores;
    x.masked_fill_(causal_mask, -10000.0);
    at::Tensor probs = at::softmax(x, -1);
    if (half && m.attention_softmax_in_fp32) probs = probs.to(scores.scalar_type());
    return probs;
  }

  // Megatron's DotProductAttention (unfused) or a fused kernel. q [s, b, n, dq],
  // k [s, b, g, dq], v [s, b, g, dv] -> [s, b, n * dv].
  at::Tensor CoreAttention(at::Tensor q, at::Tensor k, at::Tensor v, double scale) {
    const int64_t n = q.size(2), g = k.size(2);
    if (rt.cp_size() > 1) return ContextParallelAttention(rt, q, k, v, scale);
    if (m.attention_backend == search::AttentionBackend::kFlash) {
      if (m.transformer_impl == search::TransformerImpl::kTransformerEngine) {
        TeAttentionInputs(q, k, v);
      }
      if (SdpaRuns()) return FlashAttention(q, k, v, scale);
      // A fused kernel's memory (q, k, v, output, log-sum-exp) where LibTorch has no SDPA.
      const int64_t s = q.size(0), b = q.size(1);
      at::Tensor out = engine::FusedAttention(q, k, v, scale, m.attention_dropout);
      return out.view({s, b, -1});
    }
    if (n / g > 1) {
      k = k.repeat_interleave(n / g, 2);
      v = v.repeat_interleave(n / g, 2);
    }
    const int64_t b = q.size(1), sq = q.size(0), sk = k.size(0);
    at::Tensor q2 = q.reshape({sq, b * n, -1});
    at::Tensor k2 = k.view({sk, b * n, -1});
    if (!score_buffer.defined() || score_buffer.scalar_type() != q.scalar_type() ||
        score_buffer.numel() < b * n * sq * sk) {
      score_buffer = at::empty({b * n, sq, sk}, q.options());
    }
    at::Tensor scores = at::baddbmm(score_buffer, q2.transpose(0, 1),
                                    k2.transpose(0, 1).transpose(1, 2), /*beta=*/0.0,
                                    /*alpha=*/scale);
    at::Tensor probs = ScaleMaskSoftmax(scores.view({b, n, sq, sk}));
    probs = Dropout(probs, m.attention_dropout);
    at::Tensor v2 = v.view({sk, b * n, -1});
    at::Tensor context = at::bmm(probs.view({b * n, sq, sk}), v2.transpose(0, 1));
    const int64_t dv = context.size(-1);
    context = context.view({b, n, sq, dv}).permute({2, 0, 1, 3}).contiguous();
    return context.view({sq, b, n * dv});
  }

  // PyTorch's scaled_dot_product_attention with GQA (LibTorch >= 2.5) on a GPU.
  bool SdpaRuns() const {
#if TORCH_VERSION_MAJOR >= 3 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
    return rt.device.is_cuda();
#else
    return false;
#endif
  }

  at::Tensor FlashAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            double scale) {
#if TORCH_VERSION_MAJOR >= 3 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
    // [s, b, n, d] -> [b, n, s, d]. PyTorch picks the kernel: flash attention for equal q/v head
    // sizes; for MLA (q/k 192, v 128) flash is not eligible and it runs cuDNN or
    // memory-efficient attention, which allow a different v head size. None keeps s x s tensors.
    const bool gqa = q.size(2) != k.size(2);
    at::Tensor out = at::scaled_dot_product_attention(
        q.permute({1, 2, 0, 3}), k.permute({1, 2, 0, 3}), v.permute({1, 2, 0, 3}),
        /*attn_mask=*/{}, /*dropout_p=*/m.attention_dropout, /*is_causal=*/true, scale, gqa);
    const int64_t b = out.size(0), n = out.size(1), s = out.size(2), dv = out.size(3);
    return out.permute({2, 0, 1, 3}).contiguous().view({s, b, n * dv});
#else
    (void)q;
    (void)k;
    (void)v;
    (void)scale;
    throw std::runtime_error("attention_backend flash needs LibTorch >= 2.5 (enable_gqa)");
#endif
  }

  // Core attention, checkpointed under core_attn (keeps q, k, v; replays the rest).
  at::Tensor Attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, double scale) {
    if (rc.core_attn) {
      return One(Checkpoint(
          rt,
          [this, scale](const std::vector<at::Tensor>& in) {
            return std::vector<at::Tensor>{CoreAttention(in[0], in[1], in[2], scale)};
          },
          {q, k, v}));
    }
    return CoreAttention(q, k, v, scale);
  }

  // Megatron's SelfAttention: returns linear_proj's output (its bias is added by the caller).
  at::Tensor SelfAttention(const LayerParams& lp, const at::Tensor& x, const at::Tensor& freqs) {
    const int64_t n = heads / tp, g = groups / tp, d = kv_channels;
    at::Tensor qkv = TeLinear(x, lp.qkv_w, lp.qkv_b, LinearMode::kColumn);
    const int64_t s = qkv.size(0), b = qkv.size(1);
    qkv = qkv.view({s, b, g, (n / g + 2) * d});
    std::vector<at::Tensor> parts = qkv.split_with_sizes({(n / g) * d, d, d}, 3);
    at::Tensor q = parts[0].reshape({s, b, n, d});
    at::Tensor k = parts[1];
    at::Tensor v = parts[2];
    if (freqs.defined()) {
      q = Rope(q, freqs);
      k = Rope(k, freqs);
    }
    at::Tensor context = Attend(q, k, v, 1.0 / std::sqrt(static_cast<double>(d)));
    return TeLinear(context, lp.proj_w, -1, LinearMode::kRow, /*save_original=*/true);
  }

  // Megatron's MLASelfAttention (DeepSeek-V2).
  at::Tensor MlaAttention(const LayerParams& lp, const at::Tensor& x, const at::Tensor& freqs) {
    const int64_t n = heads / tp;
    const int64_t qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim, dv = m.v_head_dim;
    at::Tensor q_in = x;
    if (m.q_lora_rank) {
      q_in = Linear(rt, x, P(lp.q_down), at::Tensor(), LinearMode::kLocal);
      q_in = Norm(q_in, lp.q_norm_w, lp.q_norm_b);
    }
    at::Tensor kv_combined = Linear(rt, x, P(lp.kv_down), at::Tensor(), LinearMode::kLocal);
    std::vector<at::Tensor> kv_parts =
        kv_combined.split_with_sizes({m.kv_lora_rank, pe}, -1);
    at::Tensor kv_in = Norm(kv_parts[0], lp.kv_norm_w, lp.kv_norm_b);
    // k_pos is shared by every rank's heads. Under sequence parallelism the down-projections,
    // q_layernorm and kv_layernorm run on this rank's sequence shard (the up-projections'
    // column-parallel linears all-gather their inputs), and k_pos is all-gathered along the
    // sequence (gradient reduce-scattered): Megatron-LM
    // megatron/core/transformer/multi_latent_attention.py at d98e8a6, get_query_key_value_tensors.
    at::Tensor k_pos = sp ? GatherFromSequenceParallel(rt, kv_parts[1])
                          : CopyToTensorParallel(rt, kv_parts[1]);

    // Regions may be replayed in backward, after this frame is gone: capture values only.
    const LayerParams* layer = &lp;
    Region up_proj = [this, layer, freqs, n, qk, pe, dv](const std::vector<at::Tensor>& in) {
      const LayerParams& lp = *layer;
      at::Tensor q = Linear(rt, in[0], P(lp.q_up), at::Tensor(), LinearMode::kColumn);
      const int64_t s = q.size(0), b = q.size(1);
      q = q.view({s, b, n, qk + pe});
      at::Tensor kv = Linear(rt, in[1], P(lp.kv_up), at::Tensor(), LinearMode::kColumn);
      kv = kv.view({s, b, n, qk + dv});
      at::Tensor k_pe = in[2].unsqueeze(2);
      std::vector<at::Tensor> qs = q.split_with_sizes({qk, pe}, -1);
      std::vector<at::Tensor> kvs = kv.split_with_sizes({qk, dv}, -1);
      at::Tensor q_pe = Rope(qs[1], freqs);
      k_pe = Rope(k_pe, freqs);
      at::Tensor query = at::cat({qs[0], q_pe}, -1);
      k_pe = k_pe.expand({-1, -1, n, -1});
      at::Tensor key = at::cat({kvs[0], k_pe}, -1);
      return std::vector<at::Tensor>{query.contiguous(), key.contiguous(), kvs[1].contiguous()};
    };
    OutputDiscardingCheckpoint up_checkpoint;
    std::vector<at::Tensor> qkv = rc.mla_up_proj ? up_checkpoint.Run(rt, up_proj, {q_in, kv_in, k_pos})
                                                 : up_proj({q_in, kv_in, k_pos});
    at::Tensor context =
        Attend(qkv[0], qkv[1], qkv[2], 1.0 / std::sqrt(static_cast<double>(qk + pe)));
    if (rc.mla_up_proj) up_checkpoint.DiscardOutputs(context);
    return Linear(rt, context, P(lp.proj_w), at::Tensor(), LinearMode::kRow);
  }

  // Megatron's unfused GLU (transformer/mlp.py and TEGroupedMLP, bias-activation fusion off):
  // act(x_glu) * (x_linear + glu_linear_offset). The offset is 0 (TransformerConfig's default),
  // but the add still makes a new F-wide tensor, and the product keeps it for backward: 5 F-wide
  // tensors per token in a dense MLP, not 4 (NVIDIA/Megatron-LM
  // megatron/core/transformer/mlp.py@d98e8a6, the unfused GLU path).
  // bias_activation_fusion with SwiGLU: Megatron's fused bias_swiglu (keeps fc1's output only).
  // A fused GELU keeps what the unfused one keeps (docs/transformer-engine.md section 3): unfused.
  bool FusedSwigluOn() const { return m.bias_activation_fusion && m.gated_linear_unit; }

  at::Tensor Activation(const at::Tensor& x) const {
    if (m.gated_linear_unit) {
      std::vector<at::Tensor> c = x.chunk(2, -1);
      return at::silu(c[0]) * (c[1] + kGluLinearOffset);
    }
    return at::gelu(x);
  }

  // Megatron's MLP without fc2's bias (returned separately). `probs` [tokens, 1] scales the
  // activation for experts.
  at::Tensor MlpCore(const at::Tensor& x, int fc1_w, int fc1_b, int fc2_w, LinearMode fc1_mode,
                     LinearMode fc2_mode, const at::Tensor& probs = at::Tensor()) {
    at::Tensor inter = TeLinear(x, fc1_w, -1, fc1_mode);
    if (FusedSwigluOn()) {
      return TeLinear(FusedSwiglu(inter, PO(fc1_b), probs), fc2_w, -1, fc2_mode);
    }
    if (fc1_b >= 0) inter = inter + P(fc1_b);
    inter = Activation(inter);
    if (probs.defined()) inter = (inter * probs).to(x.scalar_type());
    return TeLinear(inter, fc2_w, -1, fc2_mode);
  }

  // `x` is the norm's output, or with `norm_inside` the residual whose pre-MLP norm runs inside
  // the region (Transformer Engine's fc1 holds the norm: Megatron's mlp checkpoint then starts
  // from the residual, megatron/core/transformer/transformer_layer.py at d98e8a6).
  at::Tensor DenseMlp(const LayerParams& lp, const at::Tensor& x, bool norm_inside = false) {
    auto region = [this, &lp = lp, norm_inside](const std::vector<at::Tensor>& in) {
      const at::Tensor input = norm_inside ? Norm(in[0], lp.ln2_w, lp.ln2_b) : in[0];
      return std::vector<at::Tensor>{
          MlpCore(input, lp.fc1_w, lp.fc1_b, lp.fc2_w, LinearMode::kColumn, LinearMode::kRow)};
    };
    return rc.mlp ? One(Checkpoint(rt, region, {x})) : One(region({x}));
  }

  at::Tensor SharedExperts(const LayerParams& lp, const at::Tensor& x) {
    auto region = [this, &lp = lp](const std::vector<at::Tensor>& in) {
      at::Tensor out = MlpCore(in[0], lp.sh_fc1_w, lp.sh_fc1_b, lp.sh_fc2_w, LinearMode::kColumn,
                               LinearMode::kRow);
      if (lp.sh_fc2_b >= 0) out = out + P(lp.sh_fc2_b);
      return std::vector<at::Tensor>{out};
    };
    return rc.shared_experts ? One(Checkpoint(rt, region, {x})) : One(region({x}));
  }

  // Megatron's GroupedMLP (moe_grouped_gemm) or SequentialMLP.
  at::Tensor Experts(const LayerParams& lp, const at::Tensor& tokens,
                     const std::vector<int64_t>& counts, const at::Tensor& probs) {
    const int64_t experts = static_cast<int64_t>(counts.size());  // this rank's experts
    if (m.moe_grouped_gemm) {
      at::Tensor w1 = P(lp.w1).view({experts, hidden, -1});
      at::Tensor w2 = P(lp.w2).view({experts, -1, hidden});
      at::Tensor fc1 = GroupedGemm(tokens, w1, counts);
      Region act = [this](const std::vector<at::Tensor>& in) {
        if (FusedSwigluOn()) return std::vector<at::Tensor>{FusedSwiglu(in[0], at::Tensor(), in[1])};
        return std::vector<at::Tensor>{(Activation(in[0]) * in[1]).to(in[0].scalar_type())};
      };
      if (rc.moe_act) {
        OutputDiscardingCheckpoint checkpoint;
        at::Tensor inter = One(checkpoint.Run(rt, act, {fc1, probs.unsqueeze(-1)}));
        at::Tensor fc2 = GroupedGemm(inter, w2, counts);
        checkpoint.DiscardOutputs(fc2);
        return fc2;
      }
      at::Tensor inter = One(act({fc1, probs.unsqueeze(-1)}));
      return GroupedGemm(inter, w2, counts);
    }
    std::vector<at::Tensor> token_list = tokens.split_with_sizes(counts, 0);
    std::vector<at::Tensor> prob_list = probs.split_with_sizes(counts, 0);
    std::vector<at::Tensor> outs;
    for (int64_t e = 0; e < experts; ++e) {
      const int b1 = lp.e_fc1_b.empty() ? -1 : lp.e_fc1_b[e];
      at::Tensor out = MlpCore(token_list[e], lp.e_fc1_w[e], b1, lp.e_fc2_w[e], LinearMode::kLocal,
                               LinearMode::kLocal, prob_list[e].unsqueeze(-1));
      if (!lp.e_fc2_b.empty()) out = out + P(lp.e_fc2_b[e]);
      outs.push_back(out);
    }
    return at::cat(outs, 0);
  }

  // Megatron's MoELayer: shared experts, top-k softmax router on this rank's tokens (its
  // sequence-parallel shard under TP), the token dispatcher of moe_token_dispatcher_type over
  // the expert grid with the local experts (engine/moe_dispatch.h).
  at::Tensor MoeCore(const LayerParams& lp, const at::Tensor& x) {
    at::Tensor shared;
    if (lp.sh_fc1_w >= 0) shared = SharedExperts(lp, x);
    at::Tensor hs = x.reshape({-1, hidden});
    at::Tensor logits = Linear(rt, hs, P(lp.router), at::Tensor(), LinearMode::kLocal);
    if (m.moe_router_force_load_balancing) logits = ForcedBalanceLogits(logits);
    auto top = logits.topk(m.moe_router_topk, -1);
    at::Tensor probs = at::softmax(std::get<0>(top), -1, at::kFloat).to(logits.scalar_type());
    const at::Tensor& top_idx = std::get<1>(top);
    at::Tensor routing_probs = at::zeros_like(logits).scatter(1, top_idx, probs);
    LocalExperts local = [this, &lp](const at::Tensor& tokens, const std::vector<int64_t>& counts,
                                     const at::Tensor& token_probs) {
      return Experts(lp, tokens, counts, token_probs);
    };
    at::Tensor out = DispatchToExperts(rt, m.moe_token_dispatcher_type, hs, routing_probs,
                                       top_idx, local)
                         .view(x.sizes());
    if (shared.defined()) out = out + shared;
    return out;
  }

  at::Tensor Moe(const LayerParams& lp, const at::Tensor& x) {
    auto region = [this, &lp = lp](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{MoeCore(lp, in[0])};
    };
    return rc.moe ? One(Checkpoint(rt, region, {x})) : One(region({x}));
  }

  // Megatron's bias-dropout-add (unfused, training): residual + dropout(x + bias).
  at::Tensor BiasDropoutAdd(const at::Tensor& x, int bias, const at::Tensor& residual) const {
    if (m.bias_dropout_fusion) return FusedBiasDropoutAdd(x, PO(bias), residual, m.hidden_dropout);
    at::Tensor y = bias >= 0 ? x + P(bias) : x;
    return residual + Dropout(y, m.hidden_dropout);
  }

  // Megatron's TransformerLayer.forward.
  at::Tensor Layer(int index, const at::Tensor& x, const at::Tensor& freqs) {
    const LayerParams& lp = layers[index];
    auto norm1 = [this, &lp = lp](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{Norm(in[0], lp.ln1_w, lp.ln1_b)};
    };
    // A norm fused into the linear after it (Transformer Engine) keeps its output in the
    // linear's state: the same tensors as a separate norm, but `layernorm` cannot discard them.
    const bool discard_ln1 = rc.layernorm && !m.InputNormFused();
    const bool discard_ln2 = rc.layernorm && !m.PreMlpNormFused(lp.spec_layer);
    OutputDiscardingCheckpoint ln1_checkpoint;
    at::Tensor ln1 = discard_ln1 ? One(ln1_checkpoint.Run(rt, norm1, {x})) : One(norm1({x}));
    at::Tensor attn = m.multi_latent_attention ? MlaAttention(lp, ln1, freqs)
                                               : SelfAttention(lp, ln1, freqs);
    if (discard_ln1) ln1_checkpoint.DiscardOutputs(attn);
    at::Tensor h = BiasDropoutAdd(attn, lp.proj_b, x);

    auto norm2 = [this, &lp = lp](const std::vector<at::Tensor>& in) {
      return std::vector<at::Tensor>{Norm(in[0], lp.ln2_w, lp.ln2_b)};
    };
    const bool mlp_from_residual = rc.mlp && !lp.moe && m.PreMlpNormFused(lp.spec_layer);
    OutputDiscardingCheckpoint ln2_checkpoint;
    at::Tensor ln2 = mlp_from_residual ? h
                     : discard_ln2     ? One(ln2_checkpoint.Run(rt, norm2, {h}))
                                       : One(norm2({h}));
    at::Tensor mlp = lp.moe ? Moe(lp, ln2) : DenseMlp(lp, ln2, mlp_from_residual);
    if (discard_ln2) ln2_checkpoint.DiscardOutputs(mlp);
    return BiasDropoutAdd(mlp, lp.moe ? -1 : lp.fc2_b, h);
  }

  // Megatron's TransformerBlock with full recompute by uniform groups or the first N layers.
  // One chunk's layers [first, first + num_layers): recompute groups count from the chunk's
  // first layer, as each chunk is its own TransformerBlock in Megatron.
  at::Tensor Block(at::Tensor x, const at::Tensor& freqs, int first, int num_layers) {
    auto layer_range = [this, freqs, first](int begin, int end) {
      begin += first;
      end += first;
      return [this, freqs, begin, end](const std::vector<at::Tensor>& in) {
        at::Tensor h = in[0];
        for (int i = begin; i < end; ++i) h = Layer(i, h, freqs);
        return std::vector<at::Tensor>{h};
      };
    };
    if (rc.full && rc.method == search::RecomputeMethod::kUniform) {
      for (int i = 0; i < num_layers; i += rc.num_layers) {
        x = One(Checkpoint(rt, layer_range(i, std::min(i + rc.num_layers, num_layers)), {x}));
      }
    } else {
      for (int i = 0; i < num_layers; ++i) {
        const bool checkpointed = rc.full && i < rc.num_layers;  // block: the first N layers
        x = checkpointed ? One(Checkpoint(rt, layer_range(i, i + 1), {x}))
                         : Layer(first + i, x, freqs);
      }
    }
    return x;
  }

  std::vector<int64_t> ActivationShape() const {
    const int local = seq / rt.cp_size();
    return {sp ? local / tp : local, spec.train.micro_batch_size, hidden};
  }

  at::Tensor Forward(int chunk_index, const at::Tensor& input, const at::Tensor& tokens,
                     const at::Tensor& labels) {
    const search::StageChunk& chunk = chunks.at(chunk_index);
    if (!causal_mask.defined() && m.attention_backend == search::AttentionBackend::kUnfused) {
      causal_mask = at::ones({seq, seq}, at::TensorOptions().dtype(at::kBool).device(rt.device))
                        .triu(1);
    }
    at::Tensor emb = chunk.has_embedding ? Embed(tokens, P(word_emb)) : input;

    // MLA applies its own rotary embedding to the qk_pos_emb_head_dim part whatever
    // position_embedding_type says (Megatron's MultiLatentAttention builds it; GPTModel's rope is
    // for standard attention only); learned absolute positions are added to the embedding too.
    at::Tensor freqs;
    if (m.multi_latent_attention) {
      freqs = RopeFreqs(m.qk_pos_emb_head_dim);
    } else if (m.position_embedding_type == search::PositionEmbedding::kRope) {
      freqs = RopeFreqs(kv_channels);
    }
    at::Tensor hidden_states = Block(emb, freqs, chunk.first_layer, chunk.num_layers);
    if (!chunk.has_loss) return hidden_states;
    hidden_states = Norm(hidden_states, final_w, final_b);
    // Megatron runs the MTP layers and their losses first (GPTModel._postprocess).
    at::Tensor mtp_loss;
    if (chunk.mtp_layers > 0) {
      MtpHooks hooks;
      hooks.embed = [this](const at::Tensor& ids) { return Embed(ids, P(mtp_word_emb)); };
      hooks.norm = [this](const at::Tensor& x, int w, int b) { return Norm(x, w, b); };
      hooks.layer = [this, freqs](int layer, const at::Tensor& x) { return Layer(layer, x, freqs); };
      hooks.head_loss = [this](const at::Tensor& h, const at::Tensor& target) {
        return HeadLoss(h, target);
      };
      hooks.param = [this](int index) -> const at::Tensor& { return P(index); };
      const bool whole = rc.full && rc.method == search::RecomputeMethod::kUniform;
      MtpOutput out = MtpLoss(rt, spec, mtp, whole, hooks, hidden_states, tokens, labels);
      hidden_states = out.main_hidden;
      mtp_loss = out.loss;
    }
    at::Tensor target = LocalSequence(rt, labels, 1).transpose(0, 1).contiguous();
    at::Tensor loss = HeadLoss(hidden_states, target).mean();
    return mtp_loss.defined() ? AddMtpLoss(loss, mtp_loss) : loss;
  }

  // The embedding of token ids [b, s] with `word` (the first stage's, or the MTP stage's copy):
  // [s (/ TP under SP), b, h], embedding dropout applied.
  at::Tensor Embed(const at::Tensor& tokens, const at::Tensor& word) {
    const int64_t vocab_start = static_cast<int64_t>(vocab_padded / tp) * tp_rank;
    const at::Tensor local_tokens = LocalSequence(rt, tokens, 1);  // this CP rank's chunks
    at::Tensor emb = VocabParallelEmbedding(rt, local_tokens, word, vocab_start);
    if (pos_emb >= 0) {
      at::Tensor positions =
          LocalPositions(rt, seq, tokens.options()).unsqueeze(0).expand_as(local_tokens);
      emb = emb + at::embedding(P(pos_emb), positions);
    }
    emb = emb.transpose(0, 1).contiguous();  // [s, b, h]
    if (sp) emb = ScatterToSequenceParallel(rt, emb);
    return Dropout(emb, m.hidden_dropout);
  }

  // The output layer and the vocab-parallel cross-entropy (Transformer Engine's with
  // cross_entropy_fusion_impl te, engine/te_cross_entropy.h; Megatron's native fusion's buffer
  // with native, engine/ops.h SoftmaxExp): per-token loss [s, b].
  at::Tensor HeadLoss(const at::Tensor& hidden_states, const at::Tensor& target) {
    const int64_t vocab_start = static_cast<int64_t>(vocab_padded / tp) * tp_rank;
    const at::Tensor& out_w = output_w >= 0 ? P(output_w) : P(word_emb);
    at::Tensor logits = Linear(rt, hidden_states, out_w, at::Tensor(), LinearMode::kColumn);
    if (m.cross_entropy_loss_fusion &&
        m.cross_entropy_fusion_impl == search::CrossEntropyFusionImpl::kTe) {
      return TeVocabParallelCrossEntropy(rt, logits, target, vocab_start);
    }
    return VocabParallelCrossEntropy(rt, logits, target, vocab_start,
                                     m.cross_entropy_loss_fusion ? SoftmaxExp::kThroughBuffer
                                                                 : SoftmaxExp::kInPlace);
  }
};

GptModel::GptModel(const search::SearchSpec& spec, const search::Policy& policy,
                   const Runtime& rt, at::ScalarType dtype)
    : impl_(std::make_unique<Impl>(spec, policy, rt, dtype)) {}

GptModel::~GptModel() = default;

std::vector<ParamInfo>& GptModel::params() { return impl_->params; }

at::Tensor GptModel::Loss(const at::Tensor& tokens, const at::Tensor& labels) {
  return impl_->Forward(0, at::Tensor(), tokens, labels);
}

int GptModel::NumChunks() const { return static_cast<int>(impl_->chunks.size()); }

at::Tensor GptModel::Forward(int chunk, const at::Tensor& input, const at::Tensor& tokens,
                             const at::Tensor& labels) {
  return impl_->Forward(chunk, input, tokens, labels);
}

std::vector<int64_t> GptModel::ActivationShape() const { return impl_->ActivationShape(); }

void GptModel::NewStep() {
  if (impl_->fp8) impl_->fp8->NewStep();
}

uint64_t GptModel::Fp8WorkspaceBytes() const {
  return impl_->fp8 ? impl_->fp8->WorkspaceBytes() : 0;
}

}  // namespace remat::engine
