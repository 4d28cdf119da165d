// The search spec: the model, its parallel layout, training settings and search options.
//
// Field names are Megatron Core / Megatron Bridge names. A default-constructed struct holds
// Megatron Core's defaults (TransformerConfig / GPTModel), so an omitted YAML key takes the value
// a Megatron user would get. Fields whose Megatron default depends on other fields (e.g.
// ffn_hidden_size = 4 * hidden_size) are std::optional here; the Effective*() helpers resolve them.
// Thread-safety: plain values.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "search/status.h"
#include "search/units.h"

namespace remat::search {

enum class Normalization { kLayerNorm, kRMSNorm };
enum class AttentionBackend { kUnfused, kFlash };
enum class PositionEmbedding { kLearnedAbsolute, kRope, kNone };
enum class Precision { kBf16, kFp32 };
enum class MemoryMetric { kReserved, kAllocated };
enum class StrategyKind { kGuided, kExhaustive };
// What the guided search maps: the whole memory/throughput frontier, or only what decides the
// recommendation (the decision guide's path; search/planner.h).
enum class Objective { kFrontier, kRecommend };
// megatron: trials run Megatron Core's own model and step (worker/megatron_executor.h).
enum class Backend { kBuiltin, kCommand, kReplay, kMegatron };
enum class Device { kAuto, kCuda, kCpu };
// Megatron Core's layer implementation: Transformer Engine's modules or its own local ones.
enum class TransformerImpl { kLocal, kTransformerEngine };
enum class CrossEntropyFusionImpl { kNative, kTe };
// A tensor dtype of the optimizer's state (OptimizerConfig's torch dtypes; fp8 is uint8 storage).
enum class DType { kFp32, kBf16, kFp16, kFp8 };
// Megatron-FSDP's data_parallel_sharding_strategy: what is sharded over the data-parallel group.
enum class ShardingStrategy { kNoShard, kOptim, kOptimGrads, kOptimGradsParams };
// Megatron's cp_comm_type: how context-parallel attention exchanges keys and values (Transformer
// Engine's ring of KV chunks, Ulysses all-to-all, KV all-gather, or the hierarchical a2a+p2p).
enum class CpCommType { kP2p, kA2a, kAllGather, kA2aP2p };
// Megatron's moe_token_dispatcher_type (MoEAllGatherTokenDispatcher, MoEAlltoAllTokenDispatcher,
// MoEFlexTokenDispatcher).
enum class MoeTokenDispatcher { kAllgather, kAlltoall, kFlex };

// Megatron's moe_layer_freq: every `every`-th layer has an MoE MLP (1: all of them), or, when
// `pattern` is not empty, layer i has one when pattern[i] is 1 (one 0/1 entry per layer).
struct MoeLayerFreq {
  int every = 1;
  std::vector<int> pattern;
  bool operator==(const MoeLayerFreq& o) const { return every == o.every && pattern == o.pattern; }
  bool operator!=(const MoeLayerFreq& o) const { return !(*this == o); }
};

// Reads moe_layer_freq written as text: an integer ("3"), a list ("[0, 1, 1]") or Megatron's
// Python expression of lists, repetitions and concatenations ("([0]*3+[1]*58)", "[1,0]*4"), as
// Megatron-LM's --moe-layer-freq and Megatron Bridge recipes write it. InvalidArgument naming
// `field` when the text is none of these (nothing is evaluated).
StatusOr<MoeLayerFreq> ParseMoeLayerFreq(const std::string& text, const std::string& field);

// The sections' members are declared in search/spec_fields.def, with their defaults and docs.
struct ModelSpec {
#define REMAT_MODEL(type, name, default_value, ...) type name = default_value;
#include "search/spec_fields.def"

  int EffectiveQueryGroups() const { return num_query_groups.value_or(num_attention_heads); }
  int EffectiveFfnHiddenSize() const { return ffn_hidden_size.value_or(4 * hidden_size); }
  Normalization EffectiveNormalization() const {
    // MLATransformerConfig's default is RMSNorm; TransformerConfig's LayerNorm.
    return normalization.value_or(multi_latent_attention ? Normalization::kRMSNorm
                                                         : Normalization::kLayerNorm);
  }
  int EffectiveKvChannels() const {
    return kv_channels.value_or(num_attention_heads > 0 ? hidden_size / num_attention_heads : 0);
  }
  int EffectiveMoeFfnHiddenSize() const {
    return moe_ffn_hidden_size.value_or(EffectiveFfnHiddenSize());
  }
  bool IsMoe() const { return num_moe_experts.has_value() && *num_moe_experts > 0; }
  bool HasSharedExperts() const {
    return IsMoe() && moe_shared_expert_intermediate_size.has_value() &&
           *moe_shared_expert_intermediate_size > 0;
  }
  bool HasCudaGraphs() const { return !cuda_graph_impl.empty() && cuda_graph_impl != "none"; }
  // Whether module `name` (attn, mlp, moe, ...) runs inside a captured CUDA graph: all of the
  // layer under full_iteration or a whole-layer scope, else the listed modules.
  bool GraphCaptures(const std::string& name) const;
  bool IsGdn() const {
    return experimental_attention_variant &&
           (*experimental_attention_variant == "gdn" || *experimental_attention_variant == "gdn2");
  }
  // Whether layer `i` (0-based, global) has an MoE MLP, following Megatron's moe_layer_freq.
  bool IsMoeLayer(int i) const;
  // Under Transformer Engine a norm followed by a linear is fused into it (TE LayerNormLinear;
  // the layer spec's norm is IdentityOp): the input norm of standard attention and the pre-MLP
  // norm of a dense layer. A fused norm's output lives in the linear's saved state, which
  // `layernorm` recompute cannot discard; MLA's input norm and an MoE layer's pre-MLP norm stay
  // separate (megatron/core/models/gpt/gpt_layer_specs.py at d98e8a6).
  bool InputNormFused() const {
    return transformer_impl == TransformerImpl::kTransformerEngine && !multi_latent_attention;
  }
  bool PreMlpNormFused(int layer) const {
    return transformer_impl == TransformerImpl::kTransformerEngine && !IsMoeLayer(layer);
  }
  int NumMoeLayers() const;
};

struct TrainSpec {
#define REMAT_TRAIN(type, name, default_value, ...) type name = default_value;
#include "search/spec_fields.def"
};

struct ParallelSpec {
#define REMAT_PARALLEL(type, name, default_value, ...) type name = default_value;
#include "search/spec_fields.def"

  // Megatron's world size: TP x CP x PP x DP. Expert parallelism is carved out of the same ranks.
  int WorldSize() const {
    return tensor_model_parallel_size * context_parallel_size * pipeline_model_parallel_size *
           data_parallel_size;
  }
  // Megatron's expert_tensor_parallel_size: null means tensor_model_parallel_size.
  int EffectiveExpertTensorParallelSize() const {
    return expert_tensor_parallel_size.value_or(tensor_model_parallel_size);
  }
  // Virtual pipeline chunks per rank: 1 unless interleaving (VPP > 1 with PP > 1).
  int VirtualChunks() const {
    return pipeline_model_parallel_size > 1 && virtual_pipeline_model_parallel_size
               ? std::max(1, *virtual_pipeline_model_parallel_size)
               : 1;
  }
};

struct SearchOptions {
#define REMAT_SEARCH(type, name, default_value, ...) type name = default_value;
#include "search/spec_fields.def"

  uint64_t MemoryBudgetBytes() const {
    return GibToBytes(memory_budget_gib);
  }
  // Whether trials run on a CUDA device (auto: a GPU wherever there is one). The memory model
  // then adds what CUDA's libraries allocate (search/memory_model.h).
  bool OnCuda() const { return device != Device::kCpu; }
  // The budget less the headroom: what a recommended policy must fit.
  uint64_t RecommendBudgetBytes() const {
    return static_cast<uint64_t>((memory_budget_gib - memory_headroom_gib) * 1024.0 * 1024.0 *
                                 1024.0);
  }
};

struct SearchSpec {
  std::string name;
  ModelSpec model;
  TrainSpec train;
  ParallelSpec parallel;
  SearchOptions search;

  // global_batch_size, or its default micro_batch_size x data_parallel_size.
  long long EffectiveGlobalBatchSize() const {
    return train.global_batch_size
               ? *train.global_batch_size
               : 1LL * train.micro_batch_size * parallel.data_parallel_size;
  }
  // Micro-batches per step on each data-parallel replica: global_batch_size / (micro_batch_size
  // x data_parallel_size); at least 1 (ValidateSpec refuses a global batch that is not whole).
  int NumMicrobatches() const {
    const long long per_pass = 1LL * std::max(1, train.micro_batch_size) *
                               std::max(1, parallel.data_parallel_size);
    return static_cast<int>(std::max(1LL, EffectiveGlobalBatchSize() / per_pass));
  }
};

// `spec` with the architecture's derived defaults written out: num_query_groups, ffn_hidden_size,
// kv_channels, normalization and moe_ffn_hidden_size (MoE models) take the values the
// Effective*() helpers give, and MLA's dimensions their defaults on a model without MLA (where
// they mean nothing). What the spec means is unchanged; a field that null leaves off (no
// experts, no interleaving) stays null, and so does global_batch_size, whose default follows the
// data-parallel size (a capacity lever that doubles DP keeps one micro-batch per step).
SearchSpec ResolveDefaults(const SearchSpec& spec);

// Checks every field's value and the relations between fields (divisibility, ranges, MoE/MLA
// consistency), as Megatron Core would at config time, then ValidateCompatibility. Returns the
// first problem, as InvalidArgument whose message starts with the field path
// ("model.kv_lora_rank: ..."), or Ok.
Status ValidateSpec(const SearchSpec& spec);

// The one home of the cross-feature rules that make a whole spec unrunnable in Megatron Core or
// Megatron-LM, whatever the recompute policy (grouped-GEMM experts with biases, FP8, CUDA
// graphs, CPU offloading, the DDP overlap settings): refused before any trial, so that no trial
// comes back `invalid` for them. Called by ValidateSpec; InvalidArgument naming the field, or Ok.
Status ValidateCompatibility(const SearchSpec& spec);

// Why the builtin LibTorch engine cannot run any trial of `spec` (pipeline or context
// parallelism, several micro-batches, GDN, FP8, CUDA graphs, ...), naming the field, or "" when
// it can. Megatron's own rules are ValidateCompatibility's; these are the engine's limits. The
// coordinator refuses a builtin search with such a spec at submit; `remat plan` and `remat
// validate`, which plan and check for any backend, print it as a note. The engine refuses the
// same (engine/model.h UnsupportedReason), so the two cannot drift.
std::string BuiltinBackendProblem(const SearchSpec& spec);

// Names for enums, as written in the YAML spec (e.g. "RMSNorm", "unfused", "reserved").
const char* Name(Normalization v);
const char* Name(AttentionBackend v);
const char* Name(PositionEmbedding v);
const char* Name(Precision v);
const char* Name(MemoryMetric v);
const char* Name(StrategyKind v);
const char* Name(Objective v);
const char* Name(Backend v);
const char* Name(Device v);
const char* Name(TransformerImpl v);
const char* Name(CrossEntropyFusionImpl v);
const char* Name(DType v);
const char* Name(ShardingStrategy v);
const char* Name(CpCommType v);
const char* Name(MoeTokenDispatcher v);

// The names of every value of a spec enum, in declaration order (the names Name() gives), and
// ParseEnum<E>, which reads them back (with ParseAttentionBackend's aliases): the generic forms
// of the functions below, for code that handles every field alike (search/spec_fields.h).
template <typename E>
const std::vector<std::string>& EnumNames();
template <typename E>
std::optional<E> ParseEnum(const std::string& s);

// Parses those names back; returns nullopt for an unknown name. ParseAttentionBackend also reads
// Megatron Core's AttnBackend names: auto and fused as kFlash, local as kUnfused.
std::optional<Normalization> ParseNormalization(const std::string& s);
std::optional<AttentionBackend> ParseAttentionBackend(const std::string& s);
// Megatron's attention_backend auto for a layer implementation: the local layer's
// DotProductAttention is unfused; Transformer Engine picks a fused kernel (FusedAttention on
// sm90+, FlashAttention elsewhere: flash here). The spec reader applies it when
// model.attention_backend is absent, null or auto.
AttentionBackend AutoAttentionBackend(TransformerImpl impl);
std::optional<PositionEmbedding> ParsePositionEmbedding(const std::string& s);
std::optional<Precision> ParsePrecision(const std::string& s);
std::optional<MemoryMetric> ParseMemoryMetric(const std::string& s);
std::optional<StrategyKind> ParseStrategyKind(const std::string& s);
std::optional<Objective> ParseObjective(const std::string& s);
std::optional<Backend> ParseBackend(const std::string& s);
std::optional<Device> ParseDevice(const std::string& s);

}  // namespace remat::search
