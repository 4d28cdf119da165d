#include "search/spec.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <iterator>
#include <string>
#include <utility>

#include "search/limits.h"
#include "search/noise.h"
#include "search/pipeline.h"
#include "search/rank_layout.h"
#include "search/text.h"

namespace remat::search {
namespace {

template <typename E, size_t N>
std::optional<E> ParseByName(const std::string& s, const char* const (&names)[N]) {
  for (size_t i = 0; i < N; ++i) {
    if (s == names[i]) return static_cast<E>(i);
  }
  return std::nullopt;
}

constexpr const char* kNormalization[] = {"LayerNorm", "RMSNorm"};
constexpr const char* kAttentionBackend[] = {"unfused", "flash"};
constexpr const char* kPositionEmbedding[] = {"learned_absolute", "rope", "none"};
constexpr const char* kPrecision[] = {"bf16", "fp32"};
constexpr const char* kMemoryMetric[] = {"reserved", "allocated"};
constexpr const char* kStrategy[] = {"guided", "exhaustive"};
constexpr const char* kObjective[] = {"frontier", "recommend"};
constexpr const char* kBackend[] = {"builtin", "command", "replay", "megatron"};
constexpr const char* kDevice[] = {"auto", "cuda", "cpu"};
constexpr const char* kTransformerImpl[] = {"local", "transformer_engine"};
constexpr const char* kCrossEntropyFusionImpl[] = {"native", "te"};
constexpr const char* kDType[] = {"fp32", "bf16", "fp16", "fp8"};
constexpr const char* kShardingStrategy[] = {"no_shard", "optim", "optim_grads",
                                             "optim_grads_params"};
constexpr const char* kCpCommType[] = {"p2p", "a2a", "allgather", "a2a+p2p"};
constexpr const char* kMoeTokenDispatcher[] = {"allgather", "alltoall", "flex"};

Status Positive(const char* field, long long v) {
  if (v <= 0) return InvalidArgument(std::string(field) + ": must be a positive integer");
  return OkStatus();
}

Status Divides(const char* field, long long value, const char* by_field, long long by) {
  if (by > 0 && value % by != 0) {
    return InvalidArgument(std::string(field) + ": " + std::to_string(value) +
                           " must be divisible by " + by_field + " (" + std::to_string(by) + ")");
  }
  return OkStatus();
}

Status Probability(const char* field, double v) {
  if (!(v >= 0.0 && v < 1.0)) {
    return InvalidArgument(std::string(field) + ": must be in [0, 1)");
  }
  return OkStatus();
}

Status ValidateModel(const ModelSpec& m, const ParallelSpec& p) {
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.num_layers", m.num_layers));
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.hidden_size", m.hidden_size));
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.num_attention_heads", m.num_attention_heads));
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.seq_length", m.seq_length));
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.vocab_size", m.vocab_size));
  if (m.num_query_groups) {
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.num_query_groups", *m.num_query_groups));
    REMAT_SEARCH_RETURN_IF_ERROR(Divides("model.num_attention_heads", m.num_attention_heads,
                                         "model.num_query_groups", *m.num_query_groups));
  }
  if (m.ffn_hidden_size) {
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.ffn_hidden_size", *m.ffn_hidden_size));
  }
  if (m.kv_channels) {
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.kv_channels", *m.kv_channels));
  } else if (!m.multi_latent_attention) {
    REMAT_SEARCH_RETURN_IF_ERROR(Divides("model.hidden_size", m.hidden_size,
                                         "model.num_attention_heads", m.num_attention_heads));
  }
  REMAT_SEARCH_RETURN_IF_ERROR(Probability("model.attention_dropout", m.attention_dropout));
  REMAT_SEARCH_RETURN_IF_ERROR(Probability("model.hidden_dropout", m.hidden_dropout));
  if (m.position_embedding_type == PositionEmbedding::kRope && !m.multi_latent_attention &&
      m.EffectiveKvChannels() % 2 != 0) {
    return InvalidArgument("model.kv_channels: rotary embeddings need an even head dimension, got " +
                           std::to_string(m.EffectiveKvChannels()));
  }

  if (m.multi_latent_attention) {
    if (m.q_lora_rank) REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.q_lora_rank", *m.q_lora_rank));
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.kv_lora_rank", m.kv_lora_rank));
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.qk_head_dim", m.qk_head_dim));
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.qk_pos_emb_head_dim", m.qk_pos_emb_head_dim));
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.v_head_dim", m.v_head_dim));
    if (m.qk_pos_emb_head_dim % 2 != 0) {
      return InvalidArgument("model.qk_pos_emb_head_dim: rotary embeddings need an even size, got " +
                             std::to_string(m.qk_pos_emb_head_dim));
    }
    if (m.num_query_groups && *m.num_query_groups != m.num_attention_heads) {
      return InvalidArgument(
          "model.num_query_groups: multi-latent attention has one key/value head per query head; "
          "leave num_query_groups unset or equal to num_attention_heads");
    }
  }

  if (m.num_moe_experts) {
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.num_moe_experts", *m.num_moe_experts));
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.moe_router_topk", m.moe_router_topk));
    if (m.moe_router_topk > *m.num_moe_experts) {
      return InvalidArgument("model.moe_router_topk: " + std::to_string(m.moe_router_topk) +
                             " exceeds num_moe_experts (" + std::to_string(*m.num_moe_experts) +
                             ")");
    }
    if (m.moe_ffn_hidden_size) {
      REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.moe_ffn_hidden_size", *m.moe_ffn_hidden_size));
    }
    if (m.moe_shared_expert_intermediate_size) {
      REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.moe_shared_expert_intermediate_size",
                                            *m.moe_shared_expert_intermediate_size));
    }
    REMAT_SEARCH_RETURN_IF_ERROR(Positive("model.moe_layer_freq", m.moe_layer_freq.every));
    const std::vector<int>& pattern = m.moe_layer_freq.pattern;
    if (!pattern.empty()) {
      if (static_cast<int>(pattern.size()) != m.num_layers) {
        return InvalidArgument("model.moe_layer_freq: a pattern must have num_layers (" +
                               std::to_string(m.num_layers) + ") entries, got " +
                               std::to_string(pattern.size()));
      }
      for (int v : pattern) {
        if (v != 0 && v != 1) {
          return InvalidArgument("model.moe_layer_freq: a pattern holds only 0 (dense) and 1 (MoE)");
        }
      }
    }
    REMAT_SEARCH_RETURN_IF_ERROR(Divides("model.num_moe_experts", *m.num_moe_experts,
                                         "parallel.expert_model_parallel_size",
                                         p.expert_model_parallel_size));
  } else {
    const char* moe_only = nullptr;
    if (m.moe_shared_expert_intermediate_size) moe_only = "model.moe_shared_expert_intermediate_size";
    if (m.moe_shared_expert_overlap) moe_only = "model.moe_shared_expert_overlap";
    if (m.overlap_moe_expert_parallel_comm) moe_only = "model.overlap_moe_expert_parallel_comm";
    // A layer pattern, or a frequency other than Megatron's default of 1, places MoE layers in a
    // model that has none: the spec says two contradicting things, so neither is guessed.
    if (m.moe_layer_freq != MoeLayerFreq()) moe_only = "model.moe_layer_freq";
    if (moe_only) {
      return InvalidArgument(std::string(moe_only) +
                             ": needs a mixture-of-experts model (set model.num_moe_experts)");
    }
  }
  if (m.moe_shared_expert_overlap && !m.HasSharedExperts()) {
    return InvalidArgument(
        "model.moe_shared_expert_overlap: needs shared experts "
        "(model.moe_shared_expert_intermediate_size)");
  }
  if (m.experimental_attention_variant && !m.IsGdn()) {
    return InvalidArgument("model.experimental_attention_variant: must be \"gdn\" or \"gdn2\"");
  }
  return OkStatus();
}

// Megatron's expert grid (megatron/core/parallel_state.py at d98e8a6): ETP x EP x expert-DP x PP
// over the same world as the dense TP x CP x DP x PP grid, so ETP x EP must divide a stage's
// TP x CP x DP ranks; the expert linears split moe_ffn_hidden_size over ETP (experts.py); biases
// in MoE need ETP 1 and MoE under TP needs sequence parallelism in training (TransformerConfig,
// moe_layer.py).
Status ValidateExpertGrid(const ModelSpec& m, const ParallelSpec& p) {
  if (p.expert_tensor_parallel_size) {
    REMAT_SEARCH_RETURN_IF_ERROR(
        Positive("parallel.expert_tensor_parallel_size", *p.expert_tensor_parallel_size));
  }
  if (!m.IsMoe()) return OkStatus();
  const int etp = p.EffectiveExpertTensorParallelSize();
  const int ep = p.expert_model_parallel_size;
  const int ranks_per_stage = RanksPerStage(p);
  if (ranks_per_stage % (etp * ep) != 0) {
    const std::string field = ranks_per_stage % ep != 0 ? "parallel.expert_model_parallel_size"
                                                        : "parallel.expert_tensor_parallel_size";
    return InvalidArgument(
        field + ": ETP (" + std::to_string(etp) + ") x EP (" +
        std::to_string(ep) +
        ") must divide tensor_model_parallel_size x context_parallel_size x data_parallel_size (" +
        std::to_string(ranks_per_stage) + "): the expert grid spans the same ranks");
  }
  REMAT_SEARCH_RETURN_IF_ERROR(Divides("model.moe_ffn_hidden_size", m.EffectiveMoeFfnHiddenSize(),
                                       "parallel.expert_tensor_parallel_size", etp));
  if (m.add_bias_linear && etp > 1) {
    return InvalidArgument(
        "parallel.expert_tensor_parallel_size: must be 1 with model.add_bias_linear (Megatron: "
        "bias in MoE is only supported when ETP == 1)");
  }
  if (p.tensor_model_parallel_size > 1 && !p.sequence_parallel) {
    return InvalidArgument(
        "parallel.sequence_parallel: must be true for MoE with tensor_model_parallel_size > 1 "
        "(Megatron's MoELayer refuses MoE and TP without sequence parallelism in training)");
  }
  if (m.moe_token_dispatcher_type == MoeTokenDispatcher::kFlex && etp * ep == 1) {
    return InvalidArgument(
        "model.moe_token_dispatcher_type: flex needs expert_tensor_parallel_size x "
        "expert_model_parallel_size > 1 (Megatron's DeepEP/HybridEP dispatcher)");
  }
  return OkStatus();
}

Status ValidateParallel(const ModelSpec& m, const ParallelSpec& p) {
  REMAT_SEARCH_RETURN_IF_ERROR(
      Positive("parallel.tensor_model_parallel_size", p.tensor_model_parallel_size));
  REMAT_SEARCH_RETURN_IF_ERROR(
      Positive("parallel.pipeline_model_parallel_size", p.pipeline_model_parallel_size));
  REMAT_SEARCH_RETURN_IF_ERROR(
      Positive("parallel.expert_model_parallel_size", p.expert_model_parallel_size));
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("parallel.data_parallel_size", p.data_parallel_size));
  const int tp = p.tensor_model_parallel_size;
  REMAT_SEARCH_RETURN_IF_ERROR(Divides("model.num_attention_heads", m.num_attention_heads,
                                       "parallel.tensor_model_parallel_size", tp));
  if (!m.multi_latent_attention) {
    REMAT_SEARCH_RETURN_IF_ERROR(Divides("model.num_query_groups", m.EffectiveQueryGroups(),
                                         "parallel.tensor_model_parallel_size", tp));
  }
  REMAT_SEARCH_RETURN_IF_ERROR(Divides("model.ffn_hidden_size", m.EffectiveFfnHiddenSize(),
                                       "parallel.tensor_model_parallel_size", tp));
  if (m.HasSharedExperts()) {
    REMAT_SEARCH_RETURN_IF_ERROR(Divides("model.moe_shared_expert_intermediate_size",
                                         *m.moe_shared_expert_intermediate_size,
                                         "parallel.tensor_model_parallel_size", tp));
  }
  REMAT_SEARCH_RETURN_IF_ERROR(
      Positive("parallel.context_parallel_size", p.context_parallel_size));
  const int cp = p.context_parallel_size;
  if (cp > 1) {
    // Megatron-LM: each CP rank takes two of 2 x CP sequence chunks (causal load balance).
    if (m.seq_length % (2 * cp) != 0) {
      return InvalidArgument("model.seq_length: " + std::to_string(m.seq_length) +
                             " must be divisible by 2 x context_parallel_size (" +
                             std::to_string(2 * cp) + ")");
    }
    if (m.attention_backend != AttentionBackend::kFlash) {
      return InvalidArgument(
          "parallel.context_parallel_size: needs model.attention_backend flash (Megatron Core's "
          "unfused local attention refuses context parallelism; only TEDotProductAttention "
          "supports it)");
    }
    // Transformer Engine's Ulysses all-to-all scatters the heads over the CP group
    // (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py at d0067d0,
    // AttnFuncWithCPAndQKVOA2A): every TP rank's query and key/value heads must split evenly.
    if (p.cp_comm_type == CpCommType::kA2a || p.cp_comm_type == CpCommType::kA2aP2p) {
      const int kv_heads = m.multi_latent_attention ? m.num_attention_heads : m.EffectiveQueryGroups();
      if ((m.num_attention_heads / tp) % cp != 0 || (kv_heads / tp) % cp != 0) {
        return InvalidArgument(
            "parallel.cp_comm_type: a2a needs the attention heads (" +
            std::to_string(m.num_attention_heads) + ") and key/value heads (" +
            std::to_string(kv_heads) + ") per tensor-parallel rank divisible by "
            "context_parallel_size (" + std::to_string(cp) + ")");
      }
    }
  }
  if (p.sequence_parallel) {
    if (tp <= 1) {
      return InvalidArgument(
          "parallel.sequence_parallel: needs tensor_model_parallel_size > 1 (Megatron Bridge "
          "turns it off at TP 1; set it to false)");
    }
    REMAT_SEARCH_RETURN_IF_ERROR(Divides("model.seq_length", m.seq_length / cp,
                                         "parallel.tensor_model_parallel_size", tp));
  }
  const int ep = p.expert_model_parallel_size;
  if (ep > 1 && !m.IsMoe()) {
    return InvalidArgument(
        "parallel.expert_model_parallel_size: must be 1 for a dense model (no experts)");
  }
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateExpertGrid(m, p));
  if (m.overlap_moe_expert_parallel_comm && ep <= 1) {
    return InvalidArgument(
        "model.overlap_moe_expert_parallel_comm: needs expert_model_parallel_size > 1");
  }
  if (m.cpu_offloading && p.pipeline_model_parallel_size > 1) {
    return InvalidArgument(
        "model.cpu_offloading: there is no support for pipeline parallelism with CPU offloading");
  }
  return OkStatus();
}

Status ValidateTrain(const TrainSpec& t) {
  return Positive("train.micro_batch_size", t.micro_batch_size);
}

Status ValidateSearch(const SearchOptions& s) {
  if (!(s.memory_budget_gib > 0) || !std::isfinite(s.memory_budget_gib)) {
    return InvalidArgument("search.memory_budget_gib: must be a positive number");
  }
  if (!(s.memory_headroom_gib >= 0) || !std::isfinite(s.memory_headroom_gib)) {
    return InvalidArgument("search.memory_headroom_gib: must be 0 or a positive number");
  }
  if (s.memory_headroom_gib >= s.memory_budget_gib) {
    return InvalidArgument(
        "search.memory_headroom_gib: must be less than search.memory_budget_gib (nothing could be "
        "recommended)");
  }
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("search.max_trials", s.max_trials));
  if (s.warmup_steps < 0) return InvalidArgument("search.warmup_steps: must be 0 or more");
  if (s.warmup_max_steps < s.warmup_steps) {
    return InvalidArgument("search.warmup_max_steps: must be at least search.warmup_steps (" +
                           std::to_string(s.warmup_steps) + "), the shortest warm-up");
  }
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("search.steady_window", s.steady_window));
  if (s.warmup_max_steps > 0 && s.steady_window > s.warmup_max_steps) {
    return InvalidArgument("search.steady_window: must be at most search.warmup_max_steps (" +
                           std::to_string(s.warmup_max_steps) +
                           "): the window is made of warm-up steps");
  }
  if (!(s.steady_tolerance > 0 && s.steady_tolerance < 1)) {
    return InvalidArgument(
        "search.steady_tolerance: must be a fraction between 0 and 1 (e.g. 0.05: the window's "
        "steps within 5% of their median)");
  }
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("search.measure_steps", s.measure_steps));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateNoiseOptions(s));
  if (s.backend == Backend::kReplay && s.replay_table.empty()) {
    return InvalidArgument("search.replay_table: required with backend replay");
  }
  if (s.backend == Backend::kCommand && s.command_template.empty()) {
    return InvalidArgument(
        "search.command_template: required with backend command (the name of a template the "
        "worker's operator configured)");
  }
  if (!(s.trial_timeout_s > 0) || !std::isfinite(s.trial_timeout_s)) {
    return InvalidArgument("search.trial_timeout_s: must be a positive number");
  }
  REMAT_SEARCH_RETURN_IF_ERROR(Positive("search.gpus_per_node", s.gpus_per_node));
  for (const auto& [field, value] : {std::pair<const char*, double>{"search.nvlink_gb_s", s.nvlink_gb_s},
                                     {"search.network_gb_s", s.network_gb_s}}) {
    if (!(value > 0) || !std::isfinite(value) || value > 1e6) {
      return InvalidArgument(std::string(field) +
                             ": must be a positive bandwidth in GB/s (at most 1e6)");
    }
  }
  if (s.layout_proxy) {
    // Stand-in collectives exist in the builtin engine only (search/layout_proxy.h).
    if (s.backend != Backend::kBuiltin) {
      return InvalidArgument(std::string("search.layout_proxy: needs backend builtin (backend ") +
                             Name(s.backend) + " runs the real ranks)");
    }
  }
  return OkStatus();
}

// Ok when the proxy depths can predict the full depth: 1 <= d1 < d2 < num_layers, both multiples
// of the layers' unit per model chunk (PP x virtual chunks, even stages only), and the MoE pattern of layers d1..num_layers-1 uniform (all
// dense or all MoE) so that the per-layer slope holds (search/depth_proxy.h). Ok when no proxy
// is set.
Status ValidateProxyDepths(const SearchSpec& spec) {
  const auto& d = spec.search.proxy_layers;
  if (d.empty()) return OkStatus();
  if (d.size() != 2) {
    return InvalidArgument("search.proxy_layers: must list two depths [shallow, deep]");
  }
  // Layers per model chunk: the unit that a proxy depth must split into evenly.
  const int pp =
      std::max(1, spec.parallel.pipeline_model_parallel_size) * spec.parallel.VirtualChunks();
  const ParallelSpec& par = spec.parallel;
  if (par.num_layers_in_first_pipeline_stage || par.num_layers_in_last_pipeline_stage ||
      par.account_for_embedding_in_pipeline_split || par.account_for_loss_in_pipeline_split ||
      !par.pipeline_model_parallel_layout.empty()) {
    return InvalidArgument(
        "search.proxy_layers: not supported with uneven pipeline stages (num_layers_in_*_"
        "pipeline_stage, account_for_*_in_pipeline_split, pipeline_model_parallel_layout): a cut "
        "model would split differently");
  }
  if (d[0] < 1 || d[1] <= d[0]) {
    return InvalidArgument("search.proxy_layers: must be two increasing positive depths, got [" +
                           std::to_string(d[0]) + ", " + std::to_string(d[1]) + "]");
  }
  if (d[1] >= spec.model.num_layers) {
    return InvalidArgument("search.proxy_layers: the deeper proxy (" + std::to_string(d[1]) +
                           ") must be shallower than model.num_layers (" +
                           std::to_string(spec.model.num_layers) + ")");
  }
  if (d[0] % pp != 0 || d[1] % pp != 0) {
    return InvalidArgument("search.proxy_layers: depths must be multiples of "
                           "pipeline_model_parallel_size x virtual chunks (" +
                           std::to_string(pp) + ")");
  }
  if (spec.model.IsMoe()) {
    const bool kind = spec.model.IsMoeLayer(d[0]);
    for (int i = d[0]; i < spec.model.num_layers; ++i) {
      if (spec.model.IsMoeLayer(i) != kind) {
        return InvalidArgument(
            "search.proxy_layers: layers from the shallow depth on must all be of one kind "
            "(dense or MoE) for a per-layer cost to hold; layer " + std::to_string(i) +
            " differs (check model.moe_layer_freq)");
      }
    }
  }
  return OkStatus();
}

// Upper bounds (search/limits.h), checked before anything else so that no later rule or the
// planner multiplies or loops over an absurd number. Lower bounds stay with the field's rules.
Status AtMost(const char* field, long long value, long long limit) {
  if (value > limit) {
    return InvalidArgument(std::string(field) + ": " + std::to_string(value) +
                           " is above remat's limit of " + std::to_string(limit));
  }
  return OkStatus();
}
Status AtMost(const char* field, const std::optional<int>& value, long long limit) {
  return value ? AtMost(field, *value, limit) : OkStatus();
}
Status NumberAtMost(const char* field, double value, double limit) {
  if (value > limit) {
    return InvalidArgument(std::string(field) + ": above remat's limit of " +
                           std::to_string(static_cast<long long>(limit)));
  }
  return OkStatus();
}
Status Text(const char* field, const std::string& value, size_t max_bytes) {
  if (value.size() > max_bytes) {
    return InvalidArgument(std::string(field) + ": longer than " + std::to_string(max_bytes) +
                           " bytes");
  }
  if (!IsValidUtf8(value) || std::any_of(value.begin(), value.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
      })) {
    return InvalidArgument(std::string(field) + ": " + QuoteForError(value) +
                           " holds control characters or is not UTF-8");
  }
  return OkStatus();
}

Status ValidateLimits(const SearchSpec& spec) {
  namespace l = limits;
  const ModelSpec& m = spec.model;
  REMAT_SEARCH_RETURN_IF_ERROR(Text("name", spec.name, l::kMaxNameBytes));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("model.num_layers", m.num_layers, l::kMaxLayers));
  for (const auto& [field, value] : std::initializer_list<std::pair<const char*, long long>>{
           {"model.hidden_size", m.hidden_size},
           {"model.kv_lora_rank", m.kv_lora_rank},
           {"model.qk_head_dim", m.qk_head_dim},
           {"model.qk_pos_emb_head_dim", m.qk_pos_emb_head_dim},
           {"model.v_head_dim", m.v_head_dim}}) {
    REMAT_SEARCH_RETURN_IF_ERROR(AtMost(field, value, l::kMaxHiddenSize));
  }
  REMAT_SEARCH_RETURN_IF_ERROR(
      AtMost("model.ffn_hidden_size", m.ffn_hidden_size, l::kMaxHiddenSize));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("model.kv_channels", m.kv_channels, l::kMaxHiddenSize));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("model.q_lora_rank", m.q_lora_rank, l::kMaxHiddenSize));
  REMAT_SEARCH_RETURN_IF_ERROR(
      AtMost("model.moe_ffn_hidden_size", m.moe_ffn_hidden_size, l::kMaxHiddenSize));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("model.moe_shared_expert_intermediate_size",
                                      m.moe_shared_expert_intermediate_size, l::kMaxHiddenSize));
  REMAT_SEARCH_RETURN_IF_ERROR(
      AtMost("model.num_attention_heads", m.num_attention_heads, l::kMaxAttentionHeads));
  REMAT_SEARCH_RETURN_IF_ERROR(
      AtMost("model.num_query_groups", m.num_query_groups, l::kMaxAttentionHeads));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("model.seq_length", m.seq_length, l::kMaxSeqLength));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("model.vocab_size", m.vocab_size, l::kMaxVocabSize));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("model.num_moe_experts", m.num_moe_experts, l::kMaxExperts));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("model.moe_router_topk", m.moe_router_topk, l::kMaxExperts));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("model.moe_layer_freq", m.moe_layer_freq.every, l::kMaxLayers));
  if (m.moe_layer_freq.pattern.size() > static_cast<size_t>(l::kMaxLayers)) {
    return AtMost("model.moe_layer_freq", static_cast<long long>(m.moe_layer_freq.pattern.size()),
                  l::kMaxLayers);
  }
  if (m.experimental_attention_variant) {
    REMAT_SEARCH_RETURN_IF_ERROR(Text("model.experimental_attention_variant",
                                      *m.experimental_attention_variant, l::kMaxNameBytes));
  }

  REMAT_SEARCH_RETURN_IF_ERROR(
      AtMost("train.micro_batch_size", spec.train.micro_batch_size, l::kMaxMicroBatchSize));
  REMAT_SEARCH_RETURN_IF_ERROR(
      AtMost("train.global_batch_size", spec.train.global_batch_size, l::kMaxGlobalBatchSize));

  const ParallelSpec& p = spec.parallel;
  long long world = 1;
  for (const auto& [field, value] : std::initializer_list<std::pair<const char*, long long>>{
           {"parallel.tensor_model_parallel_size", p.tensor_model_parallel_size},
           {"parallel.context_parallel_size", p.context_parallel_size},
           {"parallel.pipeline_model_parallel_size", p.pipeline_model_parallel_size},
           {"parallel.data_parallel_size", p.data_parallel_size}}) {
    REMAT_SEARCH_RETURN_IF_ERROR(AtMost(field, value, l::kMaxParallelSize));
    world *= std::max(1LL, value);
    if (world > l::kMaxWorldSize) {
      return InvalidArgument(
          "parallel: the world size (tensor × context × pipeline × data parallel sizes) is above "
          "remat's limit of " + std::to_string(l::kMaxWorldSize) + " ranks");
    }
  }
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("parallel.expert_model_parallel_size",
                                      p.expert_model_parallel_size, l::kMaxParallelSize));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("parallel.virtual_pipeline_model_parallel_size",
                                      p.virtual_pipeline_model_parallel_size, l::kMaxLayers));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("parallel.num_layers_in_first_pipeline_stage",
                                      p.num_layers_in_first_pipeline_stage, l::kMaxLayers));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("parallel.num_layers_in_last_pipeline_stage",
                                      p.num_layers_in_last_pipeline_stage, l::kMaxLayers));

  const SearchOptions& o = spec.search;
  REMAT_SEARCH_RETURN_IF_ERROR(
      NumberAtMost("search.memory_budget_gib", o.memory_budget_gib, l::kMaxMemoryGib));
  REMAT_SEARCH_RETURN_IF_ERROR(
      NumberAtMost("search.memory_headroom_gib", o.memory_headroom_gib, l::kMaxMemoryGib));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("search.max_trials", o.max_trials, l::kMaxTrials));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("search.warmup_steps", o.warmup_steps, l::kMaxSteps));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("search.measure_steps", o.measure_steps, l::kMaxSteps));
  REMAT_SEARCH_RETURN_IF_ERROR(
      NumberAtMost("search.trial_timeout_s", o.trial_timeout_s, l::kMaxTrialTimeoutS));
  REMAT_SEARCH_RETURN_IF_ERROR(Text("search.replay_table", o.replay_table, l::kMaxPathBytes));
  REMAT_SEARCH_RETURN_IF_ERROR(
      Text("search.command_template", o.command_template, l::kMaxNameBytes));
  REMAT_SEARCH_RETURN_IF_ERROR(AtMost("search.gpus_per_node", o.gpus_per_node, l::kMaxParallelSize));
  for (int d : o.proxy_layers) {
    REMAT_SEARCH_RETURN_IF_ERROR(AtMost("search.proxy_layers", d, l::kMaxLayers));
  }
  if (o.proxy_layers.size() > 16) {
    return InvalidArgument("search.proxy_layers: must list two depths [shallow, deep]");
  }
  return OkStatus();
}

}  // namespace

bool ModelSpec::IsMoeLayer(int i) const {
  if (!IsMoe()) return false;
  const std::vector<int>& pattern = moe_layer_freq.pattern;
  if (!pattern.empty()) {
    return i >= 0 && i < static_cast<int>(pattern.size()) && pattern[i] == 1;
  }
  return moe_layer_freq.every > 0 && i % moe_layer_freq.every == 0;
}

int ModelSpec::NumMoeLayers() const {
  int n = 0;
  for (int i = 0; i < num_layers; ++i) n += IsMoeLayer(i) ? 1 : 0;
  return n;
}

Status ValidateSpec(const SearchSpec& spec) {
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateLimits(spec));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateModel(spec.model, spec.parallel));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateParallel(spec.model, spec.parallel));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateTrain(spec.train));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidatePipelineLayout(spec));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateSearch(spec.search));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateProxyDepths(spec));
  return ValidateCompatibility(spec);
}

const char* Name(Normalization v) { return kNormalization[static_cast<int>(v)]; }
const char* Name(AttentionBackend v) { return kAttentionBackend[static_cast<int>(v)]; }
const char* Name(PositionEmbedding v) { return kPositionEmbedding[static_cast<int>(v)]; }
const char* Name(Precision v) { return kPrecision[static_cast<int>(v)]; }
const char* Name(MemoryMetric v) { return kMemoryMetric[static_cast<int>(v)]; }
const char* Name(StrategyKind v) { return kStrategy[static_cast<int>(v)]; }
const char* Name(Objective v) { return kObjective[static_cast<int>(v)]; }
const char* Name(Backend v) { return kBackend[static_cast<int>(v)]; }
const char* Name(Device v) { return kDevice[static_cast<int>(v)]; }
const char* Name(TransformerImpl v) { return kTransformerImpl[static_cast<int>(v)]; }
const char* Name(CrossEntropyFusionImpl v) { return kCrossEntropyFusionImpl[static_cast<int>(v)]; }
const char* Name(DType v) { return kDType[static_cast<int>(v)]; }
const char* Name(ShardingStrategy v) { return kShardingStrategy[static_cast<int>(v)]; }
const char* Name(CpCommType v) { return kCpCommType[static_cast<int>(v)]; }
const char* Name(MoeTokenDispatcher v) { return kMoeTokenDispatcher[static_cast<int>(v)]; }

std::optional<Normalization> ParseNormalization(const std::string& s) {
  return ParseByName<Normalization>(s, kNormalization);
}
AttentionBackend AutoAttentionBackend(TransformerImpl impl) {
  return impl == TransformerImpl::kTransformerEngine ? AttentionBackend::kFlash
                                                     : AttentionBackend::kUnfused;
}

std::optional<AttentionBackend> ParseAttentionBackend(const std::string& s) {
  // Megatron Core's AttnBackend names, by what the kernel holds for backward: Transformer
  // Engine's auto picks a fused kernel and cuDNN's fused attention keeps no score matrix, as
  // flash does; local is Megatron's own attention, which materialises the scores as unfused.
  if (s == "auto" || s == "fused") return AttentionBackend::kFlash;
  if (s == "local") return AttentionBackend::kUnfused;
  return ParseByName<AttentionBackend>(s, kAttentionBackend);
}
std::optional<PositionEmbedding> ParsePositionEmbedding(const std::string& s) {
  return ParseByName<PositionEmbedding>(s, kPositionEmbedding);
}
std::optional<Precision> ParsePrecision(const std::string& s) {
  return ParseByName<Precision>(s, kPrecision);
}
std::optional<MemoryMetric> ParseMemoryMetric(const std::string& s) {
  return ParseByName<MemoryMetric>(s, kMemoryMetric);
}
std::optional<StrategyKind> ParseStrategyKind(const std::string& s) {
  return ParseByName<StrategyKind>(s, kStrategy);
}
std::optional<Objective> ParseObjective(const std::string& s) {
  return ParseByName<Objective>(s, kObjective);
}
std::optional<Backend> ParseBackend(const std::string& s) {
  return ParseByName<Backend>(s, kBackend);
}
std::optional<Device> ParseDevice(const std::string& s) { return ParseByName<Device>(s, kDevice); }

#define REMAT_SPEC_ENUM(E, names, parse)                                   \
  template <>                                                             \
  const std::vector<std::string>& EnumNames<E>() {                        \
    static const std::vector<std::string> k(std::begin(names), std::end(names)); \
    return k;                                                             \
  }                                                                       \
  template <>                                                             \
  std::optional<E> ParseEnum<E>(const std::string& s) {                   \
    return parse(s);                                                      \
  }
REMAT_SPEC_ENUM(Normalization, kNormalization, ParseNormalization)
REMAT_SPEC_ENUM(AttentionBackend, kAttentionBackend, ParseAttentionBackend)
REMAT_SPEC_ENUM(PositionEmbedding, kPositionEmbedding, ParsePositionEmbedding)
REMAT_SPEC_ENUM(Precision, kPrecision, ParsePrecision)
REMAT_SPEC_ENUM(MemoryMetric, kMemoryMetric, ParseMemoryMetric)
REMAT_SPEC_ENUM(StrategyKind, kStrategy, ParseStrategyKind)
REMAT_SPEC_ENUM(Objective, kObjective, ParseObjective)
REMAT_SPEC_ENUM(Backend, kBackend, ParseBackend)
REMAT_SPEC_ENUM(Device, kDevice, ParseDevice)
REMAT_SPEC_ENUM(TransformerImpl, kTransformerImpl,
                [](const std::string& v) { return ParseByName<TransformerImpl>(v, kTransformerImpl); })
REMAT_SPEC_ENUM(CrossEntropyFusionImpl, kCrossEntropyFusionImpl, [](const std::string& v) {
  return ParseByName<CrossEntropyFusionImpl>(v, kCrossEntropyFusionImpl);
})
REMAT_SPEC_ENUM(DType, kDType, [](const std::string& v) -> std::optional<DType> {
  // torch's names too, as Megatron Bridge writes OptimizerConfig's dtypes (torch.bfloat16, ...);
  // fp8 moments are stored as uint8.
  std::string name = v.rfind("torch.", 0) == 0 ? v.substr(6) : v;
  if (name == "float32" || name == "float") return DType::kFp32;
  if (name == "bfloat16") return DType::kBf16;
  if (name == "float16" || name == "half") return DType::kFp16;
  if (name == "uint8") return DType::kFp8;
  return ParseByName<DType>(name, kDType);
})
REMAT_SPEC_ENUM(ShardingStrategy, kShardingStrategy, [](const std::string& v) {
  return ParseByName<ShardingStrategy>(v, kShardingStrategy);
})
REMAT_SPEC_ENUM(CpCommType, kCpCommType, [](const std::string& v) -> std::optional<CpCommType> {
  // TransformerConfig's docstring spells it all_gather; Megatron-LM's --cp-comm-type allgather.
  if (v == "all_gather") return CpCommType::kAllGather;
  return ParseByName<CpCommType>(v, kCpCommType);
})
REMAT_SPEC_ENUM(MoeTokenDispatcher, kMoeTokenDispatcher, [](const std::string& v) {
  return ParseByName<MoeTokenDispatcher>(v, kMoeTokenDispatcher);
})
#undef REMAT_SPEC_ENUM

SearchSpec ResolveDefaults(const SearchSpec& spec) {
  SearchSpec r = spec;
  ModelSpec& m = r.model;
  m.num_query_groups = m.EffectiveQueryGroups();
  m.ffn_hidden_size = m.EffectiveFfnHiddenSize();
  m.kv_channels = m.EffectiveKvChannels();
  m.normalization = m.EffectiveNormalization();
  if (m.IsMoe()) m.moe_ffn_hidden_size = m.EffectiveMoeFfnHiddenSize();
  if (!m.multi_latent_attention) {
    // MLA's dimensions mean nothing without MLA: one spelling of the same model.
    const ModelSpec defaults;
    m.q_lora_rank = defaults.q_lora_rank;
    m.kv_lora_rank = defaults.kv_lora_rank;
    m.qk_head_dim = defaults.qk_head_dim;
    m.qk_pos_emb_head_dim = defaults.qk_pos_emb_head_dim;
    m.v_head_dim = defaults.v_head_dim;
  }
  return r;
}

}  // namespace remat::search
