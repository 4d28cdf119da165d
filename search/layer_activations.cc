#include "search/layer_activations.h"

#include <algorithm>

#include "search/context_parallel_memory.h"
#include "search/fp8_memory.h"
#include "search/layer_shape.h"
#include "search/static_memory.h"

namespace remat::search {
namespace {

// RoPE's cos and sin tables as Megatron's unfused apply_rotary_pos_emb builds them: cast to the
// activation dtype on every call ([s, 1, 1, rot], one pair for q and one for k) and saved by the
// multiplications, so a layer holds four per micro-batch, whatever the batch size or TP.
// Fused RoPE (apply_rope_fusion) keeps no per-layer tables.
double RopeTableBytes(const ModelSpec& m, const Dims& x, double rot) {
  return m.apply_rope_fusion ? 0 : 4 * x.e * x.s * rot;
}

// F-wide tensors a dense MLP keeps per token. GELU: its input and output. SwiGLU unfused (as
// Megatron's glu): fc1 output [2F], silu output, x_linear + glu_linear_offset, product; fused
// (bias_activation_fusion, megatron/core/fusions/fused_bias_swiglu.py@d98e8a6): fc1's output
// [2F], which the fused function keeps, and its product.
double MlpWidths(const ModelSpec& m, bool glu) {
  if (!glu) return 2;
  return m.bias_activation_fusion ? 3 : 5;
}

// Tracks live bytes through a sequence of allocations and frees: the peak above the start.
class Level {
 public:
  void Alloc(double bytes) {
    cur_ += bytes;
    peak_ = std::max(peak_, cur_);
  }
  void Free(double bytes) { cur_ -= bytes; }
  double peak() const { return peak_; }

 private:
  double cur_ = 0;
  double peak_ = 0;
};

// What Transformer Engine's FP8 linears keep instead of bf16 tensors (docs/transformer-engine.md
// section 7): each saves its input quantized, f8 = Fp8SavedBytesPerElement bytes per element,
// and the bf16 tensor goes unless something else keeps it. The fused norm outputs (the norm
// kernel writes FP8 directly), fc2's input (expert fc2's too), the permuted tokens the expert
// fc1 keeps, shared-expert fc1's own copy of the (bf16, router-kept) norm output, and with
// delayed scaling an FP8 copy of the context beside the bf16 one linear_proj keeps otherwise.
// Not modelled: MLA's FP8 projections, the recompute switches to save_original_input.
void ApplyFp8(const SearchSpec& spec, int layer, const Dims& x, LayerActivations* a) {
  const ModelSpec& m = spec.model;
  if (m.multi_latent_attention) return;
  const double f8 = Fp8SavedBytesPerElement(m);
  const double cheaper = x.e - f8;  // per element now saved in FP8
  const double norm_out = x.seq_tokens * x.h;
  if (m.InputNormFused()) a->layernorm -= cheaper * norm_out;
  if (m.PreMlpNormFused(layer)) a->layernorm -= cheaper * norm_out;
  if (m.fp8_recipe == "delayed") a->attn_other += f8 * x.tokens * x.heads * x.d;
  if (m.IsMoeLayer(layer)) {
    const MoeDims moe = MakeMoeDims(spec, x);
    a->moe_router -= cheaper * moe.expert_tokens * x.h;
    a->moe_act -= cheaper * moe.expert_tokens * moe.ffn;
    if (moe.shared_ffn > 0) {
      a->shared_experts += f8 * x.seq_tokens * x.h - cheaper * x.tokens * moe.shared_ffn;
    }
  } else {
    a->mlp -= cheaper * x.tokens * x.ffn;
  }
}

}  // namespace

double NormStatsBytes(const ModelSpec& m) {
  return m.EffectiveNormalization() == Normalization::kLayerNorm ? 8 : 4;
}

ScoreChain UnfusedScoreChain(const ModelSpec& m, double e, bool cuda) {
  // Softmax output dtype: fp32 when attention_softmax_in_fp32 (Megatron casts the scores up and
  // the probabilities back down) or when everything is fp32.
  const double sm = (m.attention_softmax_in_fp32 || e == 4) ? 4 : e;
  const bool cast = sm != e;
  const bool drop = m.attention_dropout > 0;
  ScoreChain c;
  // Softmax keeps its output; dropout keeps a 1-byte mask and its output goes to the bmm with v;
  // without dropout the bmm keeps the (cast) probabilities themselves.
  c.held = sm + (drop ? 1 + e : (cast ? e : 0));
  Level lv;
  lv.Alloc(e);                      // bmm(probs, v) backward: grad of probs
  if (drop || cast) lv.Free(e);     // the bmm's own saved probs are released
  if (drop) {                       // dropout backward: grad * mask; mask released
    lv.Alloc(e);
    lv.Free(e);
    lv.Free(1);
  }
  if (cast) {                       // bf16 -> fp32 grad
    lv.Alloc(sm);
    lv.Free(e);
  }
  lv.Alloc(sm);                     // softmax backward; its saved output is released
  if (cuda) {  // ATen's CUDA softmax backward forms grad * output in a tensor of its own first
    lv.Alloc(sm);  // (pytorch/pytorch aten/src/ATen/native/cuda/SoftMax.cu at 000cace,
    lv.Free(sm);   // softmax_backward_cuda_out)
  }
  lv.Free(sm);
  lv.Free(sm);
  lv.Alloc(sm);                     // masked_fill backward
  lv.Free(sm);
  if (cast) {                       // fp32 -> scores' dtype
    lv.Alloc(e);
    lv.Free(sm);
  }
  c.backward_peak = lv.peak();
  return c;
}

double LayerActivations::Moe() const {
  return moe_router + moe_expert_fc1 + moe_act + moe_other + shared_experts;
}

double LayerActivations::Total() const {
  return input + layernorm + attn_inputs + core_attn + mla_up_proj + attn_other + mlp + Moe() +
         mlp_other;
}

LayerActivations EstimateLayerActivations(const SearchSpec& spec, int layer) {
  const ModelSpec& m = spec.model;
  const Dims x = MakeDims(spec);
  LayerActivations a;
  const double seq_hidden = x.e * x.seq_tokens * x.h;  // one [s, b, h] tensor (s/t under SP)
  const double mask = x.seq_tokens * x.h;               // its 1-byte dropout mask

  a.input = seq_hidden;          // input_layernorm's saved input
  a.layernorm = 2 * seq_hidden;  // the two norm outputs, saved by the linears they feed
  a.attn_other += 2 * NormStatsBytes(m) * x.seq_tokens;
  a.attn_other += seq_hidden;    // residual after attention: pre_mlp_layernorm's saved input
  if (m.hidden_dropout > 0) {    // bias-dropout-add masks (no mask is made when p = 0)
    a.attn_other += mask;
    a.mlp_other += mask;
  }

  const bool unfused = m.attention_backend == AttentionBackend::kUnfused;
  const double scores = x.b * x.heads * x.s * x.s_kv;  // score elements on this rank
  const ScoreChain chain = UnfusedScoreChain(m, x.e, spec.search.OnCuda());
  const double lse = 4 * x.tokens * x.heads;  // flash: fp32 logsumexp per query and head
  const double full = x.e * x.tokens;         // bytes per unit width of a full-sequence tensor

  if (m.multi_latent_attention) {
    const double qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim, vd = m.v_head_dim;
    const double kvl = m.kv_lora_rank;
    const double latent = x.e * x.seq_tokens;
    if (m.q_lora_rank) {  // q down-projection output (q_layernorm's input) and its norm output
      a.attn_other += 2 * latent * *m.q_lora_rank + NormStatsBytes(m) * x.seq_tokens;
    }
    // kv down-projection output [kv_lora_rank + pos] (kv_layernorm's input is a view of it), and
    // the normalised latent the kv up-projection keeps.
    a.attn_other += latent * (kvl + pe) + latent * kvl + NormStatsBytes(m) * x.seq_tokens;
    // Expanded query, key, value (contiguous) kept by core attention, and the cos/sin tables of
    // the RoPE applied inside the up-projection region (replayed with it).
    a.mla_up_proj = full * x.heads * (2 * (qk + pe) + vd) + RopeTableBytes(m, x, pe);
    a.core_attn = unfused ? scores * chain.held : lse;
    if (!unfused) {  // context parallel: what TE's attention keeps instead of its inputs
      const double qw = x.heads * (qk + pe), vw = x.heads * vd;
      a.core_attn += full * ContextParallelAttentionExtraWidth(spec, qw, qw, vw, vw, 2 * qw + vw);
    }
    a.attn_other += full * x.heads * vd;  // output projection's input
  } else {
    const double q = x.heads * x.d, kv = x.groups * x.d;
    const double fused = q + 2 * kv;  // width of the fused QKV projection's output
    const bool gqa = m.EffectiveQueryGroups() < m.num_attention_heads;
    const bool rope = m.position_embedding_type == PositionEmbedding::kRope;
    // q, k, v are views into the fused QKV output, and a saved view keeps all of it alive.
    // RoPE makes new q and k; the head reshape of GQA copies q. Core attention receives these,
    // and both core_attn's checkpoint and a fused kernel keep them as given: q, k (new under
    // RoPE or, for q, GQA) and v, a view that keeps the whole fused output.
    const bool q_view = !gqa && !rope;
    double given = (q_view ? 0 : q) + (rope ? kv : 0) + fused;
    if (m.transformer_impl == TransformerImpl::kTransformerEngine && !unfused) {
      // Transformer Engine's fused attention makes the strided v contiguous (a copy), so the
      // fused QKV output is no longer held: it keeps q, k and v, W_f wide
      // (transformer_engine/pytorch/attention/dot_product_attention, NVIDIA/TransformerEngine
      // @d0067d0; docs/transformer-engine.md section 2).
      given = fused;
    }
    a.attn_inputs = full * given;
    if (rope) a.attn_other += RopeTableBytes(m, x, x.d);
    if (unfused) {
      // Without the checkpoint the unfused core holds q (copy or view) and GQA's k and v
      // repeated to all heads (copies) instead; MHA's k is the rotated copy or a view.
      const double plain = (q_view ? 0 : q) + (gqa ? q : (rope ? kv : 0)) + (gqa ? q : 0) +
                           (gqa ? 0 : fused);
      a.core_attn = scores * chain.held + full * (plain - given);
    } else {
      a.core_attn = lse;  // the kernel's output is the context, counted below
      // Context parallel: what TE's attention keeps instead of its inputs (may be less).
      a.core_attn += full * ContextParallelAttentionExtraWidth(spec, q, kv, kv, q, given);
    }
    a.attn_other += full * q;  // output projection's input (the context)
  }

  if (m.IsMoeLayer(layer)) {
    const MoeDims moe = MakeMoeDims(spec, x);
    const double n = moe.expert_tokens;
    // Router: fp32 scores for the load-balancing loss, routing map (and a transposed copy),
    // top-k indices and fp32 top-k probabilities. Dispatch: the permuted tokens (expert fc1's
    // input) and their fp32 probabilities.
    // The allgather dispatcher's transposed mask covers the tokens of the whole ETP x EP block
    // for the local experts: ETP times the all-to-all dispatcher's (token_dispatcher.py at
    // d98e8a6).
    const double mask = spec.model.moe_token_dispatcher_type == MoeTokenDispatcher::kAllgather
                            ? ExpertTensorParallel(spec)
                            : 1;
    a.moe_router = moe.routed_tokens * moe.experts * (4 + 1 + mask) +
                   moe.routed_tokens * moe.topk * 12 + x.e * n * x.h + 4 * n;
    a.moe_expert_fc1 = x.e * n * moe.ffn * (x.glu ? 2 : 1);
    // SwiGLU: silu output, x_linear + glu_linear_offset (a new tensor even at offset 0), gated
    // product, product * probs; GELU: activation, product * probs.
    // Fused (bias_activation_fusion): the fused activation with the probabilities keeps its
    // input (fc1's output, counted above) and makes one output.
    a.moe_act = x.e * n * moe.ffn * (m.bias_activation_fusion ? 1 : (x.glu ? 4 : 2));
    a.moe_other = 8 * n;  // sorted token indices for unpermute
    // Shared experts: an MLP of width shared_ffn on every token.
    a.shared_experts = full * moe.shared_ffn * MlpWidths(m, x.glu);
  } else {
    a.mlp = full * x.ffn * MlpWidths(m, x.glu);
  }
  if (Fp8On(m)) ApplyFp8(spec, layer, x, &a);
  return a;
}

}  // namespace remat::search
