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

struct ModelSpec {
  int num_layers = 0;           // required
  int hidden_size = 0;          // required
  int num_attention_heads = 0;  // required
  int seq_length = 0;           // required
  int vocab_size = 0;           // required
  std::optional<int> num_query_groups;  // default: num_attention_heads (plain multi-head)
  std::optional<int> ffn_hidden_size;   // default: 4 * hidden_size
  std::optional<int> kv_channels;       // default: hidden_size / num_attention_heads
  bool gated_linear_unit = false;       // SwiGLU when true (with the default swish activation)
  Normalization normalization = Normalization::kLayerNorm;
  AttentionBackend attention_backend = AttentionBackend::kUnfused;
  double attention_dropout = 0.1;
  double hidden_dropout = 0.1;
  bool attention_softmax_in_fp32 = true;
  bool add_bias_linear = true;
  PositionEmbedding position_embedding_type = PositionEmbedding::kLearnedAbsolute;
  bool share_embeddings_and_output_weights = false;  // GPTModel default: untied output layer

  // Multi-Latent Attention (DeepSeek-V2). Megatron's MLATransformerConfig defaults.
  bool multi_latent_attention = false;
  // MLATransformerConfig's default 512; null (nullopt): no q compression (DeepSeek-V2-Lite).
  std::optional<int> q_lora_rank = 512;
  int kv_lora_rank = 512;
  int qk_head_dim = 128;
  int qk_pos_emb_head_dim = 64;
  int v_head_dim = 128;

  // Mixture of experts. num_moe_experts null means a dense model.
  std::optional<int> num_moe_experts;
  int moe_router_topk = 2;
  std::optional<int> moe_ffn_hidden_size;  // default: ffn_hidden_size
  std::optional<int> moe_shared_expert_intermediate_size;  // null: no shared experts
  bool moe_grouped_gemm = false;
  // 1 = every layer MoE, k = every k-th layer; or an explicit 0/1 pattern of num_layers entries.
  int moe_layer_freq = 1;
  std::vector<int> moe_layer_pattern;  // non-empty when given as a list; wins over moe_layer_freq
  bool moe_shared_expert_overlap = false;
  bool overlap_moe_expert_parallel_comm = false;

  // Gated DeltaNet ("gdn"/"gdn2") hybrid attention: validation and planning only.
  std::optional<std::string> experimental_attention_variant;

  // Layer-level activation offloading (Megatron Core's cpu_offloading): validation only. It
  // conflicts with any recompute, so a spec with it has no valid policy (search/rules.h).
  bool cpu_offloading = false;
  int cpu_offloading_num_layers = 0;  // layers whose activations are offloaded; < num_layers
  bool distribute_saved_activations = false;

  // FP8 training through Transformer Engine (validation only: the memory model assumes 16-bit
  // activations, and the builtin engine refuses FP8). fp8: "" (null) | "e4m3" | "hybrid".
  std::string fp8;
  std::string fp8_recipe = "delayed";  // tensorwise | delayed | mxfp8 | blockwise | custom
  // CUDA graphs (validation only; the builtin engine refuses them): none | local |
  // transformer_engine | full_iteration, and the captured modules (empty: the whole layer;
  // attn, mlp, moe, moe_router, moe_preprocess, mamba).
  std::string cuda_graph_impl = "none";
  std::vector<std::string> cuda_graph_scope;

  int EffectiveQueryGroups() const { return num_query_groups.value_or(num_attention_heads); }
  int EffectiveFfnHiddenSize() const { return ffn_hidden_size.value_or(4 * hidden_size); }
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
  // layer under full_iteration or an empty scope, else the listed modules.
  bool GraphCaptures(const std::string& name) const {
    if (!HasCudaGraphs()) return false;
    if (cuda_graph_impl == "full_iteration" || cuda_graph_scope.empty()) return true;
    return std::find(cuda_graph_scope.begin(), cuda_graph_scope.end(), name) !=
           cuda_graph_scope.end();
  }
  bool IsGdn() const {
    return experimental_attention_variant &&
           (*experimental_attention_variant == "gdn" || *experimental_attention_variant == "gdn2");
  }
  // Whether layer `i` (0-based, global) has an MoE MLP, following Megatron's moe_layer_freq.
  bool IsMoeLayer(int i) const;
  int NumMoeLayers() const;
};

struct TrainSpec {
  int micro_batch_size = 1;
  // Sequences per optimizer step over all data-parallel replicas. Null: micro_batch_size x
  // data_parallel_size (one micro-batch per step, Megatron's default). The number of
  // micro-batches a step runs is global_batch_size / (micro_batch_size x data_parallel_size).
  std::optional<int> global_batch_size;
  Precision precision = Precision::kBf16;
  bool use_distributed_optimizer = false;
  uint64_t seed = 1234;
};

struct ParallelSpec {
  int tensor_model_parallel_size = 1;
  int pipeline_model_parallel_size = 1;
  // Model chunks per pipeline rank (the interleaved 1F1B schedule). Null (or 1): one chunk per
  // rank, the plain 1F1B schedule.
  std::optional<int> virtual_pipeline_model_parallel_size;
  int context_parallel_size = 1;  // splits the sequence over CP ranks (ring attention)
  bool sequence_parallel = false;
  int expert_model_parallel_size = 1;
  int data_parallel_size = 1;
  // Uneven pipeline split (Megatron Core's TransformerConfig): the layers of the first and of
  // the last stage; the other stages share the rest evenly. Null: an even split.
  std::optional<int> num_layers_in_first_pipeline_stage;
  std::optional<int> num_layers_in_last_pipeline_stage;
  // Count the embedding (the loss) as one layer of the first (last) stage when splitting.
  bool account_for_embedding_in_pipeline_split = false;
  bool account_for_loss_in_pipeline_split = false;
  // Megatron's DDP overlap settings: validated (overlap_param_gather needs the distributed
  // optimizer and overlap_grad_reduce); they change step time, not what recompute can free.
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;

  // Megatron's world size: TP x CP x PP x DP. Expert parallelism is carved out of the same ranks.
  int WorldSize() const {
    return tensor_model_parallel_size * context_parallel_size * pipeline_model_parallel_size *
           data_parallel_size;
  }
  // Virtual pipeline chunks per rank: 1 unless interleaving (VPP > 1 with PP > 1).
  int VirtualChunks() const {
    return pipeline_model_parallel_size > 1 && virtual_pipeline_model_parallel_size
               ? std::max(1, *virtual_pipeline_model_parallel_size)
               : 1;
  }
};

struct SearchOptions {
  double memory_budget_gib = 80;
  MemoryMetric memory_metric = MemoryMetric::kReserved;
  StrategyKind strategy = StrategyKind::kGuided;
  Objective objective = Objective::kFrontier;  // guided only
  // Kept free under the budget for the recommendation (not the frontier): a policy is recommended
  // only when its peak is at or under memory_budget_gib - memory_headroom_gib.
  double memory_headroom_gib = 0;
  int max_trials = 40;
  // The warm-up (search/steady_state.h): at least warmup_steps, then until the last
  // steady_window warm-up steps agree within steady_tolerance (relative to their median), at most
  // warmup_max_steps; then measure_steps measured steps.
  int warmup_steps = 2;
  int warmup_max_steps = 8;
  int steady_window = 3;
  double steady_tolerance = 0.05;
  int measure_steps = 5;
  Backend backend = Backend::kBuiltin;
  std::string replay_table;      // with backend replay: path relative to the spec file
  std::string command_template;  // with backend command: the operator-configured template's name
  Device device = Device::kAuto;
  double trial_timeout_s = 900;  // a trial still running after this is killed: status timeout
  // Depth proxies (search/depth_proxy.h): when set, each trial runs the model cut to these two
  // depths and predicts the full depth's figures. Empty: trials run the model as specified.
  std::vector<int> proxy_layers;
  // Layout proxies (search/layout_proxy.h): each trial runs one rank per pipeline stage alone
  // on one device with stand-in collectives and predicts every rank of the layout.
  bool layout_proxy = false;
  // The simulated cluster of a layout proxy's communication model (H100/H200 HGX nodes: NVLink 4
  // at 450 GB/s per direction of which rings reach about 360; 8 x 400 Gb/s InfiniBand NDR, one
  // NIC per GPU, about 45 GB/s per direction reached).
  int gpus_per_node = 8;
  double nvlink_gb_s = 360;   // GB/s (1e9 bytes) per GPU, one direction, as a ring reaches it
  double network_gb_s = 45;   // GB/s per GPU between nodes

  uint64_t MemoryBudgetBytes() const {
    return GibToBytes(memory_budget_gib);
  }
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

// Parses those names back; returns nullopt for an unknown name. ParseAttentionBackend also reads
// Megatron Core's AttnBackend names: auto and fused as kFlash, local as kUnfused.
std::optional<Normalization> ParseNormalization(const std::string& s);
std::optional<AttentionBackend> ParseAttentionBackend(const std::string& s);
std::optional<PositionEmbedding> ParsePositionEmbedding(const std::string& s);
std::optional<Precision> ParsePrecision(const std::string& s);
std::optional<MemoryMetric> ParseMemoryMetric(const std::string& s);
std::optional<StrategyKind> ParseStrategyKind(const std::string& s);
std::optional<Objective> ParseObjective(const std::string& s);
std::optional<Backend> ParseBackend(const std::string& s);
std::optional<Device> ParseDevice(const std::string& s);

}  // namespace remat::search
