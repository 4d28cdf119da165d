#include "cli/import_bridge.h"

#include <map>
#include <set>

#include "cli/import_spec.h"
#include "cli/import_yaml_util.h"
#include "search/spec_fields.h"
#include "search/text.h"

namespace remat::cli {
namespace {

using search::InvalidArgument;
using yaml_util::Child;
using yaml_util::Flow;
using yaml_util::Neutral;
using yaml_util::Plain;
using yaml_util::Text;

std::vector<std::string> SplitDots(const std::string& key) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (;;) {
    const size_t dot = key.find('.', start);
    parts.push_back(key.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

void SetPath(YAML::Node node, const std::vector<std::string>& parts, size_t i,
             const YAML::Node& value) {
  if (i + 1 == parts.size()) {
    node[parts[i]] = value;
    return;
  }
  if (!node[parts[i]].IsMap()) node[parts[i]] = YAML::Node(YAML::NodeType::Map);
  SetPath(node[parts[i]], parts, i + 1, value);
}

void RemovePath(YAML::Node node, const std::vector<std::string>& parts, size_t i) {
  if (!node.IsMap()) return;
  if (i + 1 == parts.size()) {
    node.remove(parts[i]);
    return;
  }
  if (node[parts[i]].IsMap()) RemovePath(node[parts[i]], parts, i + 1);
}

search::StatusOr<YAML::Node> ParseValue(const std::string& arg, const std::string& text) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception&) {
    return InvalidArgument("override '" + arg + "': the value is not YAML");
  }
}

// Why a model.* field remat does not read is not carried. Numerics-only fields first.
std::string ModelFieldReason(const std::string& key) {
  static const std::set<std::string> kNumerics = {
      "init_method_std", "layernorm_epsilon", "rotary_base", "rotary_percent",
      "seq_len_interpolation_factor", "perform_initialization", "use_cpu_initialization",
      "deterministic_mode", "moe_aux_loss_coeff", "moe_z_loss_coeff",
      "moe_router_load_balancing_type", "moe_router_score_function", "moe_router_pre_softmax",
      "moe_router_topk_scaling_factor", "moe_router_enable_expert_bias",
      "moe_router_bias_update_rate", "apply_query_key_layer_scaling", "layernorm_zero_centered_gamma",
      "qk_layernorm", "init_method", "output_layer_init_method", "rope_scaling",
      "rope_scaling_factor", "rotary_scaling_factor", "make_vocab_size_divisible_by",
      "max_position_embeddings", "mscale", "mscale_all_dim", "beta_fast", "beta_slow",
      "original_max_position_embeddings", "generation_config", "hf_model_id"};
  if (kNumerics.count(key)) return "numerics or initialisation: no effect on memory";
  if (key == "activation_func") {
    return "remat's MLP is SwiGLU with gated_linear_unit, GELU without";
  }
  if (key.find("fusion") != std::string::npos || key == "persist_layer_norm") {
    return "kernel fusion: not modelled; remat counts the unfused intermediates";
  }
  return "not modelled by remat";
}

// Why a whole section is not read (beyond the fields taken from it).
std::string SectionReason(const std::string& section) {
  static const std::map<std::string, std::string> kReasons = {
      {"train", "the run's length, evaluation and checks: not one step's memory"},
      {"dataset", "data loading"},
      {"optimizer", "learning rate and its schedule: remat models Adam's fp32 state"},
      {"ddp", "gradient buckets and overlap: not modelled"},
      {"scheduler", "learning-rate schedule"},
      {"tokenizer", "tokenizer files"},
      {"checkpoint", "checkpoint saving and loading"},
      {"logger", "logging"},
      {"profiling", "profiling"},
      {"dist", "process-group set-up"},
      {"rng", "random state other than the seed"},
      {"comm_overlap", "communication overlap: its buffers are not in remat's memory model"},
      {"peft", "not modelled: remat models full training (frozen weights need no gradients "
               "or optimizer state)"},
      {"mixed_precision", "precision details other than bf16/fp16/fp8"},
      {"ft", "fault tolerance"},
      {"straggler", "straggler detection"},
      {"nvrx_straggler", "straggler detection"},
      {"inprocess_restart", "in-process restart"},
      {"rerun_state_machine", "result checking"},
  };
  auto it = kReasons.find(section);
  return it != kReasons.end() ? it->second : "not a section remat reads";
}

bool IsTrue(const YAML::Node& n) {
  const std::string s = Text(n);
  return s == "true" || s == "True";
}

}  // namespace

namespace {

// The keys of the model section as remat reads them: the model provider's own fields, and those
// of a nested `transformer` mapping (newer Bridge recipes keep the TransformerConfig there).
std::vector<std::pair<std::string, YAML::Node>> ModelKeys(const YAML::Node& model) {
  std::vector<std::pair<std::string, YAML::Node>> keys;
  for (const auto& kv : model) {
    const std::string key = kv.first.as<std::string>();
    if (key == "transformer" && kv.second.IsMap()) {
      for (const auto& t : kv.second) {
        const std::string tk = t.first.as<std::string>();
        if (tk != "_target_" && tk != "_builder_") keys.emplace_back(tk, t.second);
      }
      continue;
    }
    keys.emplace_back(key, kv.second);
  }
  return keys;
}

// Fields whose Bridge value remat reads by hand, below (not a one-to-one mapping).
bool ReadByHand(const std::string& key) {
  static const std::set<std::string> k = {
      "_target_", "recompute_granularity", "recompute_method", "recompute_num_layers",
      "recompute_modules", "attention_backend", "bf16", "fp16", "params_dtype", "pipeline_dtype",
      "autocast_dtype", "seq_length"};
  return k.count(key) > 0;
}

search::StatusOr<std::string> ImportBridgeUnguarded(const std::string& yaml_text,
                                                    const std::vector<std::string>& overrides,
                                                    const std::string& name) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument("config: not valid YAML: " + std::string(e.what()));
  }
  if (!root || !root.IsMap()) return InvalidArgument("config: must be a YAML mapping");

  // Hydra-style overrides first, as Bridge applies them to the recipe; remat's own keys later.
  std::vector<std::pair<std::string, YAML::Node>> remat_overrides;
  for (const std::string& arg : overrides) {
    if (!arg.empty() && arg[0] == '~') {
      if (arg.size() < 2) return InvalidArgument("override '" + arg + "': names no key");
      RemovePath(root, SplitDots(arg.substr(1, arg.find('=') - 1)), 0);
      continue;
    }
    auto kv = SplitOverride(arg);
    if (!kv.ok()) return kv.status();
    auto value = ParseValue(arg, kv->second);
    if (!value.ok()) return value.status();
    if (IsRematOnlyKey(kv->first)) {
      remat_overrides.emplace_back(kv->first, *value);
    } else {
      SetPath(root, SplitDots(kv->first), 0, *value);
    }
  }

  const YAML::Node model = Child(root, "model");
  if (!model || !model.IsMap()) {
    return InvalidArgument("model: required (a Megatron Bridge ConfigContainer has a model "
                           "section with the architecture and the parallel layout)");
  }
  const std::vector<std::pair<std::string, YAML::Node>> model_keys = ModelKeys(model);
  auto model_value = [&](const std::string& key) {
    YAML::Node found(YAML::NodeType::Undefined);
    for (const auto& [k, v] : model_keys) {
      if (k == key) found = v;
    }
    return found;
  };

  ImportedSpec out("imported by `remat import bridge` from a Megatron Bridge ConfigContainer");
  out.Set("", "name", Flow(YAML::Node(name)));
  if (const std::string target = Text(Child(model, "_target_")); !target.empty()) {
    out.Note("model provider: " + target);
  }

  // ---- every declared field with a Bridge key (search/spec_fields.def): the first of its
  // alternatives that the config has
  std::map<std::string, std::set<std::string>> taken;  // section -> keys read
  for (const search::FieldInfo& f : search::SpecFields()) {
    for (const std::string& bridge_key : f.BridgeKeys()) {
      const size_t dot = bridge_key.find('.');
      const std::string section = bridge_key.substr(0, dot), key = bridge_key.substr(dot + 1);
      const YAML::Node v = Plain(section == "model" ? model_value(key)
                                                    : Child(Child(root, section), key));
      if (!v) continue;
      out.SetField(f, Flow(v));
      taken[section].insert(key);
      break;
    }
  }

  // ---- model.*: what is read by hand, and a note for every other field
  std::string granularity, method, num_layers;
  std::vector<std::string> modules;
  int quiet = 0;
  for (const auto& [key, raw] : model_keys) {
    const YAML::Node v = Plain(raw);
    if (key == "recompute_granularity") {
      granularity = Text(v);
    } else if (key == "recompute_method") {
      method = Text(v);
    } else if (key == "recompute_num_layers") {
      num_layers = Text(v);
    } else if (key == "recompute_modules") {
      if (v.IsSequence()) {
        for (const auto& m : v) modules.push_back(Text(m));
      }
    } else if (key == "attention_backend") {
      // Bridge leaves it null: Megatron Core's AttnBackend.auto, which under the local layer
      // spec is Megatron's own (unfused) attention.
      std::string text = v.IsNull() ? "auto" : Text(v);
      if (text == "auto" && Text(Plain(model_value("transformer_impl"))) == "local") text = "local";
      if (text.rfind("AttnBackend.", 0) == 0) text = text.substr(12);
      static const char* const kByValue[] = {"", "flash", "fused", "unfused", "local", "auto"};
      if (text.size() == 1 && text[0] >= '1' && text[0] <= '5') text = kByValue[text[0] - '0'];
      std::string why;
      const std::string remat = RematAttentionBackend(text, &why);
      if (remat.empty()) {
        return InvalidArgument("model.attention_backend: unknown backend '" + Flow(v) +
                               "' (flash, fused, unfused, local or auto)");
      }
      out.Set("model", "attention_backend", remat);
      if (!why.empty()) out.Note("model.attention_backend=" + text + " -> " + remat + " (" + why + ")");
    } else if (ReadByHand(key) || taken["model"].count(key)) {
      continue;
    } else if (Neutral(v)) {
      ++quiet;
    } else {
      out.Note("ignored: model." + key + "=" + Flow(v) + " (" + ModelFieldReason(key) + ")");
    }
  }
  const std::string recipe_policy =
      PolicyOfRecomputeFields(granularity, method, num_layers, modules);
  if (!recipe_policy.empty()) {
    out.Note("ignored: the recipe's own recompute (" + recipe_policy +
             "): remat searches the policy; `remat validate SPEC --policy " + recipe_policy +
             "` checks it");
  }
  if (quiet > 0) {
    out.Note("ignored: " + std::to_string(quiet) +
             " more model fields left null, false or empty (not modelled by remat)");
  }

  // Sequence length: what the data loader feeds (dataset.sequence_length, or dataset.seq_length
  // as newer Bridge writes it) is what trains.
  const YAML::Node dataset = Child(root, "dataset");
  const YAML::Node named_seq = Plain(Child(dataset, "sequence_length"));
  const YAML::Node seq = named_seq && !named_seq.IsNull() ? named_seq
                                                          : Plain(Child(dataset, "seq_length"));
  const YAML::Node model_seq = Plain(model_value("seq_length"));
  if (seq && !seq.IsNull()) {
    out.Set("model", "seq_length", Flow(seq));
    if (model_seq && !model_seq.IsNull() && Flow(model_seq) != Flow(seq)) {
      out.Note("ignored: model.seq_length=" + Flow(model_seq) +
               " (dataset.sequence_length is what trains)");
    }
  } else if (model_seq && !model_seq.IsNull()) {
    out.Set("model", "seq_length", Flow(model_seq));
  }

  // Vocabulary: recipes often leave it to the tokenizer.
  if (Neutral(Plain(model_value("vocab_size")))) {
    const YAML::Node tv = Plain(Child(Child(root, "tokenizer"), "vocab_size"));
    if (!Neutral(tv)) {
      out.Set("model", "vocab_size", Flow(tv));
      out.Note("model.vocab_size from tokenizer.vocab_size");
    } else {
      return InvalidArgument("model.vocab_size: required: the config leaves it to the "
                             "tokenizer; pass model.vocab_size=N");
    }
  }

  // Bridge turns sequence parallelism off at TP 1 (its finalize step); remat refuses SP there.
  {
    const std::string tp = Text(Plain(model_value("tensor_model_parallel_size")));
    if (IsTrue(Plain(model_value("sequence_parallel"))) && (tp.empty() || tp == "1")) {
      out.Set("parallel", "sequence_parallel", "false");
      out.Note("parallel.sequence_parallel=false: Bridge turns it off at tensor_model_parallel_size 1");
    }
  }

  // Precision: the mixed_precision recipe (a name or a mapping), else model.bf16 / model.fp16.
  {
    const YAML::Node mp = Plain(Child(root, "mixed_precision"));
    std::string precision;
    if (mp && mp.IsScalar() && !mp.IsNull()) {
      const std::string recipe = Text(mp);
      if (recipe.find("bf16") != std::string::npos) precision = "bf16";
      else if (recipe.find("fp16") != std::string::npos) precision = "fp16";
      else if (recipe.find("32") != std::string::npos) precision = "fp32";
      if (recipe.find("fp8") != std::string::npos && !out.Has("model", "fp8")) {
        out.Note("not carried: mixed_precision=" + recipe +
                 " names an FP8 recipe by name only; set model.fp8 (and model.fp8_recipe) to "
                 "carry it");
      }
    } else if (mp && mp.IsMap()) {
      if (IsTrue(Plain(Child(mp, "bf16")))) precision = "bf16";
      else if (IsTrue(Plain(Child(mp, "fp16")))) precision = "fp16";
    }
    if (precision.empty()) {
      if (IsTrue(Plain(model_value("bf16")))) precision = "bf16";
      else if (IsTrue(Plain(model_value("fp16")))) precision = "fp16";
      else if (model_value("bf16") || model_value("fp16")) precision = "fp32";
    }
    if (precision == "fp16") {
      out.Note("train.precision=bf16 for fp16 (same bytes per value; remat has bf16 and fp32)");
      precision = "bf16";
    }
    if (!precision.empty()) out.Set("train", "precision", precision);
  }

  const std::string optimizer = Text(Plain(Child(Child(root, "optimizer"), "optimizer")));
  if (!optimizer.empty() && optimizer != "adam") {
    out.Note("not modelled: optimizer.optimizer=" + optimizer +
             " (remat's static memory assumes Adam's two fp32 moments)");
  }

  // ---- every other section: one line each, naming the fields it set that remat did not read
  static const std::map<std::string, std::set<std::string>> kReadByHand = {
      {"dataset", {"sequence_length", "seq_length"}},
      {"optimizer", {"optimizer"}},
      {"tokenizer", {"vocab_size"}},
      {"mixed_precision", {"bf16", "fp16"}}};
  std::map<std::string, std::vector<std::string>> ignored;  // section -> fields
  for (const auto& kv : root) {
    const std::string section = kv.first.as<std::string>();
    if (section == "model") continue;
    const YAML::Node v = kv.second;
    if (!v.IsMap()) {
      if (section != "mixed_precision" && !Neutral(v)) ignored[section].push_back("");
      continue;
    }
    auto by_hand = kReadByHand.find(section);
    for (const auto& f : v) {
      const std::string field = f.first.as<std::string>();
      if (field == "_target_" || Neutral(Plain(f.second))) continue;
      if (taken[section].count(field)) continue;
      if (by_hand != kReadByHand.end() && by_hand->second.count(field)) continue;
      ignored[section].push_back(field);
    }
  }
  for (const auto& [section, fields] : ignored) {
    if (fields.empty()) continue;
    std::string list;
    if (fields.size() == 1 && fields[0].empty()) {
      list = section;
    } else {
      for (size_t i = 0; i < fields.size(); ++i) list += (i ? ", " : "") + fields[i];
      list = section + ".{" + list + "}";
    }
    out.Note("ignored: " + list + " (" + SectionReason(section) + ")");
  }

  // ---- remat's own keys from the command line
  bool dp_given = false;
  for (const auto& [key, value] : remat_overrides) {
    const size_t dot = key.find('.');
    out.Set(key.substr(0, dot), key.substr(dot + 1), Flow(value));
    dp_given = dp_given || key == "parallel.data_parallel_size";
  }
  if (!dp_given) {
    out.Note("parallel.data_parallel_size: Bridge derives it from the world size (world / (TP x "
             "CP x PP)); 1 here unless you pass parallel.data_parallel_size=N");
  }
  auto spec = out.Finish();
  if (!spec.ok() && !dp_given &&
      std::string(spec.status().message()).find("data_parallel_size") != std::string::npos) {
    return InvalidArgument(std::string(spec.status().message()) +
                           " (the data-parallel size is not in the input: pass parallel.data_parallel_size=N)");
  }
  return spec;
}

}  // namespace

search::StatusOr<std::string> ImportBridge(const std::string& yaml_text,
                                           const std::vector<std::string>& overrides,
                                           const std::string& name) {
  // A recipe is any YAML: a key that is a list or a value of the wrong shape makes yaml-cpp
  // throw; that is bad input (exit 2), not a crash.
  try {
    return ImportBridgeUnguarded(yaml_text, overrides, name);
  } catch (const std::exception& e) {
    return InvalidArgument("config: " + search::BoundedUtf8(e.what(), 200) +
                           " (keys must be plain strings)");
  }
}

}  // namespace remat::cli
