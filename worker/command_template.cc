#include "worker/command_template.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <sstream>

#include "absl/status/status.h"
#include "common/read_file.h"
#include "search/noise.h"
#include "search/proxy_driver.h"

namespace remat::worker {
namespace {

bool IsPlaceholderChar(char c) { return std::islower(static_cast<unsigned char>(c)) || c == '_'; }

// Calls `f(name, begin, end)` for each {name} (name of [a-z_]+, not preceded by '$').
template <typename F>
void ForEachPlaceholder(const std::string& s, F f) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '{' || (i > 0 && s[i - 1] == '$')) continue;
    size_t j = i + 1;
    while (j < s.size() && IsPlaceholderChar(s[j])) ++j;
    if (j < s.size() && s[j] == '}' && j > i + 1) {
      f(s.substr(i + 1, j - i - 1), i, j + 1);
      i = j;
    }
  }
}

bool Known(const std::string& name) {
  const auto& all = CommandPlaceholders();
  return std::find(all.begin(), all.end(), name) != all.end();
}

}  // namespace

const std::vector<std::string>& CommandPlaceholders() {
  static const std::vector<std::string> kAll = {
      "overrides", "megatron_lm_flags", "metrics_file", "nproc", "gpus", "policy", "trial_id",
      "warmup_steps", "measure_steps", "train_iters", "micro_batch_size", "global_batch_size",
      "seq_length",
      // Budget and depth: what a real job needs to run a trial as the builtin engine would.
      "memory_budget_bytes", "memory_budget_gib", "memory_fraction", "num_layers",
      "num_layers_overrides", "num_layers_flags"};
  return kAll;
}

absl::StatusOr<std::map<std::string, CommandTemplate>> ParseCommandTemplatesYaml(
    const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(std::string("command templates: not valid YAML: ") +
                                      e.what());
  }
  std::map<std::string, CommandTemplate> out;
  if (!root || root.IsNull()) return out;
  if (!root.IsMap()) {
    return absl::InvalidArgumentError("command templates: expected a map of name -> template");
  }
  for (const auto& item : root) {
    CommandTemplate t;
    t.name = item.first.as<std::string>();
    const YAML::Node& node = item.second;
    const std::string where = "command templates: " + t.name;
    try {
      if (node.IsScalar()) {
        t.command = node.as<std::string>();
      } else if (node.IsMap()) {
        for (const auto& kv : node) {
          const std::string key = kv.first.as<std::string>();
          if (key == "command") {
            t.command = kv.second.as<std::string>();
          } else if (key == "workdir") {
            t.workdir = kv.second.as<std::string>();
          } else if (key == "env") {
            if (!kv.second.IsMap()) {
              return absl::InvalidArgumentError(where + ".env: expected a map NAME: value");
            }
            for (const auto& e : kv.second) {
              t.env.emplace_back(e.first.as<std::string>(), e.second.as<std::string>());
            }
          } else {
            return absl::InvalidArgumentError(where + "." + key +
                                              ": unknown key (command, env, workdir)");
          }
        }
      } else {
        return absl::InvalidArgumentError(where + ": expected a command string or a map");
      }
    } catch (const YAML::Exception& e) {
      return absl::InvalidArgumentError(where + ": " + e.what());
    }
    if (t.command.empty()) return absl::InvalidArgumentError(where + ".command: must be set");
    std::string unknown;
    ForEachPlaceholder(t.command, [&](const std::string& name, size_t, size_t) {
      if (unknown.empty() && !Known(name)) unknown = name;
    });
    if (!unknown.empty()) {
      return absl::InvalidArgumentError(where + ".command: unknown placeholder {" + unknown + "}");
    }
    out[t.name] = t;
  }
  return out;
}

absl::StatusOr<std::map<std::string, CommandTemplate>> LoadCommandTemplatesFile(
    const std::string& path) {
  auto text = common::ReadFile(path);
  if (!text) return absl::InvalidArgumentError("--command-templates: cannot read " + path);
  return ParseCommandTemplatesYaml(*text);
}

std::string ShellQuote(const std::string& word) {
  std::string out = "'";
  for (char c : word) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string ShellQuoteWords(const std::string& words) {
  std::istringstream in(words);
  std::string word, out;
  while (in >> word) {
    if (!out.empty()) out += ' ';
    out += ShellQuote(word);
  }
  return out;
}

absl::StatusOr<std::string> ExpandCommand(const std::string& command,
                                          const std::map<std::string, std::string>& values) {
  std::string out;
  size_t last = 0;
  absl::Status status;
  ForEachPlaceholder(command, [&](const std::string& name, size_t begin, size_t end) {
    if (!status.ok()) return;
    auto it = values.find(name);
    if (!Known(name) || it == values.end()) {
      status = absl::InvalidArgumentError("command template: no value for {" + name + "}");
      return;
    }
    out += command.substr(last, begin - last);
    out += it->second;
    last = end;
  });
  if (!status.ok()) return status;
  out += command.substr(last);
  return out;
}

std::string ShortestDecimal(double v) {
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

std::map<std::string, std::string> CommandValues(const CommandRun& run) {
  const Assignment& a = *run.assignment;
  const search::SearchSpec& spec = *run.spec;
  const search::SearchOptions& so = spec.search;
  const int world = a.world_size;
  std::string gpus;
  uint64_t smallest_gpu = 0;
  for (int r = 0; r < world && r < static_cast<int>(run.slots.size()); ++r) {
    const Slot& slot = run.slots[r];
    gpus += (r ? "," : "") + std::to_string(slot.index);
    if (slot.gpu && slot.memory_bytes > 0) {
      smallest_gpu = smallest_gpu ? std::min(smallest_gpu, slot.memory_bytes) : slot.memory_bytes;
    }
  }
  const bool capped = search::MemoryCapped(spec);
  const uint64_t budget = capped ? so.MemoryBudgetBytes() : 0;
  // The fraction caps what each rank's allocator may hold; the smallest GPU bounds a trial whose
  // slots differ (a cap over the device's memory is no cap: 1).
  const double fraction =
      budget > 0 && smallest_gpu > 0
          ? std::min(1.0, static_cast<double>(budget) / static_cast<double>(smallest_gpu))
          : 1.0;
  const int layers = spec.model.num_layers;
  std::string pattern;  // an explicit MoE pattern has one entry per layer: it is cut with them
  for (size_t i = 0; i < spec.model.moe_layer_freq.pattern.size(); ++i) {
    pattern += (i ? "," : "") + std::to_string(spec.model.moe_layer_freq.pattern[i]);
  }
  std::string depth_overrides = "model.num_layers=" + std::to_string(layers);
  std::string depth_flags = "--num-layers " + std::to_string(layers);
  if (!pattern.empty()) {
    depth_overrides += " model.moe_layer_freq=[" + pattern + "]";
    depth_flags += " --moe-layer-freq [" + pattern + "]";
  }
  return {
      {"overrides", ShellQuoteWords(a.policy.MegatronBridgeOverrides())},
      {"megatron_lm_flags", ShellQuoteWords(a.policy.MegatronLmFlags())},
      {"metrics_file", ShellQuote(run.metrics_path)},
      {"nproc", std::to_string(world)},
      {"gpus", gpus},
      {"policy", ShellQuote(a.policy_name)},
      {"trial_id", ShellQuote(a.trial_id)},
      {"warmup_steps", std::to_string(so.warmup_steps)},
      {"measure_steps", std::to_string(so.measure_steps)},
      // Room for the longest warm-up the steady-state rule may take (search/steady_state.h) and
      // the most steps the adaptive measurement may take (search/noise.h).
      {"train_iters", std::to_string(std::max(so.warmup_steps, so.warmup_max_steps) +
                                     search::MeasureStepCap(so))},
      {"micro_batch_size", std::to_string(spec.train.micro_batch_size)},
      // The worker's tokens/s count the spec's global batch: the job must run that one.
      {"global_batch_size", std::to_string(spec.EffectiveGlobalBatchSize())},
      {"seq_length", std::to_string(spec.model.seq_length)},
      {"memory_budget_bytes", std::to_string(budget)},
      {"memory_budget_gib", capped ? ShortestDecimal(so.memory_budget_gib) : "0"},
      {"memory_fraction", ShortestDecimal(fraction)},
      {"num_layers", std::to_string(layers)},
      {"num_layers_overrides", ShellQuoteWords(depth_overrides)},
      {"num_layers_flags", ShellQuoteWords(depth_flags)},
  };
}

}  // namespace remat::worker
