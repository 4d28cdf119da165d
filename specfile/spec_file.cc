#include "specfile/spec_file.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "common/read_file.h"
#include "search/policy.h"

namespace remat::spec {
namespace {

using search::InvalidArgument;
using search::Status;
using search::StatusOr;

// Reads the keys of one YAML mapping, remembering which were consumed so that unknown keys can
// be refused by name. Type errors name the full key path.
class Section {
 public:
  Section(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {}

  Status CheckIsMap() const {
    if (node_ && !node_.IsNull() && !node_.IsMap()) {
      return InvalidArgument(path_ + ": must be a mapping of keys to values");
    }
    return search::OkStatus();
  }

  std::string Key(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  // The node for `key`, or an undefined/null node when absent.
  YAML::Node Get(const std::string& key) {
    seen_.insert(key);
    if (!node_ || !node_.IsMap()) return YAML::Node();
    return node_[key];
  }

  Status Int(const std::string& key, int* out) {
    YAML::Node n = Get(key);
    if (!n || n.IsNull()) return search::OkStatus();
    return ParseInt(n, Key(key), out);
  }

  Status OptionalInt(const std::string& key, std::optional<int>* out) {
    YAML::Node n = Get(key);
    if (!n || n.IsNull()) return search::OkStatus();
    int v = 0;
    REMAT_SEARCH_RETURN_IF_ERROR(ParseInt(n, Key(key), &v));
    *out = v;
    return search::OkStatus();
  }

  Status Uint64(const std::string& key, uint64_t* out) {
    YAML::Node n = Get(key);
    if (!n || n.IsNull()) return search::OkStatus();
    if (!n.IsScalar()) return InvalidArgument(Key(key) + ": must be a non-negative integer");
    try {
      *out = n.as<uint64_t>();
    } catch (const YAML::Exception&) {
      return InvalidArgument(Key(key) + ": must be a non-negative integer, got '" + n.Scalar() + "'");
    }
    return search::OkStatus();
  }

  Status Double(const std::string& key, double* out) {
    YAML::Node n = Get(key);
    if (!n || n.IsNull()) return search::OkStatus();
    if (!n.IsScalar()) return InvalidArgument(Key(key) + ": must be a number");
    try {
      double v = n.as<double>();
      if (!std::isfinite(v)) throw YAML::Exception(YAML::Mark(), "not finite");
      *out = v;
    } catch (const YAML::Exception&) {
      return InvalidArgument(Key(key) + ": must be a number, got '" + n.Scalar() + "'");
    }
    return search::OkStatus();
  }

  Status Bool(const std::string& key, bool* out) {
    YAML::Node n = Get(key);
    if (!n || n.IsNull()) return search::OkStatus();
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    if (s == "true" || s == "True" || s == "TRUE") {
      *out = true;
    } else if (s == "false" || s == "False" || s == "FALSE") {
      *out = false;
    } else {
      return InvalidArgument(Key(key) + ": must be true or false, got '" + s + "'");
    }
    return search::OkStatus();
  }

  Status String(const std::string& key, std::string* out) {
    YAML::Node n = Get(key);
    if (!n || n.IsNull()) return search::OkStatus();
    if (!n.IsScalar()) return InvalidArgument(Key(key) + ": must be a string");
    *out = n.Scalar();
    return search::OkStatus();
  }

  Status OptionalString(const std::string& key, std::optional<std::string>* out) {
    YAML::Node n = Get(key);
    if (!n || n.IsNull()) return search::OkStatus();
    if (!n.IsScalar()) return InvalidArgument(Key(key) + ": must be a string");
    *out = n.Scalar();
    return search::OkStatus();
  }

  // A string naming an enum value; `parse` returns nullopt for unknown names.
  template <typename E>
  Status Enum(const std::string& key, std::function<std::optional<E>(const std::string&)> parse,
              const char* allowed, E* out) {
    std::string s;
    YAML::Node n = Get(key);
    if (!n || n.IsNull()) return search::OkStatus();
    if (!n.IsScalar()) return InvalidArgument(Key(key) + ": must be one of " + allowed);
    auto v = parse(n.Scalar());
    if (!v) {
      return InvalidArgument(Key(key) + ": must be one of " + allowed + ", got '" + n.Scalar() +
                             "'");
    }
    *out = *v;
    return search::OkStatus();
  }

  // Refuses keys that were never asked for.
  Status RejectUnknown() const {
    if (!node_ || !node_.IsMap()) return search::OkStatus();
    for (const auto& kv : node_) {
      const std::string key = kv.first.as<std::string>();
      if (!seen_.count(key)) return InvalidArgument(Key(key) + ": unknown key");
    }
    return search::OkStatus();
  }

  static Status ParseInt(const YAML::Node& n, const std::string& field, int* out) {
    if (!n.IsScalar()) return InvalidArgument(field + ": must be an integer");
    const std::string& s = n.Scalar();
    long long v = 0;
    size_t used = 0;
    try {
      v = std::stoll(s, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != s.size()) {
      return InvalidArgument(field + ": must be an integer, got '" + s + "'");
    }
    if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
      return InvalidArgument(field + ": " + s + " is out of range");
    }
    *out = static_cast<int>(v);
    return search::OkStatus();
  }

 private:
  YAML::Node node_;
  std::string path_;
  std::set<std::string> seen_;
};

Status ReadModel(Section& s, search::ModelSpec* m) {
  REMAT_SEARCH_RETURN_IF_ERROR(s.CheckIsMap());
  for (const char* key : {"num_layers", "hidden_size", "num_attention_heads", "seq_length",
                          "vocab_size"}) {
    YAML::Node n = s.Get(key);
    if (!n || n.IsNull()) return InvalidArgument(s.Key(key) + ": required");
  }
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("num_layers", &m->num_layers));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("hidden_size", &m->hidden_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("num_attention_heads", &m->num_attention_heads));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("seq_length", &m->seq_length));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("vocab_size", &m->vocab_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("num_query_groups", &m->num_query_groups));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("ffn_hidden_size", &m->ffn_hidden_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("kv_channels", &m->kv_channels));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("gated_linear_unit", &m->gated_linear_unit));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Enum<search::Normalization>(
      "normalization", search::ParseNormalization, "LayerNorm, RMSNorm", &m->normalization));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Enum<search::AttentionBackend>(
      "attention_backend", search::ParseAttentionBackend,
      "unfused, flash, or Megatron's auto, fused, local",
      &m->attention_backend));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Double("attention_dropout", &m->attention_dropout));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Double("hidden_dropout", &m->hidden_dropout));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("attention_softmax_in_fp32", &m->attention_softmax_in_fp32));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("add_bias_linear", &m->add_bias_linear));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Enum<search::PositionEmbedding>(
      "position_embedding_type", search::ParsePositionEmbedding, "learned_absolute, rope, none",
      &m->position_embedding_type));
  REMAT_SEARCH_RETURN_IF_ERROR(
      s.Bool("share_embeddings_and_output_weights", &m->share_embeddings_and_output_weights));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("multi_latent_attention", &m->multi_latent_attention));
  {  // MLATransformerConfig's default normalization is RMSNorm (TransformerConfig's LayerNorm)
    YAML::Node n = s.Get("normalization");
    if (m->multi_latent_attention && (!n || n.IsNull())) {
      m->normalization = search::Normalization::kRMSNorm;
    }
  }
  {  // absent: MLATransformerConfig's 512; null: no q compression
    YAML::Node q = s.Get("q_lora_rank");
    if (q && q.IsNull()) {
      m->q_lora_rank.reset();
    } else if (q) {
      int v = 0;
      REMAT_SEARCH_RETURN_IF_ERROR(Section::ParseInt(q, s.Key("q_lora_rank"), &v));
      m->q_lora_rank = v;
    }
  }
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("kv_lora_rank", &m->kv_lora_rank));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("qk_head_dim", &m->qk_head_dim));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("qk_pos_emb_head_dim", &m->qk_pos_emb_head_dim));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("v_head_dim", &m->v_head_dim));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("num_moe_experts", &m->num_moe_experts));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("moe_router_topk", &m->moe_router_topk));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("moe_ffn_hidden_size", &m->moe_ffn_hidden_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("moe_shared_expert_intermediate_size",
                                             &m->moe_shared_expert_intermediate_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("moe_grouped_gemm", &m->moe_grouped_gemm));
  YAML::Node freq = s.Get("moe_layer_freq");
  if (freq && !freq.IsNull()) {
    if (freq.IsSequence()) {
      for (size_t i = 0; i < freq.size(); ++i) {
        int v = 0;
        REMAT_SEARCH_RETURN_IF_ERROR(Section::ParseInt(
            freq[i], s.Key("moe_layer_freq") + "[" + std::to_string(i) + "]", &v));
        m->moe_layer_pattern.push_back(v);
      }
    } else {
      REMAT_SEARCH_RETURN_IF_ERROR(Section::ParseInt(freq, s.Key("moe_layer_freq"),
                                                     &m->moe_layer_freq));
    }
  }
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("moe_shared_expert_overlap", &m->moe_shared_expert_overlap));
  REMAT_SEARCH_RETURN_IF_ERROR(
      s.Bool("overlap_moe_expert_parallel_comm", &m->overlap_moe_expert_parallel_comm));
  REMAT_SEARCH_RETURN_IF_ERROR(
      s.OptionalString("experimental_attention_variant", &m->experimental_attention_variant));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("cpu_offloading", &m->cpu_offloading));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("cpu_offloading_num_layers", &m->cpu_offloading_num_layers));
  REMAT_SEARCH_RETURN_IF_ERROR(s.String("fp8", &m->fp8));  // null: no FP8
  REMAT_SEARCH_RETURN_IF_ERROR(s.String("fp8_recipe", &m->fp8_recipe));
  REMAT_SEARCH_RETURN_IF_ERROR(s.String("cuda_graph_impl", &m->cuda_graph_impl));
  YAML::Node scope = s.Get("cuda_graph_scope");
  if (scope && !scope.IsNull()) {
    if (scope.IsScalar()) {  // one module, as Megatron also accepts
      m->cuda_graph_scope.push_back(scope.Scalar());
    } else if (scope.IsSequence()) {
      for (size_t i = 0; i < scope.size(); ++i) {
        if (!scope[i].IsScalar()) {
          return InvalidArgument(s.Key("cuda_graph_scope") + "[" + std::to_string(i) +
                                 "]: must be a module name");
        }
        m->cuda_graph_scope.push_back(scope[i].Scalar());
      }
    } else {
      return InvalidArgument(s.Key("cuda_graph_scope") + ": must be a list of module names");
    }
  }
  REMAT_SEARCH_RETURN_IF_ERROR(
      s.Bool("distribute_saved_activations", &m->distribute_saved_activations));
  return s.RejectUnknown();
}

Status ReadTrain(Section& s, search::TrainSpec* t) {
  REMAT_SEARCH_RETURN_IF_ERROR(s.CheckIsMap());
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("micro_batch_size", &t->micro_batch_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("global_batch_size", &t->global_batch_size));
  REMAT_SEARCH_RETURN_IF_ERROR(
      s.Enum<search::Precision>("precision", search::ParsePrecision, "bf16, fp32", &t->precision));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("use_distributed_optimizer", &t->use_distributed_optimizer));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Uint64("seed", &t->seed));
  return s.RejectUnknown();
}

Status ReadParallel(Section& s, search::ParallelSpec* p) {
  REMAT_SEARCH_RETURN_IF_ERROR(s.CheckIsMap());
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("tensor_model_parallel_size", &p->tensor_model_parallel_size));
  REMAT_SEARCH_RETURN_IF_ERROR(
      s.Int("pipeline_model_parallel_size", &p->pipeline_model_parallel_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("sequence_parallel", &p->sequence_parallel));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("expert_model_parallel_size", &p->expert_model_parallel_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("data_parallel_size", &p->data_parallel_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("virtual_pipeline_model_parallel_size",
                                             &p->virtual_pipeline_model_parallel_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("context_parallel_size", &p->context_parallel_size));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("num_layers_in_first_pipeline_stage",
                                             &p->num_layers_in_first_pipeline_stage));
  REMAT_SEARCH_RETURN_IF_ERROR(s.OptionalInt("num_layers_in_last_pipeline_stage",
                                             &p->num_layers_in_last_pipeline_stage));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("account_for_embedding_in_pipeline_split",
                                      &p->account_for_embedding_in_pipeline_split));
  REMAT_SEARCH_RETURN_IF_ERROR(
      s.Bool("account_for_loss_in_pipeline_split", &p->account_for_loss_in_pipeline_split));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("overlap_grad_reduce", &p->overlap_grad_reduce));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Bool("overlap_param_gather", &p->overlap_param_gather));
  return s.RejectUnknown();
}

Status ReadSearch(Section& s, search::SearchOptions* o) {
  REMAT_SEARCH_RETURN_IF_ERROR(s.CheckIsMap());
  REMAT_SEARCH_RETURN_IF_ERROR(s.Double("memory_budget_gib", &o->memory_budget_gib));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Enum<search::MemoryMetric>(
      "memory_metric", search::ParseMemoryMetric, "reserved, allocated", &o->memory_metric));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Enum<search::StrategyKind>(
      "strategy", search::ParseStrategyKind, "guided, exhaustive", &o->strategy));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Enum<search::Objective>(
      "objective", search::ParseObjective, "frontier, recommend", &o->objective));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Double("memory_headroom_gib", &o->memory_headroom_gib));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("max_trials", &o->max_trials));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("warmup_steps", &o->warmup_steps));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("warmup_max_steps", &o->warmup_max_steps));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("steady_window", &o->steady_window));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Double("steady_tolerance", &o->steady_tolerance));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Int("measure_steps", &o->measure_steps));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Enum<search::Backend>(
      "backend", search::ParseBackend, "builtin, command, replay, megatron", &o->backend));
  REMAT_SEARCH_RETURN_IF_ERROR(s.String("replay_table", &o->replay_table));
  REMAT_SEARCH_RETURN_IF_ERROR(s.String("command_template", &o->command_template));
  REMAT_SEARCH_RETURN_IF_ERROR(
      s.Enum<search::Device>("device", search::ParseDevice, "auto, cuda, cpu", &o->device));
  REMAT_SEARCH_RETURN_IF_ERROR(s.Double("trial_timeout_s", &o->trial_timeout_s));
  YAML::Node proxy = s.Get("proxy_layers");
  if (proxy && !proxy.IsNull()) {
    if (!proxy.IsSequence()) {
      return InvalidArgument(s.Key("proxy_layers") + ": must be a list of two depths, e.g. [2, 4]");
    }
    for (size_t i = 0; i < proxy.size(); ++i) {
      int v = 0;
      REMAT_SEARCH_RETURN_IF_ERROR(Section::ParseInt(
          proxy[i], s.Key("proxy_layers") + "[" + std::to_string(i) + "]", &v));
      o->proxy_layers.push_back(v);
    }
  }
  return s.RejectUnknown();
}

StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  auto text = common::ReadFile(path);
  if (!text) return InvalidArgument(std::string(what) + " '" + path + "': cannot be read");
  return *text;
}

}  // namespace

StatusOr<search::SearchSpec> ParseSpecYaml(const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument("spec: not valid YAML: " + std::string(e.what()));
  }
  if (!root || !root.IsMap()) return InvalidArgument("spec: must be a YAML mapping");
  search::SearchSpec spec;
  Section top(root, "");
  REMAT_SEARCH_RETURN_IF_ERROR(top.String("name", &spec.name));
  YAML::Node model = top.Get("model");
  if (!model || model.IsNull()) return InvalidArgument("model: required");
  Section ms(model, "model");
  REMAT_SEARCH_RETURN_IF_ERROR(ReadModel(ms, &spec.model));
  Section ts(top.Get("train"), "train");
  REMAT_SEARCH_RETURN_IF_ERROR(ReadTrain(ts, &spec.train));
  Section ps(top.Get("parallel"), "parallel");
  REMAT_SEARCH_RETURN_IF_ERROR(ReadParallel(ps, &spec.parallel));
  Section ss(top.Get("search"), "search");
  REMAT_SEARCH_RETURN_IF_ERROR(ReadSearch(ss, &spec.search));
  REMAT_SEARCH_RETURN_IF_ERROR(top.RejectUnknown());
  REMAT_SEARCH_RETURN_IF_ERROR(search::ValidateSpec(spec));
  return spec;
}

StatusOr<search::SearchSpec> LoadSpecFile(const std::string& path) {
  auto text = ReadFile(path, "spec");
  if (!text.ok()) return text.status();
  auto spec = ParseSpecYaml(*text);
  if (!spec.ok()) return spec;
  auto& table = spec->search.replay_table;
  if (!table.empty() && std::filesystem::path(table).is_relative()) {
    table = (std::filesystem::path(path).parent_path() / table).lexically_normal().string();
  }
  if (spec->name.empty()) spec->name = std::filesystem::path(path).stem().string();
  return spec;
}

StatusOr<ReplayTable> ParseReplayTableJson(const std::string& json_text) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("replay table: not valid JSON: " + std::string(e.what()));
  }
  if (!root.is_object() || !root.contains("trials") || !root["trials"].is_object()) {
    return InvalidArgument("replay table: must be an object with a \"trials\" object");
  }
  ReplayTable table;
  for (const auto& [key, entry] : root["trials"].items()) {
    const std::string where = "replay table: trials[\"" + key + "\"]";
    auto policy = search::ParsePolicy(key);
    if (!policy.ok()) return InvalidArgument(where + ": " + policy.status().message());
    if (!entry.is_object()) return InvalidArgument(where + ": must be an object");
    ReplayEntry e;
    e.result.policy = *policy;
    try {
      auto status = search::ParseTrialStatus(entry.value("status", std::string("ok")));
      if (!status) return InvalidArgument(where + ".status: unknown trial status");
      e.result.status = *status;
      e.result.step_time_s = entry.value("step_time_s", 0.0);
      e.result.tokens_per_s = entry.value("tokens_per_s", 0.0);
      e.result.loss = entry.value("loss", 0.0);
      e.result.grad_norm = entry.value("grad_norm", 0.0);
      e.result.message = entry.value("message", std::string());
      e.wall_s = entry.value("wall_s", 0.0);
      if (e.wall_s < 0 || e.result.step_time_s < 0) {
        return InvalidArgument(where + ": wall_s and step_time_s must not be negative");
      }
      if (e.result.status == search::TrialStatus::kOk && !(e.result.step_time_s > 0)) {
        return InvalidArgument(where + ".step_time_s: must be positive for an ok trial");
      }
      if (entry.contains("ranks")) {
        if (!entry["ranks"].is_array()) return InvalidArgument(where + ".ranks: must be a list");
        int i = 0;
        for (const auto& r : entry["ranks"]) {
          search::RankResult rr;
          rr.rank = r.value("rank", i);
          rr.peak_allocated_bytes = r.value("peak_allocated_bytes", uint64_t{0});
          rr.peak_reserved_bytes = r.value("peak_reserved_bytes", rr.peak_allocated_bytes);
          rr.static_bytes = r.value("static_bytes", uint64_t{0});
          rr.alloc_retries = r.value("alloc_retries", uint64_t{0});
          rr.step_time_s = r.value("step_time_s", e.result.step_time_s);
          e.result.ranks.push_back(rr);
          ++i;
        }
      }
    } catch (const nlohmann::json::exception& ex) {
      return InvalidArgument(where + ": wrong type: " + ex.what());
    }
    if (!table.emplace(policy->ToString(), std::move(e)).second) {
      return InvalidArgument(where + ": the same policy appears twice");
    }
  }
  return table;
}

StatusOr<ReplayTable> LoadReplayTableFile(const std::string& path) {
  auto text = ReadFile(path, "replay table");
  if (!text.ok()) return text.status();
  auto table = ParseReplayTableJson(*text);
  if (!table.ok()) return search::InvalidArgument(path + ": " + table.status().message());
  return table;
}

}  // namespace remat::spec
