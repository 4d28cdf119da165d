#include "search/layer_shape.h"

#include <algorithm>

#include "search/static_memory.h"

namespace remat::search {

Dims MakeDims(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  Dims x;
  x.e = spec.train.precision == Precision::kFp32 ? 4 : 2;
  x.s = static_cast<double>(m.seq_length) / std::max(1, spec.parallel.context_parallel_size);
  x.s_kv = m.seq_length;
  x.b = spec.train.micro_batch_size;
  x.h = m.hidden_size;
  x.tokens = x.s * x.b;
  x.t = std::max(1, spec.parallel.tensor_model_parallel_size);
  x.sp = spec.parallel.sequence_parallel && x.t > 1;
  x.seq_tokens = x.sp ? x.tokens / x.t : x.tokens;
  x.heads = m.num_attention_heads / x.t;
  x.groups = (m.multi_latent_attention ? m.num_attention_heads : m.EffectiveQueryGroups()) / x.t;
  x.d = m.EffectiveKvChannels();
  x.ffn = m.EffectiveFfnHiddenSize() / x.t;
  x.glu = m.gated_linear_unit;
  return x;
}

MoeDims MakeMoeDims(const SearchSpec& spec, const Dims& x) {
  const ModelSpec& m = spec.model;
  MoeDims moe;
  if (!m.IsMoe()) return moe;
  const double etp = ExpertTensorParallel(spec);
  moe.experts = *m.num_moe_experts;
  moe.local_experts = moe.experts / std::max(1, spec.parallel.expert_model_parallel_size);
  moe.topk = m.moe_router_topk;
  moe.routed_tokens = x.seq_tokens;
  // Under SP each rank routes its sequence shard; with ETP > 1 the expert-TP group gathers the
  // shards, so every rank of it sees all of them (and holds 1/ETP of each expert).
  moe.expert_tokens = (x.sp ? x.seq_tokens * etp : x.tokens) * moe.topk;
  moe.ffn = m.EffectiveMoeFfnHiddenSize() / etp;
  moe.shared_ffn = m.HasSharedExperts() ? *m.moe_shared_expert_intermediate_size / x.t : 0;
  return moe;
}

double ActivationFlops(bool glu) { return glu ? kSiluFlops + 1 : kGeluFlops; }

LayerFlops EstimateLayerFlops(const SearchSpec& spec, int layer) {
  const ModelSpec& m = spec.model;
  const Dims x = MakeDims(spec);
  const double gemm = x.glu ? 3 : 2;  // GEMMs per FFN width: fc1 (doubled for GLU) + fc2
  LayerFlops f;
  if (m.multi_latent_attention) {
    const double qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim, vd = m.v_head_dim;
    const double kvl = m.kv_lora_rank;
    const double q_in = m.q_lora_rank ? *m.q_lora_rank : x.h;
    f.mla_up = 2 * x.tokens * (q_in * x.heads * (qk + pe) + kvl * x.heads * (qk + vd));
    const double q_down = m.q_lora_rank ? 2 * x.tokens * x.h * *m.q_lora_rank / x.t : 0;
    const double kv_down = 2 * x.tokens * x.h * (kvl + pe) / x.t;
    const double out = 2 * x.tokens * x.heads * vd * x.h;
    f.attn_linear = q_down + kv_down + f.mla_up + out;
    f.core = x.b * x.s * x.s_kv * x.heads * (qk + pe + vd);
  } else {
    const double qkv = (x.heads + 2 * x.groups) * x.d;
    f.attn_linear = 2 * x.tokens * x.h * qkv + 2 * x.tokens * x.heads * x.d * x.h;
    // QK^T and PV, 2 * s^2 * d FLOPs each per head, halved by the causal mask.
    f.core = 2 * x.b * x.s * x.s_kv * x.heads * x.d;
  }
  f.norms =
      2 * x.seq_tokens * x.h *
      (m.EffectiveNormalization() == Normalization::kLayerNorm ? kLayerNormFlops : kRmsNormFlops);
  if (m.IsMoeLayer(layer)) {
    const MoeDims moe = MakeMoeDims(spec, x);
    f.router = 2 * moe.routed_tokens * x.h * moe.experts;
    f.experts = 2 * moe.expert_tokens * x.h * moe.ffn * gemm;
    f.moe_act = moe.expert_tokens * moe.ffn * (ActivationFlops(x.glu) + 1);
    f.shared = x.tokens * moe.shared_ffn * (2 * x.h * gemm + ActivationFlops(x.glu));
  } else {
    f.mlp = x.tokens * x.ffn * (2 * x.h * gemm + ActivationFlops(x.glu));
  }
  return f;
}

}  // namespace remat::search
