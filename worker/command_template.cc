#include "worker/command_template.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <sstream>

#include "absl/status/status.h"
#include "common/read_file.h"

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
      "overrides",        "megatron_lm_flags", "metrics_file", "nproc",         "gpus",
      "policy",           "trial_id",          "warmup_steps", "measure_steps", "train_iters",
      "micro_batch_size", "seq_length"};
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

}  // namespace remat::worker
