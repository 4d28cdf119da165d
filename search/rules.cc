#include "search/rules.h"

#include <algorithm>

#include "search/depth_proxy.h"
#include "search/pipeline.h"

namespace remat::search {
namespace {

bool AllLayersMoe(const ModelSpec& m) { return m.IsMoe() && m.NumMoeLayers() == m.num_layers; }

}  // namespace

int LayersPerStage(const SearchSpec& spec) {
  // Megatron applies recompute_num_layers per model chunk (a larger N recomputes the same layers)
  // and refuses N above num_layers / PP even where an uneven first/last stage holds more.
  const int pp = std::max(1, spec.parallel.pipeline_model_parallel_size);
  return std::min(MaxChunkLayers(spec), spec.model.num_layers / pp);
}

std::string LabelProblem(const SearchSpec& spec, Label label) {
  const ModelSpec& m = spec.model;
  switch (label) {
    case Label::kCoreAttn:
      return "";
    case Label::kMoeAct:
      if (!m.IsMoe()) return "moe_act has no effect: the model has no experts (num_moe_experts unset)";
      if (!m.moe_grouped_gemm) {
        return "moe_act in recompute_modules is only supported with moe_grouped_gemm (the expert "
               "activation checkpoint lives in the grouped-GEMM experts)";
      }
      return "";
    case Label::kLayernorm:
      return "";
    case Label::kMlaUpProj:
      if (!m.multi_latent_attention) {
        return "mla_up_proj in recompute_modules is only supported with multi_latent_attention";
      }
      return "";
    case Label::kMlp:
      if (AllLayersMoe(m)) {
        return "mlp has no effect: every layer's MLP is a mixture of experts (mlp only checkpoints "
               "dense MLPs; use moe, moe_act or shared_experts)";
      }
      return "";
    case Label::kMoe:
      if (!m.IsMoe()) return "moe has no effect: the model has no experts (num_moe_experts unset)";
      if (m.overlap_moe_expert_parallel_comm) {
        return "moe in recompute_modules cannot be used with overlap_moe_expert_parallel_comm "
               "(backward replay would repeat the overlapped dispatch/combine communication)";
      }
      return "";
    case Label::kSharedExperts:
      if (!m.HasSharedExperts()) {
        return "shared_experts has no effect: the model has no shared experts "
               "(moe_shared_expert_intermediate_size unset)";
      }
      if (m.moe_shared_expert_overlap) {
        return "shared_experts recompute cannot work with moe_shared_expert_overlap";
      }
      return "";
    case Label::kGdnNormOut:
      if (!m.IsGdn()) {
        return "gdn_norm_out in recompute_modules is only supported with "
               "experimental_attention_variant 'gdn' or 'gdn2'";
      }
      return "";
  }
  return "unknown label";
}

std::vector<Label> ValidLabels(const SearchSpec& spec) {
  std::vector<Label> out;
  for (Label l : AllLabels()) {
    if (LabelProblem(spec, l).empty()) out.push_back(l);
  }
  return out;
}

Status ValidatePolicy(const SearchSpec& spec, const Policy& policy) {
  const ModelSpec& m = spec.model;
  // Every policy sets recompute_granularity (selective:[] too), so Megatron's rules that fire
  // whenever a granularity is set apply to all of them.
  if (m.cpu_offloading) {
    return InvalidArgument(
        "CPU offloading does not work when activation recomputation is enabled (any "
        "recompute_granularity, selective:[] included); set model.cpu_offloading to false");
  }
  if (m.distribute_saved_activations && spec.parallel.sequence_parallel) {
    return InvalidArgument(
        "distribute_saved_activations must be false when sequence parallel is enabled");
  }
  if (policy.IsFull()) {
    const int per_stage = LayersPerStage(spec);
    if (policy.num_layers < 1 || policy.num_layers > per_stage) {
      return InvalidArgument("with recompute_granularity full, recompute_num_layers must be "
                             "between 1 and the layers per pipeline stage" +
                             std::string(spec.parallel.VirtualChunks() > 1
                                             ? " (per virtual chunk)"
                                             : "") +
                             " (" + std::to_string(per_stage) + "), got " +
                             std::to_string(policy.num_layers));
    }
    if (m.overlap_moe_expert_parallel_comm) {
      return InvalidArgument(
          "full recompute cannot be used with overlap_moe_expert_parallel_comm (disable full "
          "recomputation when enabling expert-parallel overlap)");
    }
    const std::string proxy = ProxyPolicyProblem(spec, policy);
    if (!proxy.empty()) return InvalidArgument("search.proxy_layers: " + proxy);
    return OkStatus();
  }
  for (Label l : policy.labels) {
    std::string problem = LabelProblem(spec, l);
    if (!problem.empty()) return InvalidArgument(problem);
  }
  return OkStatus();
}

std::vector<Policy> EnumerateValidPolicies(const SearchSpec& spec) {
  std::vector<Policy> out;
  if (!ValidatePolicy(spec, Policy::None()).ok()) return out;
  const std::vector<Label> labels = ValidLabels(spec);
  const size_t n = labels.size();
  // Subsets by size, then lexicographically by canonical order: the control first.
  std::vector<std::vector<Label>> subsets;
  for (size_t mask = 0; mask < (size_t{1} << n); ++mask) {
    std::vector<Label> s;
    for (size_t i = 0; i < n; ++i) {
      if (mask & (size_t{1} << i)) s.push_back(labels[i]);
    }
    subsets.push_back(std::move(s));
  }
  std::stable_sort(subsets.begin(), subsets.end(),
                   [](const auto& a, const auto& b) { return a.size() < b.size(); });
  for (auto& s : subsets) {
    Policy p = Policy::Selective(s);
    if (ValidatePolicy(spec, p).ok()) out.push_back(std::move(p));
  }
  for (RecomputeMethod method : {RecomputeMethod::kUniform, RecomputeMethod::kBlock}) {
    for (int k = 1; k <= LayersPerStage(spec); ++k) {
      Policy p = Policy::Full(method, k);
      if (ValidatePolicy(spec, p).ok()) out.push_back(std::move(p));
    }
  }
  return out;
}

}  // namespace remat::search
