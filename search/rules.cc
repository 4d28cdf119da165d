#include "search/rules.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "search/compatibility.h"
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
  if (std::string problem = Fp8AndGraphLabelProblem(m, label); !problem.empty()) return problem;
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
      if (m.transformer_impl == TransformerImpl::kTransformerEngine && !m.multi_latent_attention &&
          m.NumMoeLayers() == 0) {
        return "layernorm has no effect: Transformer Engine's layer fuses a dense layer's norms into "
               "the linears after them (no separate norm to checkpoint; MLA and MoE layers have "
               "one)";
      }
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
    if (m.HasCudaGraphs() && m.cuda_graph_impl != "full_iteration") {
      return InvalidArgument(
          "full recompute is only supported with full-iteration CUDA graphs (model.cuda_graph_impl "
          "is " + m.cuda_graph_impl + "; set full_iteration or none)");
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

std::vector<std::string> PolicyWarnings(const SearchSpec& spec, const Policy& policy) {
  std::vector<std::string> out;
  const ModelSpec& m = spec.model;
  if (policy.IsFull()) {
    if (m.HasCudaGraphs()) {
      out.push_back("full recompute under a full-iteration CUDA graph: capture and warm-up can "
                    "bypass checkpoint wrappers; check that the graph replays the recompute");
    }
    return out;
  }
  if (policy.Has(Label::kCoreAttn) && m.attention_backend == AttentionBackend::kFlash) {
    out.push_back("core_attn under flash (fused) attention: the kernel already keeps no score or "
                  "probability tensors, so core_attn frees only its q, k, v inputs and replays "
                  "the attention; keep it only if a measurement against selective:[] says so");
  }
  if (policy.Has(Label::kCoreAttn) && spec.parallel.context_parallel_size > 1) {
    out.push_back("core_attn with context parallelism also replays the attention's context-"
                  "parallel communication in backward");
  }
  if (policy.Has(Label::kMoe)) {
    for (Label inner : {Label::kMoeAct, Label::kSharedExperts}) {
      if (policy.Has(inner)) {
        out.push_back(std::string("moe already replays the whole MoE layer: ") + LabelName(inner) +
                      " inside it frees nothing more (it may only change backward's transient "
                      "peak)");
      }
    }
  }
  if (policy.Has(Label::kMlp) && m.IsMoe()) {
    out.push_back("mlp acts only on the dense layers (" +
                  std::to_string(m.num_layers - m.NumMoeLayers()) + " of " +
                  std::to_string(m.num_layers) + "); MoE layers need moe, moe_act or "
                  "shared_experts");
  }
  if (m.HasCudaGraphs()) {
    for (Label l : policy.labels) {
      const char* module = l == Label::kCoreAttn || l == Label::kMlaUpProj ? "attn"
                           : l == Label::kMlp                               ? "mlp"
                           : l == Label::kMoe || l == Label::kMoeAct ||
                                   l == Label::kSharedExperts
                               ? "moe"
                               : nullptr;
      if (module && m.GraphCaptures(module)) {
        out.push_back(std::string(LabelName(l)) + " lies inside a captured CUDA graph (" +
                      module + "): capture and warm-up can bypass checkpoint wrappers; measure "
                      "it against selective:[]");
      }
    }
  }
  return out;
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

// ---- Recompute fields ----------------------------------------------------------------------------

namespace {

std::vector<std::string> Words(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

bool IsFlag(const std::string& w) { return w.size() > 2 && w.compare(0, 2, "--") == 0; }

}  // namespace

RecomputeFields FieldsOf(const Policy& policy) {
  RecomputeFields f;
  if (policy.IsFull()) {
    f.granularity = "full";
    f.method = policy.method == RecomputeMethod::kUniform ? "uniform" : "block";
    f.num_layers = policy.num_layers;
    return f;
  }
  f.granularity = "selective";
  f.modules.emplace();
  for (Label l : policy.labels) f.modules->push_back(LabelName(l));
  return f;
}

Status CheckRecomputeFields(const RecomputeFields& f, bool megatron_lm) {
  std::optional<std::string> granularity = f.granularity;
  if (megatron_lm && f.recompute_activations) granularity = "selective";
  if (megatron_lm && f.distribute_saved_activations &&
      (granularity != std::optional<std::string>("full") || !f.method)) {
    return InvalidArgument("distribute_saved_activations needs recompute_granularity full with a "
                           "recompute_method (Megatron-LM)");
  }
  if (!granularity) return OkStatus();  // no recompute: nothing else is read
  if (*granularity != "full" && *granularity != "selective") {
    return InvalidArgument("recompute_granularity: " + *granularity +
                           " must be \"full\" or \"selective\"");
  }
  if (f.method && *f.method != "uniform" && *f.method != "block") {
    return InvalidArgument("recompute_method: " + *f.method + " must be \"block\" or \"uniform\"");
  }
  if (*granularity == "full") {
    if (!f.method) {
      return InvalidArgument("recompute_granularity full needs recompute_method block or uniform");
    }
    if (!f.num_layers) {
      return InvalidArgument("recompute_granularity full needs recompute_num_layers");
    }
    return OkStatus();
  }
  if (f.num_layers) {
    return InvalidArgument("recompute_granularity selective: recompute_num_layers must be None, "
                           "got " + std::to_string(*f.num_layers));
  }
  if (megatron_lm && f.method) {
    return InvalidArgument("recompute_granularity selective: Megatron-LM refuses a "
                           "recompute_method, got " + *f.method);
  }
  if (f.modules) {
    for (const std::string& m : *f.modules) {
      if (!ParseLabel(m)) return InvalidArgument("recompute_modules: invalid choice " + m);
    }
  }
  return OkStatus();
}

StatusOr<RecomputeFields> ApplyBridgeOverrides(RecomputeFields f, const std::string& overrides) {
  for (const std::string& w : Words(overrides)) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos) return InvalidArgument("override '" + w + "': no '='");
    const std::string key = w.substr(0, eq), value = w.substr(eq + 1);
    const bool null = value == "null";
    if (key == "model.recompute_granularity") {
      f.granularity = null ? std::nullopt : std::optional<std::string>(value);
    } else if (key == "model.recompute_method") {
      f.method = null ? std::nullopt : std::optional<std::string>(value);
    } else if (key == "model.recompute_num_layers") {
      if (null) {
        f.num_layers.reset();
      } else {
        try {
          f.num_layers = std::stoi(value);
        } catch (const std::exception&) {
          return InvalidArgument("override '" + w + "': not an integer");
        }
      }
    } else if (key == "model.recompute_modules") {
      if (null) {
        f.modules.reset();
        continue;
      }
      if (value.size() < 2 || value.front() != '[' || value.back() != ']') {
        return InvalidArgument("override '" + w + "': a list is written [a,b]");
      }
      f.modules.emplace();
      std::string item;
      std::istringstream in(value.substr(1, value.size() - 2));
      while (std::getline(in, item, ',')) {
        if (!item.empty()) f.modules->push_back(item);
      }
    } else if (key == "model.distribute_saved_activations") {
      f.distribute_saved_activations = value == "true";
    } else {
      return InvalidArgument("override '" + w + "': not a recompute field");
    }
  }
  return f;
}

StatusOr<RecomputeFields> MegatronLmRecomputeFields(const std::vector<std::string>& args) {
  RecomputeFields f;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (!IsFlag(a)) continue;
    std::vector<std::string> values;
    for (size_t j = i + 1; j < args.size() && !IsFlag(args[j]); ++j) values.push_back(args[j]);
    auto one = [&]() -> StatusOr<std::string> {
      if (values.size() != 1) return InvalidArgument(a + ": expected one argument");
      return values[0];
    };
    if (a == "--recompute-granularity") {
      auto v = one();
      if (!v.ok()) return v.status();
      f.granularity = *v;
    } else if (a == "--recompute-method") {
      auto v = one();
      if (!v.ok()) return v.status();
      f.method = *v;
    } else if (a == "--recompute-num-layers") {
      auto v = one();
      if (!v.ok()) return v.status();
      try {
        f.num_layers = std::stoi(*v);
      } catch (const std::exception&) {
        return InvalidArgument(a + ": invalid int value '" + *v + "'");
      }
    } else if (a == "--recompute-modules") {
      f.modules = values;
    } else if (a == "--recompute-activations") {
      f.recompute_activations = true;
    } else if (a == "--distribute-saved-activations") {
      f.distribute_saved_activations = true;
    }
  }
  return f;
}

std::vector<std::string> EditMegatronLmArgs(const std::vector<std::string>& args,
                                            const std::string& remove, const std::string& add) {
  const std::vector<std::string> gone = Words(remove);
  const std::set<std::string> drop(gone.begin(), gone.end());
  std::vector<std::string> out;
  bool dropping = false;
  for (const std::string& a : args) {
    if (IsFlag(a)) dropping = drop.count(a) > 0;
    if (!dropping) out.push_back(a);
  }
  for (const std::string& w : Words(add)) out.push_back(w);
  return out;
}

}  // namespace remat::search
