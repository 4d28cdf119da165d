#include "cli/import_spec.h"

#include <cstdio>
#include <sstream>

#include "search/policy.h"
#include "search/spec.h"
#include "specfile/spec_file.h"

namespace remat::cli {
namespace {

constexpr const char* kSections[] = {"model", "train", "parallel", "search"};

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}

// The search section's defaults (search::SearchOptions), spelled out in the output.
std::vector<std::pair<std::string, std::string>> SearchDefaults() {
  const search::SearchOptions d;
  return {{"memory_budget_gib", Num(d.memory_budget_gib)},
          {"memory_metric", search::Name(d.memory_metric)},
          {"strategy", search::Name(d.strategy)},
          {"objective", search::Name(d.objective)},
          {"memory_headroom_gib", Num(d.memory_headroom_gib)},
          {"max_trials", std::to_string(d.max_trials)},
          {"warmup_steps", std::to_string(d.warmup_steps)},
          {"warmup_max_steps", std::to_string(d.warmup_max_steps)},
          {"steady_window", std::to_string(d.steady_window)},
          {"steady_tolerance", Num(d.steady_tolerance)},
          {"measure_steps", std::to_string(d.measure_steps)},
          {"backend", search::Name(d.backend)},
          {"device", search::Name(d.device)},
          {"trial_timeout_s", Num(d.trial_timeout_s)}};
}

}  // namespace

void ImportedSpec::Set(const std::string& section, const std::string& key,
                       const std::string& yaml_value) {
  for (Field& f : fields_) {
    if (f.section == section && f.key == key) {
      f.value = yaml_value;
      f.why.clear();
      return;
    }
  }
  fields_.push_back({section, key, yaml_value, ""});
}

void ImportedSpec::Carry(const std::string& section, const std::string& key,
                         const std::string& yaml_value, const std::string& why) {
  Set(section, key, yaml_value);
  for (Field& f : fields_) {
    if (f.section == section && f.key == key) f.why = why;
  }
}

bool ImportedSpec::Has(const std::string& section, const std::string& key) const {
  for (const Field& f : fields_) {
    if (f.section == section && f.key == key) return true;
  }
  return false;
}

std::string ImportedSpec::Render(const std::vector<Field>& fields,
                                 const std::vector<std::string>& notes) const {
  std::ostringstream out;
  out << "# " << origin_ << "\n";
  for (const std::string& n : notes) out << "# " << n << "\n";
  for (const Field& f : fields) {
    if (f.section.empty()) out << f.key << ": " << f.value << "\n";
  }
  for (const char* section : kSections) {
    std::vector<std::pair<std::string, std::string>> rows;
    for (const Field& f : fields) {
      if (f.section == section) rows.emplace_back(f.key, f.value);
    }
    if (std::string(section) == "search") {
      for (const auto& [key, value] : SearchDefaults()) {
        bool set = false;
        for (const auto& r : rows) set = set || r.first == key;
        if (!set) rows.emplace_back(key, value);
      }
    }
    if (rows.empty()) continue;
    out << section << ":\n";
    for (const auto& [key, value] : rows) out << "  " << key << ": " << value << "\n";
  }
  return out.str();
}

search::StatusOr<std::string> ImportedSpec::Finish() const {
  std::vector<Field> fields = fields_;
  std::vector<std::string> notes = notes_;
  // Each pass either succeeds, fails for good, or drops one carried field the reader refuses.
  for (;;) {
    const std::string text = Render(fields, notes);
    auto parsed = spec::ParseSpecYaml(text);
    if (parsed.ok()) return text;
    const std::string message(parsed.status().message());
    bool dropped = false;
    for (auto it = fields.begin(); it != fields.end(); ++it) {
      if (it->why.empty()) continue;
      const std::string path = it->section.empty() ? it->key : it->section + "." + it->key;
      if (message.rfind(path + ": unknown key", 0) == 0) {
        notes.push_back("not modelled: " + path + "=" + it->value + " (" + it->why +
                        "; this remat's spec has no such field)");
        fields.erase(it);
        dropped = true;
        break;
      }
    }
    if (!dropped) return search::InvalidArgument(message);
  }
}

search::StatusOr<std::pair<std::string, std::string>> SplitOverride(const std::string& arg) {
  const size_t eq = arg.find('=');
  std::string key = arg.substr(0, eq);
  while (!key.empty() && key[0] == '+') key.erase(0, 1);
  if (eq == std::string::npos || key.empty()) {
    return search::InvalidArgument("override '" + arg + "': must be KEY=VALUE (e.g. "
                                   "model.tensor_model_parallel_size=4)");
  }
  return std::make_pair(key, arg.substr(eq + 1));
}

bool IsRematOnlyKey(const std::string& key) {
  return key.rfind("parallel.", 0) == 0 || key.rfind("search.", 0) == 0;
}

std::string RematSectionOf(const std::string& name) {
  static const char* const kModel[] = {
      "num_layers", "hidden_size", "num_attention_heads", "seq_length", "vocab_size",
      "num_query_groups", "ffn_hidden_size", "kv_channels", "gated_linear_unit", "normalization",
      "attention_backend", "attention_dropout", "hidden_dropout", "attention_softmax_in_fp32",
      "add_bias_linear", "position_embedding_type", "share_embeddings_and_output_weights",
      "multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
      "qk_pos_emb_head_dim", "v_head_dim", "num_moe_experts", "moe_router_topk",
      "moe_ffn_hidden_size", "moe_shared_expert_intermediate_size", "moe_grouped_gemm",
      "moe_layer_freq", "moe_shared_expert_overlap", "overlap_moe_expert_parallel_comm",
      "experimental_attention_variant", "cpu_offloading", "cpu_offloading_num_layers",
      "distribute_saved_activations"};
  static const char* const kParallel[] = {
      "tensor_model_parallel_size", "pipeline_model_parallel_size",
      "virtual_pipeline_model_parallel_size", "context_parallel_size",
      "expert_model_parallel_size", "sequence_parallel", "num_layers_in_first_pipeline_stage",
      "num_layers_in_last_pipeline_stage", "account_for_embedding_in_pipeline_split",
      "account_for_loss_in_pipeline_split", "overlap_grad_reduce", "overlap_param_gather"};
  for (const char* k : kModel) {
    if (name == k) return "model";
  }
  for (const char* k : kParallel) {
    if (name == k) return "parallel";
  }
  return "";
}

std::string PolicyOfRecomputeFields(const std::string& granularity, const std::string& method,
                                    const std::string& num_layers,
                                    const std::vector<std::string>& modules) {
  std::string text;
  if (granularity == "full") {
    text = "full:" + (method.empty() ? std::string("?") : method) + ":" +
           (num_layers.empty() ? std::string("?") : num_layers);
  } else if (granularity == "selective") {
    text = "selective:[";
    // Megatron Core's default list when recompute_modules is unset.
    const std::vector<std::string> labels = modules.empty() ? std::vector<std::string>{"core_attn"}
                                                            : modules;
    for (size_t i = 0; i < labels.size(); ++i) text += (i ? "," : "") + labels[i];
    text += "]";
  }
  // Canonical when it is a policy remat can write (labels in canonical order); as read otherwise.
  auto policy = search::ParsePolicy(text);
  return policy.ok() ? policy->ToString() : text;
}

std::string RematAttentionBackend(const std::string& megatron, std::string* why) {
  why->clear();
  if (megatron == "flash" || megatron == "unfused") return megatron;
  if (megatron == "local") {
    *why = "Megatron's local attention materialises the scores: remat's unfused";
    return "unfused";
  }
  if (megatron == "fused") {
    *why = "cuDNN fused attention keeps no score matrix, as flash: modelled as flash";
    return "flash";
  }
  if (megatron == "auto") {
    *why = "auto picks a fused kernel under Transformer Engine: modelled as flash; set "
           "model.attention_backend=unfused for the local implementation";
    return "flash";
  }
  return "";
}

}  // namespace remat::cli
