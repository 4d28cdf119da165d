#include "search/static_memory.h"

#include <algorithm>

#include "search/fp8_memory.h"
#include "search/memory_model.h"
#include "search/mtp_model.h"
#include "search/pipeline.h"

namespace remat::search {

double ExpertTensorParallel(const SearchSpec& spec) {
  return std::max(1, spec.parallel.EffectiveExpertTensorParallelSize());
}

ParamCount CountParams(const SearchSpec& spec, int pp_rank) {
  const ModelSpec& m = spec.model;
  const double h = m.hidden_size, t = std::max(1, spec.parallel.tensor_model_parallel_size);
  const bool ln = m.EffectiveNormalization() == Normalization::kLayerNorm;
  const double bias = m.add_bias_linear ? 1 : 0;
  auto norm = [&](double width) { return (ln ? 2 : 1) * width; };
  const double gl = m.gated_linear_unit ? 2 : 1;
  // Column-parallel weights and biases are split over TP; row-parallel biases are replicated.
  auto mlp = [&](double ffn) { return (h * ffn * gl + bias * ffn * gl + ffn * h) / t + bias * h; };
  auto mlp_weights = [&](double ffn) { return (h * ffn * gl + ffn * h) / t; };

  ParamCount p;
  std::vector<int> layers;
  bool first_stage = false, last_stage = false, mtp_stage = false;
  for (const StageChunk& c : ChunksOf(spec, pp_rank)) {
    for (int i = 0; i < c.num_layers; ++i) layers.push_back(c.first_layer + i);
    // An MTP layer's transformer layer is the decoder's last layer's (search/mtp_model.h).
    for (int i = 0; i < c.mtp_layers; ++i) layers.push_back(MtpInnerLayer(spec));
    p.dense += c.mtp_layers * MtpExtraParams(spec);
    first_stage = first_stage || c.has_embedding;
    last_stage = last_stage || c.has_loss;
    mtp_stage = mtp_stage || c.mtp_layers > 0;
  }
  for (int i : layers) {
    p.dense += 2 * norm(h);
    if (m.multi_latent_attention) {
      const double a = m.num_attention_heads;
      const double qk = m.qk_head_dim, pe = m.qk_pos_emb_head_dim, vd = m.v_head_dim;
      const double kvl = m.kv_lora_rank;
      if (m.q_lora_rank) {
        const double ql = *m.q_lora_rank;
        p.dense += (h * ql + ql * a * (qk + pe)) / t + norm(ql);
        p.linear += (h * ql + ql * a * (qk + pe)) / t;
      } else {
        p.dense += h * a * (qk + pe) / t;
        p.linear += h * a * (qk + pe) / t;
      }
      p.dense += (h * (kvl + pe) + kvl * a * (qk + vd)) / t + norm(kvl);
      p.dense += a * vd * h / t + bias * h;
      p.linear += (h * (kvl + pe) + kvl * a * (qk + vd)) / t + a * vd * h / t;
    } else {
      const double qkv =
          (m.num_attention_heads + 2.0 * m.EffectiveQueryGroups()) * m.EffectiveKvChannels();
      p.dense += (h * qkv + bias * qkv) / t;
      p.dense += 1.0 * m.num_attention_heads * m.EffectiveKvChannels() * h / t + bias * h;
      p.linear += (h * qkv + 1.0 * m.num_attention_heads * m.EffectiveKvChannels() * h) / t;
    }
    if (m.IsMoeLayer(i)) {
      const double experts = *m.num_moe_experts;
      const double local = experts / std::max(1, spec.parallel.expert_model_parallel_size);
      const double etp = ExpertTensorParallel(spec);
      const double f = m.EffectiveMoeFfnHiddenSize();
      p.dense += experts * h;  // router, replicated
      p.expert += local * ((h * f * gl + bias * f * gl + f * h) / etp + bias * h);
      if (m.HasSharedExperts()) {
        p.dense += mlp(*m.moe_shared_expert_intermediate_size);
        p.linear += mlp_weights(*m.moe_shared_expert_intermediate_size);
      }
    } else {
      p.dense += mlp(m.EffectiveFfnHiddenSize());
      p.linear += mlp_weights(m.EffectiveFfnHiddenSize());
    }
  }
  // The first stage holds the embedding; the last the final norm and the output layer. With
  // tied weights and PP > 1 the last stage keeps its own copy of the word embedding for the
  // output layer (Megatron all-reduces the two copies' gradients).
  const double vocab = static_cast<double>(PaddedVocabSize(spec));
  if (first_stage || mtp_stage) {  // an MTP rank embeds the shifted tokens itself
    p.dense += vocab * h / t;
    if (m.position_embedding_type == PositionEmbedding::kLearnedAbsolute) {
      p.dense += 1.0 * m.seq_length * h;
    }
  }
  if (last_stage) {
    p.dense += norm(h);
    if (!m.share_embeddings_and_output_weights || !first_stage) p.dense += vocab * h / t;
  }
  return p;
}

namespace {

double DTypeBytes(DType d) {
  switch (d) {
    case DType::kFp32:
      return 4;
    case DType::kBf16:
    case DType::kFp16:
      return 2;
    case DType::kFp8:
      return 1;
  }
  return 4;
}

}  // namespace

// Megatron's bytes per parameter, as a weight, its gradient buffer and the optimizer's state.
// bf16: a bf16 weight, the gradient buffer in fp32 (grad_reduce_in_fp32) or bf16, and Adam's
// fp32 master weight and two moments (18 with fp32 gradients). The precision-aware optimizer
// (Transformer Engine's FusedAdam) keeps the moments in their configured dtypes and an fp32 master
// weight as the 16-bit remainder of the bf16 one (store_param_remainders, Megatron Core's
// default). fp32: weight, gradient, two moments (16). The distributed optimizer shards the
// optimizer's state over the data-parallel group; Megatron-FSDP shards it too (optim), and the
// gradients (optim_grads) and the weights (optim_grads_params) as well.
// (NVIDIA/Megatron-LM megatron/core/optimizer/optimizer_config.py and
// megatron/core/distributed/distributed_data_parallel_config.py @d98e8a6; docs/memory-model.md.)
double BytesPerParameter(const SearchSpec& spec, double dp) {
  const TrainSpec& t = spec.train;
  dp = std::max(1.0, dp);
  const bool fp32 = t.precision == Precision::kFp32;
  double weight = fp32 ? 4 : 2;
  double grad = fp32 || t.grad_reduce_in_fp32 ? 4 : 2;
  double optimizer = fp32 ? 8 : 12;
  if (!fp32 && t.use_precision_aware_optimizer) {
    const double master = t.main_params_dtype == DType::kFp32 ? 2 : DTypeBytes(t.main_params_dtype);
    optimizer = master + DTypeBytes(t.exp_avg_dtype) + DTypeBytes(t.exp_avg_sq_dtype);
  }
  ShardingStrategy sharding = ShardingStrategy::kNoShard;
  if (t.use_megatron_fsdp) {
    sharding = t.data_parallel_sharding_strategy;
  } else if (t.use_distributed_optimizer) {
    sharding = ShardingStrategy::kOptim;
  }
  if (sharding != ShardingStrategy::kNoShard) optimizer /= dp;
  if (sharding == ShardingStrategy::kOptimGrads ||
      sharding == ShardingStrategy::kOptimGradsParams) {
    grad /= dp;
  }
  if (sharding == ShardingStrategy::kOptimGradsParams) weight /= dp;
  return weight + grad + optimizer;
}

double StaticParameterBytes(const SearchSpec& spec, const ParamCount& p) {
  const double t = std::max(1, spec.parallel.tensor_model_parallel_size);
  const double cp = std::max(1, spec.parallel.context_parallel_size);
  const double dp = std::max(1, spec.parallel.data_parallel_size);
  const double ep = std::max(1, spec.parallel.expert_model_parallel_size);
  // Megatron reduces dense gradients over DP x CP (the CP ranks hold the same weights) and the
  // distributed optimizer shards over that group; expert parameters over the expert-DP group,
  // TP x CP x DP / (ETP x EP) ranks.
  const double expert_dp = t * cp * dp / (ExpertTensorParallel(spec) * ep);
  // FP8: Transformer Engine's weight workspaces, or FP8 weights (search/fp8_memory.h); the
  // routed experts' parameters count as linear weights (their biases, if any, too).
  const double fp8 = (p.linear + p.expert) * Fp8ExtraBytesPerLinearWeight(spec);
  return p.dense * BytesPerParameter(spec, dp * cp) +
         p.expert * BytesPerParameter(spec, expert_dp) + fp8;
}

double ParameterCount(const SearchSpec& spec) {
  const ParamCount p = CountParams(spec, 0);
  return p.dense + p.expert;
}

}  // namespace remat::search
