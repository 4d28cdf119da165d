#include "search/layer_recompute.h"

#include <algorithm>

namespace remat::search {
namespace {

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

}  // namespace

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
    const ScoreChain chain = UnfusedScoreChain(m, x.e, spec.search.OnCuda());
    core = x.b * x.heads * x.s * x.s_kv * chain.backward_peak;
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

double MlpSide(const LayerActivations& a) {
  return a.layernorm / 2 + a.mlp + a.Moe() + a.mlp_other;
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

}  // namespace remat::search
