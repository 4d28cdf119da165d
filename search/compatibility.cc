// ValidateCompatibility and BuiltinBackendProblem (search/spec.h): the spec-wide rules that would
// otherwise surface as an `invalid` status on every trial.

#include <algorithm>
#include <string>
#include <utility>

#include "search/compatibility.h"
#include "search/fp8_support.h"
#include "search/mtp_model.h"
#include "search/spec.h"

namespace remat::search {
namespace {

bool OneOf(const std::string& v, std::initializer_list<const char*> names) {
  return std::any_of(names.begin(), names.end(), [&](const char* n) { return v == n; });
}

// Whether the graph scope names `module` explicitly.
bool ScopeLists(const ModelSpec& m, const char* module) {
  return std::find(m.cuda_graph_scope.begin(), m.cuda_graph_scope.end(), module) !=
         m.cuda_graph_scope.end();
}

// A scope of the whole layer: empty, or Megatron Bridge's "full".
bool WholeLayerScope(const ModelSpec& m) {
  return m.cuda_graph_scope.empty() ||
         (m.cuda_graph_scope.size() == 1 && m.cuda_graph_scope[0] == "full");
}

Status ValidateMoe(const ModelSpec& m) {
  if (!m.IsMoe() || !m.add_bias_linear) return OkStatus();
  if (m.moe_grouped_gemm) {
    // The local spec's GroupedMLP asserted add_bias_linear false; TEGroupedMLP takes biases only
    // without bias_dropout_fusion, which Megatron-LM turns on by default.
    return InvalidArgument(
        "model.add_bias_linear: Megatron Core's grouped-GEMM experts (moe_grouped_gemm: true) take "
        "no linear biases; set add_bias_linear: false (or moe_grouped_gemm: false)");
  }
  if (m.HasSharedExperts()) {
    return InvalidArgument(
        "model.add_bias_linear: Megatron Core's shared experts do not support biases "
        "(SharedExpertMLP asserts add_bias_linear is false); set add_bias_linear: false");
  }
  return OkStatus();
}

Status ValidateFp8(const ModelSpec& m) {
  if (!m.fp8.empty() && !OneOf(m.fp8, {"e4m3", "hybrid"})) {
    return InvalidArgument("model.fp8: must be null, e4m3 or hybrid, got '" + m.fp8 + "'");
  }
  if (!OneOf(m.fp8_recipe, {"tensorwise", "delayed", "mxfp8", "blockwise", "custom"})) {
    return InvalidArgument(
        "model.fp8_recipe: must be one of tensorwise, delayed, mxfp8, blockwise, custom, got '" +
        m.fp8_recipe + "'");
  }
  return OkStatus();
}

Status ValidateCudaGraphs(const ModelSpec& m) {
  if (!OneOf(m.cuda_graph_impl, {"none", "local", "transformer_engine", "full_iteration"})) {
    return InvalidArgument(
        "model.cuda_graph_impl: must be one of none, local, transformer_engine, full_iteration, "
        "got '" + m.cuda_graph_impl + "'");
  }
  if (!WholeLayerScope(m)) {
    for (const std::string& s : m.cuda_graph_scope) {
      if (!OneOf(s, {"attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"})) {
        return InvalidArgument(
            "model.cuda_graph_scope: unknown module '" + s +
            "' (attn, mlp, moe, moe_router, moe_preprocess, mamba; empty or full: the whole layer)");
      }
    }
  }
  auto has = [&](const char* s) { return ScopeLists(m, s); };
  if (!WholeLayerScope(m) && !m.HasCudaGraphs()) {
    return InvalidArgument(
        "model.cuda_graph_scope: has no effect without CUDA graphs (set model.cuda_graph_impl "
        "local or transformer_engine, or leave the scope empty)");
  }
  if (!WholeLayerScope(m) && m.cuda_graph_impl == "full_iteration") {
    return InvalidArgument(
        "model.cuda_graph_scope: must be empty with cuda_graph_impl full_iteration (the whole "
        "forward-backward is one graph)");
  }
  if (has("moe_preprocess") && !has("moe_router")) {
    return InvalidArgument("model.cuda_graph_scope: moe_preprocess must be used together with "
                           "moe_router");
  }
  if ((has("moe") || has("moe_router")) && !m.IsMoe()) {
    return InvalidArgument("model.cuda_graph_scope: moe and moe_router need a mixture-of-experts "
                           "model (model.num_moe_experts)");
  }
  if (has("mamba")) {
    return InvalidArgument("model.cuda_graph_scope: mamba needs a hybrid Mamba model, which remat "
                           "does not describe");
  }
  return OkStatus();
}

// Megatron's rules for the gradient, optimizer and FSDP settings (DistributedDataParallelConfig
// and OptimizerConfig @d98e8a6).
Status ValidateOptimizerSettings(const SearchSpec& spec) {
  const TrainSpec& t = spec.train;
  if (t.use_precision_aware_optimizer) {
    if (t.main_params_dtype != DType::kFp32 && t.main_params_dtype != DType::kFp16) {
      return InvalidArgument("train.main_params_dtype: must be fp32 or fp16");
    }
    if (t.main_grads_dtype != DType::kFp32 && t.main_grads_dtype != DType::kBf16) {
      return InvalidArgument("train.main_grads_dtype: must be fp32 or bf16");
    }
  } else {
    const TrainSpec d;
    if (t.main_params_dtype != d.main_params_dtype || t.main_grads_dtype != d.main_grads_dtype ||
        t.exp_avg_dtype != d.exp_avg_dtype || t.exp_avg_sq_dtype != d.exp_avg_sq_dtype) {
      return InvalidArgument("train.use_precision_aware_optimizer: the optimizer dtypes other than "
                             "fp32 need the precision-aware optimizer");
    }
  }
  if (!t.use_megatron_fsdp && t.data_parallel_sharding_strategy != ShardingStrategy::kNoShard) {
    return InvalidArgument("train.data_parallel_sharding_strategy: needs train.use_megatron_fsdp");
  }
  if (t.fp8_param_gather && spec.model.fp8.empty()) {
    return InvalidArgument("train.fp8_param_gather: needs model.fp8");
  }
  return OkStatus();
}

Status ValidateOffloading(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  if (m.cpu_offloading_num_layers < 0) {
    return InvalidArgument("model.cpu_offloading_num_layers: must be 0 or more");
  }
  if (!m.cpu_offloading) return OkStatus();
  if (m.cpu_offloading_num_layers >= m.num_layers) {
    return InvalidArgument("model.cpu_offloading_num_layers: CPU offloading can be done only for "
                           "layers less than num_layers (" + std::to_string(m.num_layers) +
                           "), got " + std::to_string(m.cpu_offloading_num_layers));
  }
  if (m.HasCudaGraphs() && m.cuda_graph_impl != "full_iteration") {
    return InvalidArgument("model.cpu_offloading: CUDA graphs are not supported with CPU "
                           "offloading (unless cuda_graph_impl is full_iteration)");
  }
  return OkStatus();
}

Status ValidateOverlap(const SearchSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  if (p.overlap_param_gather) {
    if (!spec.train.use_distributed_optimizer) {
      return InvalidArgument("parallel.overlap_param_gather: only supported with the distributed "
                             "optimizer (set train.use_distributed_optimizer: true)");
    }
    if (!p.overlap_grad_reduce) {
      return InvalidArgument("parallel.overlap_param_gather: needs parallel.overlap_grad_reduce "
                             "(Megatron overlaps the parameter all-gather only with it)");
    }
  }
  return OkStatus();
}

}  // namespace

Status ValidateCompatibility(const SearchSpec& spec) {
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateMoe(spec.model));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateFp8(spec.model));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateCudaGraphs(spec.model));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateOffloading(spec));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateOptimizerSettings(spec));
  return ValidateOverlap(spec);
}

std::string BuiltinBackendProblem(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  const ParallelSpec& par = spec.parallel;
  const int tp = par.tensor_model_parallel_size;
  if (m.IsGdn()) {
    return "model.experimental_attention_variant: the builtin engine has no Gated DeltaNet "
           "layer; GDN models are validated and planned only";
  }
  // What the engine does not run would be measured as something it is not. It runs the local and
  // the Transformer Engine layer with Megatron's fusions (engine/te_layers.h), bf16 or fp32
  // gradient buffers and the precision-aware optimizer's fp32/fp16/bf16 state
  // (engine/te_optimizer.h); the native cross-entropy fusion keeps what the unfused one keeps
  // (docs/transformer-engine.md section 6), so the engine's function stands for both.
  const bool unfused_core = m.attention_backend == AttentionBackend::kUnfused;
  const std::pair<bool, const char*> kNotRun[] = {
      {m.transformer_impl == TransformerImpl::kTransformerEngine && unfused_core,
       "model.attention_backend: unfused with transformer_engine is Transformer Engine's unfused "
       "attention (its own softmax kernel), which the builtin engine does not run; use fused or "
       "flash"},
      {m.bias_activation_fusion && m.IsMoe() && !m.gated_linear_unit,
       "model.bias_activation_fusion: Megatron fuses only SwiGLU in grouped experts (a GELU MoE "
       "raises there)"},
      {m.masked_softmax_fusion && unfused_core,
       "model.masked_softmax_fusion: the builtin engine's unfused attention does not run the "
       "fused scale-mask-softmax kernel (with fused or flash attention the flag has no effect)"},
      {spec.train.use_precision_aware_optimizer &&
           (spec.train.exp_avg_dtype == DType::kFp8 || spec.train.exp_avg_sq_dtype == DType::kFp8),
       "train.exp_avg_dtype: FP8 Adam moments (Transformer Engine's scaled uint8) are not run by "
       "the builtin engine"},
      {spec.train.use_megatron_fsdp, "train.use_megatron_fsdp: the builtin engine has no FSDP"},
  };
  for (const auto& [refused, why] : kNotRun) {
    if (refused) {
      return std::string(why) + "; plan and validate it, or run it with the megatron or command "
                                "backend";
    }
  }
  if (std::string mtp = MtpEngineProblem(spec); !mtp.empty()) return mtp;
  if (std::string fp8 = Fp8BuiltinProblem(spec); !fp8.empty()) return fp8;
  if (m.HasCudaGraphs()) {
    return "model.cuda_graph_impl: the builtin engine cannot capture CUDA graphs (their static "
           "pools would not be measured); use the megatron or command backend, or plan and "
           "validate only";
  }
  // Context parallelism runs as Transformer Engine runs it (engine/context_parallel.h), except:
  if (par.context_parallel_size > 1) {
    if (par.cp_comm_type == CpCommType::kA2aP2p) {
      return "parallel.cp_comm_type: a2a+p2p (hierarchical context parallelism) is not supported "
             "by the builtin engine (p2p, a2a and allgather are); planned, not run";
    }
    if (m.attention_dropout != 0) {
      return "model.attention_dropout: must be 0 with context_parallel_size > 1 in the builtin "
             "engine (its context-parallel attention has no dropout)";
    }
  }
  // MoE runs on Megatron's expert grid with any TP, ETP and EP the spec's rules allow
  // (engine/moe_dispatch.h); the flex dispatcher is measured as the all-to-all one.
  if (m.distribute_saved_activations && tp > 1) {
    return "model.distribute_saved_activations: not supported by the builtin engine";
  }
  return "";
}

// Megatron Core's rules for selective labels under FP8 and CUDA graphs
// (NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py@d98e8a6,
// TransformerConfig.__post_init__; megatron/core/tensor_parallel/random.py@d98e8a6, checkpoint
// skipped during graph capture).
std::string Fp8AndGraphLabelProblem(const ModelSpec& m, Label label) {
  if (!m.fp8.empty() && m.fp8_recipe == "delayed" &&
      (label == Label::kMoeAct || label == Label::kLayernorm)) {
    return std::string(LabelName(label)) +
           " recompute is not supported with FP8 delayed scaling (model.fp8_recipe delayed); use "
           "another recipe or another label";
  }
  if (!m.HasCudaGraphs()) return "";
  if (label == Label::kCoreAttn && m.attention_dropout != 0 && m.GraphCaptures("attn")) {
    return "core_attn recompute inside a captured attention graph does not support attention "
           "dropout (model.attention_dropout must be 0, or leave attn out of cuda_graph_scope)";
  }
  if (label == Label::kMlp && m.hidden_dropout != 0 && m.GraphCaptures("mlp")) {
    return "mlp recompute inside a captured MLP graph does not support hidden dropout "
           "(model.hidden_dropout must be 0, or leave mlp out of cuda_graph_scope)";
  }
  if (label == Label::kMoe && m.hidden_dropout != 0 && m.GraphCaptures("moe")) {
    return "moe recompute inside a captured MoE graph does not support hidden dropout "
           "(model.hidden_dropout must be 0, or leave moe out of cuda_graph_scope)";
  }
  if (label == Label::kMoe && m.cuda_graph_impl == "transformer_engine" &&
      ScopeLists(m, "moe_router")) {
    return "moe recompute is not supported with the moe_router CUDA graph under cuda_graph_impl "
           "transformer_engine (the checkpoint would straddle the graph)";
  }
  return "";
}

bool ModelSpec::GraphCaptures(const std::string& name) const {
  if (!HasCudaGraphs()) return false;
  if (cuda_graph_impl == "full_iteration" || WholeLayerScope(*this)) return true;
  return ScopeLists(*this, name.c_str());
}

}  // namespace remat::search
