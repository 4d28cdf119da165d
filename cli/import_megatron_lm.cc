#include "cli/import_megatron_lm.h"

#include <map>
#include <set>

#include "cli/import_spec.h"
#include "cli/import_yaml_util.h"
#include "search/pipeline_layout.h"
#include "search/spec_fields.h"

namespace remat::cli {
namespace {

using search::InvalidArgument;

struct Flag {
  std::string name;                 // with underscores: "num_layers"
  std::string spelled;              // as given: "--num-layers"
  std::vector<std::string> values;  // none for a switch
};

std::string Underscores(std::string s) {
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  return s;
}

// A value as YAML flow text (quoted when YAML would read it otherwise).
std::string Yaml(const std::string& value) { return yaml_util::Flow(YAML::Node(value)); }

bool IsInt(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

}  // namespace

search::StatusOr<std::string> ImportMegatronLm(const std::vector<std::string>& args,
                                               const std::vector<std::string>& remat_settings,
                                               const std::string& name) {
  std::vector<Flag> flags;
  for (const std::string& a : args) {
    if (a.rfind("--", 0) == 0 && a.size() > 2) {
      const size_t eq = a.find('=');
      Flag f{Underscores(a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)),
             a.substr(0, eq), {}};
      if (eq != std::string::npos) f.values.push_back(a.substr(eq + 1));
      flags.push_back(std::move(f));
    } else if (flags.empty()) {
      return InvalidArgument("argument '" + a + "': expected a --flag first (Megatron-LM "
                             "takes no positional arguments)");
    } else {
      flags.back().values.push_back(a);
    }
  }

  ImportedSpec out("imported by `remat import megatron-lm` from Megatron-LM arguments");
  out.Set("", "name", Yaml(name));
  // Megatron-LM's defaults that differ from remat's: tied embeddings, fp32, no fp32 softmax
  // unless asked, Transformer Engine's layer, and the fusions its --no-*-fusion flags turn off
  // (megatron/training/arguments.py@d98e8a6; fp32 gradient buffers for bf16, as remat's).
  out.Set("model", "share_embeddings_and_output_weights", "true");
  out.Set("model", "attention_softmax_in_fp32", "false");
  out.Set("train", "precision", "fp32");
  out.Set("model", "transformer_impl", "transformer_engine");
  for (const char* fusion : {"bias_activation_fusion", "bias_dropout_fusion", "apply_rope_fusion",
                             "masked_softmax_fusion"}) {
    out.Set("model", fusion, "true");
  }

  std::string granularity, method, recompute_layers, attention_backend, transformer_impl;
  std::vector<std::string> modules;
  std::string query_groups, per_virtual_stage;
  bool gqa = false;
  for (const Flag& f : flags) {
    const std::string& n = f.name;
    const std::string value = f.values.empty() ? "" : f.values[0];
    auto needs_value = [&]() -> search::Status {
      if (f.values.size() != 1) {
        return InvalidArgument(f.spelled + ": takes one value, got " +
                               std::to_string(f.values.size()));
      }
      return search::OkStatus();
    };
    auto is_switch = [&]() -> search::Status {
      if (!f.values.empty()) return InvalidArgument(f.spelled + ": takes no value");
      return search::OkStatus();
    };
    if (n == "recompute_granularity") {
      granularity = value;
    } else if (n == "recompute_method") {
      method = value;
    } else if (n == "recompute_num_layers") {
      recompute_layers = value;
    } else if (n == "recompute_modules") {
      modules = f.values;
    } else if (n == "recompute_activations") {
      granularity = "selective";
    } else if (n == "group_query_attention") {
      gqa = true;
    } else if (n == "num_query_groups") {
      REMAT_SEARCH_RETURN_IF_ERROR(needs_value());
      query_groups = value;
    } else if (n == "num_layers_per_virtual_pipeline_stage") {
      REMAT_SEARCH_RETURN_IF_ERROR(needs_value());
      per_virtual_stage = value;
    } else if (n == "bf16" || n == "fp16") {
      REMAT_SEARCH_RETURN_IF_ERROR(is_switch());
      out.Set("train", "precision", "bf16");
      if (n == "fp16") {
        out.Note("train.precision=bf16 for --fp16 (same bytes per value; remat has bf16 and fp32)");
      }
    } else if (n == "attention_backend") {
      REMAT_SEARCH_RETURN_IF_ERROR(needs_value());
      attention_backend = value;
    } else if (n == "transformer_impl") {
      REMAT_SEARCH_RETURN_IF_ERROR(needs_value());
      transformer_impl = value;
      out.Set("model", "transformer_impl", Yaml(value));
    } else if (n == "optimizer" && value != "adam") {
      out.Note("not modelled: --optimizer " + value +
               " (remat's static memory assumes Adam's two fp32 moments)");
    } else if (bool sets_false = false;
               const search::FieldInfo* field = search::FindFieldByMegatronLmFlag(n, &sets_false)) {
      if (field->kind == search::FieldKind::kBool) {
        REMAT_SEARCH_RETURN_IF_ERROR(is_switch());
        out.SetField(*field, sets_false ? "false" : "true");
      } else if (field->kind == search::FieldKind::kList) {
        if (f.values.empty()) return InvalidArgument(f.spelled + ": takes one or more values");
        std::string list;
        for (const std::string& v : f.values) list += (list.empty() ? "" : ", ") + Yaml(v);
        out.SetField(*field, "[" + list + "]");
      } else {
        REMAT_SEARCH_RETURN_IF_ERROR(needs_value());
        out.SetField(*field, Yaml(value));
      }
    } else if (n != "optimizer") {
      std::string shown = f.spelled;
      for (const std::string& v : f.values) shown += " " + v;
      out.Note("ignored: " + shown + " (not modelled by remat)");
    }
  }

  // Megatron-LM's --q-lora-rank defaults to None (no q compression), MLATransformerConfig's to
  // 512 (remat's default when the key is absent): say null.
  if (out.Has("model", "multi_latent_attention") && !out.Has("model", "q_lora_rank")) {
    out.Set("model", "q_lora_rank", "null");
  }
  // Likewise --normalization defaults to LayerNorm, MLATransformerConfig's to RMSNorm.
  if (out.Has("model", "multi_latent_attention") && !out.Has("model", "normalization")) {
    out.Set("model", "normalization", "LayerNorm");
  }
  if (!query_groups.empty()) {
    if (gqa) {
      out.Set("model", "num_query_groups", Yaml(query_groups));
    } else {
      out.Note("ignored: --num-query-groups " + query_groups +
               " (Megatron-LM uses it only with --group-query-attention)");
    }
  }
  // Megatron-LM's `auto` under the local implementation is its unfused attention.
  if (attention_backend.empty()) attention_backend = "auto";
  if (transformer_impl == "local" && attention_backend == "auto") attention_backend = "local";
  {
    std::string why;
    const std::string remat = RematAttentionBackend(attention_backend, &why);
    if (remat.empty()) {
      return InvalidArgument("--attention-backend: unknown backend '" + attention_backend +
                             "' (flash, fused, unfused, local or auto)");
    }
    out.Set("model", "attention_backend", remat);
    if (!why.empty()) {
      out.Note("model.attention_backend=" + attention_backend + " -> " + remat + " (" + why + ")");
    }
  }
  const std::string policy = PolicyOfRecomputeFields(granularity, method, recompute_layers, modules);
  if (!policy.empty()) {
    out.Note("ignored: the command line's own recompute (" + policy +
             "): remat searches the policy; `remat validate SPEC --policy " + policy +
             "` checks it");
  }

  // remat's own settings, then what depends on the final layout.
  bool dp_given = false;
  std::map<std::string, std::string> settings;
  for (const std::string& s : remat_settings) {
    auto kv = SplitOverride(s);
    if (!kv.ok()) return kv.status();
    const size_t dot = kv->first.find('.');
    if (dot == std::string::npos) {
      return InvalidArgument("--set " + s + ": the key must be section.field "
                             "(e.g. parallel.data_parallel_size=8)");
    }
    out.Set(kv->first.substr(0, dot), kv->first.substr(dot + 1), kv->second);
    settings[kv->first] = kv->second;
    dp_given = dp_given || kv->first == "parallel.data_parallel_size";
  }
  if (!per_virtual_stage.empty()) {
    int layers = 0, pp = 1, per = 0;
    for (const Flag& f : flags) {
      if (f.name == "num_layers" && !f.values.empty() && IsInt(f.values[0])) layers = std::stoi(f.values[0]);
      if (f.name == "pipeline_model_parallel_size" && !f.values.empty() && IsInt(f.values[0])) {
        pp = std::stoi(f.values[0]);
      }
    }
    if (IsInt(per_virtual_stage)) per = std::stoi(per_virtual_stage);
    if (per <= 0 || pp <= 0 || layers % (pp * per) != 0) {
      return InvalidArgument("--num-layers-per-virtual-pipeline-stage: " + per_virtual_stage +
                             " must divide the layers per pipeline stage (--num-layers / "
                             "--pipeline-model-parallel-size)");
    }
    out.Set("parallel", "virtual_pipeline_model_parallel_size",
            std::to_string(layers / (pp * per)));
  }
  // With --pipeline-model-parallel-layout Megatron-LM takes the virtual pipeline size from the
  // layout's stage count / PP (arguments.py at d98e8a6); remat's spec says it explicitly.
  for (const Flag& f : flags) {
    if (f.name != "pipeline_model_parallel_layout" || f.values.empty() ||
        out.Has("parallel", "virtual_pipeline_model_parallel_size")) {
      continue;
    }
    int pp = 1;
    for (const Flag& g : flags) {
      if (g.name == "pipeline_model_parallel_size" && !g.values.empty() && IsInt(g.values[0])) {
        pp = std::stoi(g.values[0]);
      }
    }
    const auto stages = search::LayoutStageCount(f.values[0]);
    if (!stages.ok()) return stages.status();
    if (pp > 0 && *stages % pp == 0 && *stages / pp > 1) {
      out.Set("parallel", "virtual_pipeline_model_parallel_size", std::to_string(*stages / pp));
    }
  }
  // Megatron-LM, like Bridge, turns sequence parallelism off at TP 1; remat refuses SP there.
  {
    std::string tp = "1";
    bool sp = false;
    for (const Flag& f : flags) {
      if (f.name == "tensor_model_parallel_size" && !f.values.empty()) tp = f.values[0];
      sp = sp || f.name == "sequence_parallel";
    }
    if (sp && tp == "1" && !settings.count("parallel.sequence_parallel")) {
      out.Set("parallel", "sequence_parallel", "false");
      out.Note("parallel.sequence_parallel=false: Megatron-LM turns it off at "
               "--tensor-model-parallel-size 1");
    }
  }
  if (!out.Has("model", "vocab_size")) {
    return InvalidArgument("model.vocab_size: required: Megatron-LM takes it from the "
                           "tokenizer; pass --vocab-size N or --set model.vocab_size=N");
  }
  if (!dp_given) {
    out.Note("parallel.data_parallel_size: Megatron-LM derives it from the world size (world / "
             "(TP x CP x PP)); 1 here unless you pass --set parallel.data_parallel_size=N");
  }
  auto spec = out.Finish();
  if (!spec.ok() && !dp_given &&
      std::string(spec.status().message()).find("data_parallel_size") != std::string::npos) {
    return InvalidArgument(std::string(spec.status().message()) +
                           " (the data-parallel size is not in the input: pass --set parallel.data_parallel_size=N)");
  }
  return spec;
}

}  // namespace remat::cli
