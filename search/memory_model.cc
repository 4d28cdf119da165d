#include "search/memory_model.h"

#include <algorithm>

#include "search/mtp_model.h"
#include "search/fp8_memory.h"
#include "search/context_parallel_memory.h"
#include "search/pipeline.h"
#include "search/layer_shape.h"
#include "search/static_memory.h"
#include "search/pipeline_layout.h"

namespace remat::search {
namespace {

// Bytes of fp32 statistics a norm keeps per token: LayerNorm mean + rstd, RMSNorm rstd.
double NormStatsBytes(const ModelSpec& m) {
  return m.EffectiveNormalization() == Normalization::kLayerNorm ? 8 : 4;
}

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

// Megatron pads the vocabulary to a multiple of 128 * TP (make_vocab_size_divisible_by = 128);
// the embedding, the output layer, the logits and the FLOP formula all use the padded size.
double PaddedVocab(const SearchSpec& spec) { return static_cast<double>(PaddedVocabSize(spec)); }

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

// Unfused core attention, per score element (b * heads * s * s on this rank): the bytes held for
// backward, and the peak of the backward's gradient chain above what the layer holds.
struct ScoreChain {
  double held = 0;
  double backward_peak = 0;
};

ScoreChain UnfusedScoreChain(const ModelSpec& m, double e) {
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

// Gradient working set of one layer's backward above what the layer holds, for its MLP half
// and its attention half (approximate; see docs).
struct LayerWork {
  double attn = 0;
  double mlp = 0;
};

LayerWork EstimateLayerWork(const SearchSpec& spec, int layer) {
  const ModelSpec& m = spec.model;
  const Dims x = MakeDims(spec);
  const double residual = 2 * x.e * x.seq_tokens * x.h;  // gradients of the residual stream
  LayerWork w;
  double qkv_width = 0;      // width of the attention inputs (their gradients)
  double q_width = x.heads * x.d;
  double attn_weight = 0;    // largest attention weight on this rank (its gradient)
  if (m.multi_latent_attention) {
    const double qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim, vd = m.v_head_dim;
    qkv_width = x.heads * (2 * (qk + pe) + vd);
    q_width = x.heads * (qk + pe);
    const double q_in = m.q_lora_rank ? *m.q_lora_rank : x.h;
    attn_weight = std::max({q_in * x.heads * (qk + pe), m.kv_lora_rank * x.heads * (qk + vd),
                            x.heads * vd * x.h});
  } else {
    qkv_width = (x.heads + 2 * x.groups) * x.d;
    attn_weight = x.h * qkv_width;
  }
  double core = 0;
  if (m.attention_backend == AttentionBackend::kUnfused) {
    core = x.b * x.heads * x.s * x.s_kv * UnfusedScoreChain(m, x.e).backward_peak;
  } else {
    core = 4 * x.tokens * q_width;  // fp32 dq accumulator of the fused kernel
  }
  w.attn = residual + std::max(core + x.e * x.tokens * qkv_width, x.e * attn_weight);
  const double fc1 = x.glu ? 2 : 1;
  if (m.IsMoeLayer(layer)) {
    const MoeDims moe = MakeMoeDims(spec, x);
    // Grouped GEMM: one weight-gradient tensor for all local experts at once.
    const double routed = x.e * moe.expert_tokens * moe.ffn * fc1 +
                          x.e * moe.local_experts * x.h * moe.ffn * fc1;
    const double shared =
        x.e * x.tokens * moe.shared_ffn * fc1 + x.e * x.h * moe.shared_ffn * fc1;
    w.mlp = residual + std::max(routed, shared);
  } else {
    w.mlp = residual + x.e * x.tokens * x.ffn * fc1 + x.e * x.h * x.ffn * fc1;
  }
  return w;
}

// The attention half and the MLP half of what a layer holds (backward frees the MLP half first).
double MlpSide(const LayerActivations& a) {
  return a.layernorm / 2 + a.mlp + a.Moe() + a.mlp_other;
}

// What selective `policy` discards on layer `layer`, by half.
struct Discard {
  double attn = 0;
  double mlp = 0;
  double Total() const { return attn + mlp; }
};

// Under Transformer Engine's fused attention the core_attn checkpoint saves q, k, v as Megatron
// passes them, before TE's contiguity copy: v's view pins the whole fused QKV output beside the
// rotated q and k (docs/transformer-engine.md section 10). What it holds beyond the kernel's own
// q, k, v (a negative saving in the default case).
double TeCoreAttnPinned(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  if (m.transformer_impl != TransformerImpl::kTransformerEngine ||
      m.attention_backend == AttentionBackend::kUnfused || m.multi_latent_attention) {
    return 0;
  }
  const Dims x = MakeDims(spec);
  const bool gqa = m.EffectiveQueryGroups() < m.num_attention_heads;
  const bool rope = m.position_embedding_type == PositionEmbedding::kRope;
  const double q = x.heads * x.d, kv = x.groups * x.d;
  return x.e * x.tokens * ((!gqa && !rope ? 0 : q) + (rope ? kv : 0));
}

Discard SelectiveDiscard(const SearchSpec& spec, const Policy& policy, const LayerActivations& a,
                         int layer) {
  Discard d;
  if (policy.IsFull()) return d;
  if (policy.Has(Label::kCoreAttn)) d.attn += a.core_attn - TeCoreAttnPinned(spec);
  if (policy.Has(Label::kMlaUpProj)) {
    d.attn += a.mla_up_proj;
    // Under SP the key's position part is all-gathered along the sequence before the
    // up-projections (Megatron-LM multi_latent_attention.py at d98e8a6), and the discarding
    // checkpoint keeps it as one of its inputs: a full-sequence tensor the layer holds anyway.
    const Dims x = MakeDims(spec);
    if (spec.model.multi_latent_attention && x.sp) {
      d.attn -= x.e * x.tokens * spec.model.qk_pos_emb_head_dim;
    }
  }
  if (policy.Has(Label::kLayernorm)) {
    // Under Transformer Engine a dense layer's norms are fused into the linears after them
    // (IdentityOp in the layer spec): only a separate norm is discarded, the input norm of MLA
    // and the pre-MLP norm of an MoE layer (megatron/core/models/gpt/gpt_layer_specs.py@d98e8a6).
    if (!spec.model.InputNormFused()) d.attn += a.layernorm / 2;
    if (!spec.model.PreMlpNormFused(layer)) d.mlp += a.layernorm / 2;
  }
  if (spec.model.IsMoeLayer(layer)) {
    if (policy.Has(Label::kMoe)) {
      d.mlp += a.Moe();  // the whole MoE forward: supersedes moe_act and shared_experts
    } else {
      if (policy.Has(Label::kMoeAct)) d.mlp += a.moe_act;
      if (policy.Has(Label::kSharedExperts)) d.mlp += a.shared_experts;
    }
  } else if (policy.Has(Label::kMlp)) {
    d.mlp += a.mlp;
    // A norm fused into fc1 runs inside the mlp checkpoint, which starts from the residual: its
    // output and statistics go too (megatron/core/transformer/transformer_layer.py@d98e8a6).
    if (spec.model.PreMlpNormFused(layer)) {
      d.mlp += a.layernorm / 2 + NormStatsBytes(spec.model) * MakeDims(spec).seq_tokens;
    }
  }
  return d;
}

// Highest live bytes above everything held (this layer's kept bytes included) while one layer's
// backward runs with its selective discards `d` replayed: the MLP half first (its discarded
// region replayed, its working set), then the attention half, once the MLP half's kept and
// replayed tensors are freed. A region of one half is therefore never live with the other's
// (Megatron's selective checkpoints recompute in their own half's backward).
double SelectiveLayerBackward(const LayerActivations& a, const LayerWork& w, const Discard& d) {
  const double mlp_phase = d.mlp + w.mlp;
  const double attn_phase = d.attn + w.attn - (MlpSide(a) - d.mlp);
  return std::max(mlp_phase, attn_phase);
}

double SelectiveFlops(const SearchSpec& spec, const Policy& policy, const LayerFlops& f,
                      int layer) {
  double flops = 0;
  if (policy.Has(Label::kCoreAttn)) flops += f.core;
  if (policy.Has(Label::kMlaUpProj) && spec.model.multi_latent_attention) flops += f.mla_up;
  if (policy.Has(Label::kLayernorm)) flops += f.norms;
  if (spec.model.IsMoeLayer(layer)) {
    if (policy.Has(Label::kMoe)) {
      flops += f.Moe();
    } else {
      if (policy.Has(Label::kMoeAct)) flops += f.moe_act;
      if (policy.Has(Label::kSharedExperts)) flops += f.shared;
    }
  } else if (policy.Has(Label::kMlp)) {
    flops += f.mlp;
  }
  return flops;
}

// Activations outside the layers, and the backward working sets around them.
struct OuterActivations {
  double embedding = 0;    // token ids, vocab-parallel mask, embedding dropout mask
  double final_norm = 0;   // final norm's input and statistics, output layer's input
  double logits = 0;       // the fp32 softmax the cross-entropy keeps
  double logits_work = 0;  // peak above everything held while the loss backward runs
  double embedding_work = 0;
};

OuterActivations EstimateOuter(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  const Dims x = MakeDims(spec);
  const double vocab = PaddedVocab(spec);
  OuterActivations o;
  o.embedding =
      8 * x.tokens + (x.t > 1 ? x.tokens : 0) + (m.hidden_dropout > 0 ? x.seq_tokens * x.h : 0);
  o.embedding_work =
      x.e * vocab * x.h / x.t + (m.position_embedding_type == PositionEmbedding::kLearnedAbsolute
                                     ? x.e * x.s_kv * x.h  // the whole position table's gradient
                                     : 0);
  o.final_norm = 2 * x.e * x.seq_tokens * x.h + NormStatsBytes(m) * x.seq_tokens;
  // Megatron's vocab-parallel cross-entropy upcasts the logits to fp32, computes the softmax in
  // place and keeps it (plus the target mask and indices); the bf16 logits are then freed.
  const double logit_elems = x.tokens * vocab / x.t;
  o.logits = 4 * logit_elems + 9 * x.tokens;
  // Backward: the fp32 gradient is written into the kept softmax; autograd casts it to the
  // logits' dtype (a copy) before the output layer's backward makes its input and weight
  // gradients.
  const double output_grads = x.e * vocab * x.h / x.t + x.e * x.tokens * x.h;
  if (x.e != 4) {
    o.logits_work = std::max(x.e * logit_elems, x.e * logit_elems + output_grads - 4 * logit_elems);
  } else {
    o.logits_work = output_grads;
  }
  return o;
}

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

double PersistentBufferBytes(const SearchSpec& spec, int pp_rank) {
  if (spec.model.attention_backend != AttentionBackend::kUnfused ||
      StageLayerCount(spec, pp_rank) == 0) {
    return 0;
  }
  const Dims x = MakeDims(spec);
  // Megatron's global memory buffer for the baddbmm input, [b * heads, s, s], kept across steps.
  return x.e * x.b * x.heads * x.s * x.s_kv;
}

}  // namespace

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
  const ScoreChain chain = UnfusedScoreChain(m, x.e);
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

namespace {

// One micro-batch through one model chunk under a policy: what it holds for backward and the
// highest its own backward reaches (both above everything else the rank holds).
struct ChunkEstimate {
  double activation = 0;        // held between its forward and its backward
  double layer_activation = 0;  // the part held by transformer layers
  double logits = 0;            // the part held for the loss (last chunk of the last stage)
  double backward_peak = 0;     // highest live bytes during its backward (>= activation)
  double recompute_flops = 0;   // extra forward FLOPs its backward replays
};

ChunkEstimate EstimateChunk(const SearchSpec& spec, const Policy& policy, const StageChunk& chunk) {
  const ModelSpec& m = spec.model;
  const int layers = chunk.num_layers;
  const double t = std::max(1, spec.parallel.tensor_model_parallel_size);
  ChunkEstimate est;

  std::vector<LayerActivations> acts(layers);
  std::vector<LayerWork> work(layers);
  std::vector<double> kept(layers);
  for (int i = 0; i < layers; ++i) {
    acts[i] = EstimateLayerActivations(spec, chunk.first_layer + i);
    work[i] = EstimateLayerWork(spec, chunk.first_layer + i);
  }
  // Megatron applies recompute_num_layers to each model chunk (one TransformerBlock) alone.

  const bool full = policy.IsFull();
  const int n = full ? std::clamp(policy.num_layers, 1, std::max(1, layers)) : 0;
  const bool uniform = full && policy.method == RecomputeMethod::kUniform;
  // A checkpointed layer group keeps only its input; distribute_saved_activations splits that
  // input over the TP group (Megatron allows it without sequence parallelism).
  const bool distribute = m.distribute_saved_activations && !spec.parallel.sequence_parallel;
  auto checkpoint_input = [&](int i) { return acts[i].input / (distribute ? t : 1); };
  std::vector<Discard> discard(layers);
  for (int i = 0; i < layers; ++i) {
    const int global = chunk.first_layer + i;
    const LayerFlops flops = EstimateLayerFlops(spec, global);
    if (uniform) {
      kept[i] = i % n == 0 ? checkpoint_input(i) : 0;
      est.recompute_flops += flops.Forward();
    } else if (full && i < n) {
      kept[i] = checkpoint_input(i);
      est.recompute_flops += flops.Forward();
    } else {
      discard[i] = SelectiveDiscard(spec, policy, acts[i], global);
      kept[i] = acts[i].Total() - discard[i].Total();
      est.recompute_flops += SelectiveFlops(spec, policy, flops, global);
    }
    est.layer_activation += kept[i];
  }
  // MTP layers: their transformer layer (the last decoder layer's kind) under the policy, where
  // Megatron Core's MTP block checkpoints it under full:uniform and skips recompute under
  // full:block; then their own norms, eh_proj input and head (search/mtp_model.h).
  const OuterActivations outer = EstimateOuter(spec);
  double mtp_inner = 0, mtp_outer = 0, mtp_backward = 0;
  for (int k = 0; k < chunk.mtp_layers; ++k) {
    const int inner = MtpInnerLayer(spec);
    const LayerActivations a = EstimateLayerActivations(spec, inner);
    const LayerWork w = EstimateLayerWork(spec, inner);
    double kept_inner = a.Total();
    double backward = 0;  // its backward's peak above what is held then
    if (uniform) {
      kept_inner = 0;  // inside the MTP layer's checkpoint, which keeps its inputs only
      est.recompute_flops += EstimateLayerFlops(spec, inner).Forward();
      // The checkpoint replays the layer whole, with eh_proj's input (the [s, b, 2h]
      // concatenation) and final_layernorm (its input and output).
      const Dims x = MakeDims(spec);
      backward = a.Total() + 2 * x.e * x.seq_tokens * x.h + outer.final_norm +
                 SelectiveLayerBackward(a, w, Discard{});
    } else {
      // Selective labels act inside the layer as in a decoder layer, each half's region
      // replayed in that half's backward; full:block keeps the layer whole (no discards).
      const Discard d = full ? Discard{} : SelectiveDiscard(spec, policy, a, inner);
      kept_inner -= d.Total();
      if (!full) {
        est.recompute_flops += SelectiveFlops(spec, policy, EstimateLayerFlops(spec, inner), inner);
      }
      backward = SelectiveLayerBackward(a, w, d);
    }
    est.layer_activation += kept_inner;
    est.logits += outer.logits;
    mtp_inner += kept_inner;
    mtp_outer += MtpHeldBytes(spec, outer.final_norm, outer.logits, uniform);
    mtp_backward = std::max(mtp_backward, backward);
  }

  const double embedding = chunk.has_embedding ? outer.embedding : 0;
  const double final_norm = chunk.has_loss ? outer.final_norm : 0;
  if (chunk.has_loss) est.logits += outer.logits;
  est.activation = embedding + est.layer_activation + final_norm +
                   (chunk.has_loss ? outer.logits : 0) + mtp_outer;

  // Walk the backward pass: the loss, then the layers from last to first, each freeing what it
  // held once done. A recomputed region is live again while its layer's backward runs.
  double held = est.activation;
  double peak = held;
  if (chunk.has_loss || chunk.mtp_layers > 0) peak = std::max(peak, held + outer.logits_work);
  held -= (chunk.has_loss ? outer.logits : 0) + final_norm;
  if (chunk.mtp_layers > 0) {  // the MTP layers' backward runs first: their head, then the layer
    // Their heads' backward has freed their logits before the layers' replay.
    const double mtp_logits = chunk.mtp_layers * outer.logits;
    peak = std::max(peak, held - mtp_logits + mtp_backward);
    held -= mtp_inner + mtp_outer;
  }
  // A checkpointed layer re-runs its whole forward at once, then runs its backward as a layer
  // that discarded nothing.
  auto layer_work = [&](int i) { return SelectiveLayerBackward(acts[i], work[i], Discard{}); };
  for (int i = layers - 1; i >= 0; --i) {
    if (uniform) {
      if (i % n != 0) continue;  // handled at the group's first layer
      const int end = std::min(i + n, layers);
      double replay = -kept[i];
      for (int j = i; j < end; ++j) replay += acts[j].Total();
      peak = std::max(peak, held + replay + layer_work(end - 1));
    } else if (full && i < n) {
      peak = std::max(peak, held + acts[i].Total() - kept[i] + layer_work(i));
    } else {
      peak = std::max(peak, held + SelectiveLayerBackward(acts[i], work[i], discard[i]));
    }
    held -= kept[i];
  }
  if (chunk.has_embedding) peak = std::max(peak, held + outer.embedding_work);
  est.backward_peak = peak;
  return est;
}

StageMemory EstimateStage(const SearchSpec& spec, const Policy& policy, int pp_rank) {
  StageMemory st;
  st.stage = pp_rank;
  const ParamCount params = CountParams(spec, pp_rank);
  st.parameters = params.dense + params.expert;
  st.static_bytes = StaticParameterBytes(spec, params) + PersistentBufferBytes(spec, pp_rank);
  std::vector<ChunkEstimate> chunks;
  for (const StageChunk& c : ChunksOf(spec, pp_rank)) {
    chunks.push_back(EstimateChunk(spec, policy, c));
    st.layers += c.num_layers;
    st.microbatch_activation_bytes += chunks.back().activation;
    st.recompute_flops += chunks.back().recompute_flops * spec.NumMicrobatches();
  }
  // The peak comes just before one of the schedule's backwards: everything in flight is held,
  // and the backward's own working set comes on top of its micro-batch.
  double best = -1;
  for (const InFlightState& state : InFlightStates(spec, pp_rank)) {
    double held = 0, layers = 0, logits = 0;
    int in_flight = 0;
    for (size_t c = 0; c < chunks.size(); ++c) {
      held += state.live_per_chunk[c] * chunks[c].activation;
      layers += state.live_per_chunk[c] * chunks[c].layer_activation;
      logits += state.live_per_chunk[c] * chunks[c].logits;
      in_flight += state.live_per_chunk[c];
    }
    const ChunkEstimate& running = chunks[state.backward_chunk];
    const double peak = held - running.activation + running.backward_peak;
    if (peak > best) {
      best = peak;
      st.activation_bytes = held;
      st.layer_activation_bytes = layers;
      st.logits_bytes = logits;
      st.in_flight = in_flight;
    }
  }
  st.transient_bytes = std::max(0.0, best - st.activation_bytes);
  st.peak_bytes = st.static_bytes + st.activation_bytes + st.transient_bytes;
  return st;
}

}  // namespace

MemoryEstimate EstimateMemory(const SearchSpec& spec, const Policy& policy) {
  MemoryEstimate est;
  est.model_flops = ModelFlopsPerStep(spec);
  const int pp = std::max(1, spec.parallel.pipeline_model_parallel_size);
  for (int p = 0; p < pp; ++p) {
    est.stages.push_back(EstimateStage(spec, policy, p));
    if (est.stages[p].peak_bytes > est.stages[est.peak_stage].peak_bytes) est.peak_stage = p;
  }
  const StageMemory& top = est.stages[est.peak_stage];
  est.parameters = top.parameters;
  est.buffer_bytes = PersistentBufferBytes(spec, est.peak_stage);
  est.static_bytes = top.static_bytes;
  est.activation_bytes = top.activation_bytes;
  est.layer_activation_bytes = top.layer_activation_bytes;
  est.logits_bytes = top.logits_bytes;
  est.transient_bytes = top.transient_bytes;
  est.peak_bytes = top.peak_bytes;
  est.recompute_flops = top.recompute_flops;
  est.in_flight = top.in_flight;
  return est;
}

double LabelSavingBytes(const SearchSpec& spec, Label label) {
  const Policy policy = Policy::Selective({label});
  double bytes = 0;
  for (const StageChunk& c : ChunksOf(spec, 0)) {
    for (int i = c.first_layer; i < c.first_layer + c.num_layers; ++i) {
      bytes += SelectiveDiscard(spec, policy, EstimateLayerActivations(spec, i), i).Total();
    }
  }
  return bytes;
}

double LabelRecomputeFlops(const SearchSpec& spec, Label label) {
  const Policy policy = Policy::Selective({label});
  double flops = 0;
  for (const StageChunk& c : ChunksOf(spec, 0)) {
    for (int i = c.first_layer; i < c.first_layer + c.num_layers; ++i) {
      flops += SelectiveFlops(spec, policy, EstimateLayerFlops(spec, i), i);
    }
  }
  return flops * spec.NumMicrobatches();
}

double ModelFlopsPerStep(const SearchSpec& spec) {
  // Megatron-LM's num_floating_point_operations (transformer path), for the micro-batches of one
  // step on one data-parallel replica, divided over the ranks of one replica (TP x CP x PP).
  const ModelSpec& m = spec.model;
  const double h = m.hidden_size, a = m.num_attention_heads, s = m.seq_length;
  const double tokens = s * spec.train.micro_batch_size * spec.NumMicrobatches();
  const double s2 = s * tokens;  // b * s^2
  // MTP layers count as layers of the decoder's last layer's kind, and each adds its norms,
  // eh_proj and a second pass through the output layer (training.py at d98e8a6).
  const double mtp = MtpLayerCount(spec);
  const bool last_moe = m.IsMoe() && m.IsMoeLayer(MtpInnerLayer(spec));
  const double layers = m.num_layers + mtp;
  const double moe_layers = m.NumMoeLayers() + (last_moe ? mtp : 0);
  const double dense_layers = layers - moe_layers;
  const double ffn_exp = m.gated_linear_unit ? 3 : 2;
  const double fwd_bwd = 3, fma = 2;

  double attn_token = 0, core = 0;
  if (m.multi_latent_attention) {
    const double qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim, vd = m.v_head_dim;
    const double kvl = m.kv_lora_rank;
    const double q_term =
        m.q_lora_rank ? *m.q_lora_rank * (h + a * (qk + pe) + 1) : h * a * (qk + pe);
    attn_token = fwd_bwd * fma * (q_term + kvl * (h + a * (qk + vd) + 1) + h * pe + a * vd * h);
    core = fwd_bwd * fma * (a * (qk + pe) / 2 + a * vd / 2);
  } else {
    const double q = m.EffectiveKvChannels() * a;
    const double kv = 1.0 * m.EffectiveKvChannels() * m.EffectiveQueryGroups();
    attn_token = fwd_bwd * fma * (h * (q + 2 * kv) + q * h);
    core = fwd_bwd * fma * q / 2 * 2;  // causal: half the scores; QK^T and PV
  }
  double ffn_term = m.EffectiveFfnHiddenSize() * ffn_exp * dense_layers;
  if (m.IsMoe()) {
    ffn_term += m.EffectiveMoeFfnHiddenSize() * m.moe_router_topk * ffn_exp * moe_layers;
    if (m.HasSharedExperts()) {
      ffn_term += *m.moe_shared_expert_intermediate_size * ffn_exp * moe_layers;
    }
  }
  const double total = tokens * (fwd_bwd * fma * h * ffn_term + attn_token * layers +
                                 fwd_bwd * fma * h * PaddedVocab(spec) * (1 + mtp) +
                                 MtpFlopsPerToken(spec)) +
                       s2 * core * layers;
  const double ranks = std::max(1, spec.parallel.tensor_model_parallel_size) *
                       std::max(1, spec.parallel.context_parallel_size) *
                       std::max(1, spec.parallel.pipeline_model_parallel_size);
  return total / ranks;
}

std::optional<int> SmallestFittingBlock(const SearchSpec& spec, double budget_bytes) {
  for (int n = 1; n <= MaxChunkLayers(spec); ++n) {
    if (EstimateMemory(spec, Policy::Full(RecomputeMethod::kBlock, n)).peak_bytes <= budget_bytes) {
      return n;
    }
  }
  return std::nullopt;
}

double PaperActivationBytesPerLayer(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  const double s = m.seq_length, b = spec.train.micro_batch_size, h = m.hidden_size;
  const double a = m.num_attention_heads;
  const double t = std::max(1, spec.parallel.tensor_model_parallel_size);
  const double attn = 5 * a * s / h;
  if (t == 1) return s * b * h * (34 + attn);
  if (spec.parallel.sequence_parallel) return s * b * h * (34 / t + attn / t);
  return s * b * h * (10 + 24 / t + attn / t);
}

int64_t PaddedVocabSize(const SearchSpec& spec) {
  const int64_t divisor = 128LL * std::max(1, spec.parallel.tensor_model_parallel_size);
  const int64_t v = std::max(0, spec.model.vocab_size);
  return (v + divisor - 1) / divisor * divisor;
}

}  // namespace remat::search
