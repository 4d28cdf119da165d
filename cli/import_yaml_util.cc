#include "cli/import_yaml_util.h"

namespace remat::cli::yaml_util {

YAML::Node Child(const YAML::Node& node, const std::string& key) {
  if (!node || !node.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  const YAML::Node& n = node;
  return n[key];
}

YAML::Node Plain(const YAML::Node& node) {
  if (!node || !node.IsMap()) return node;
  const YAML::Node target = Child(node, "_target_");
  if (!target || !target.IsScalar()) return node;
  // A mapping with fields of its own is an object (MixedPrecisionConfig, ...), not a value.
  for (const auto& kv : node) {
    const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "";
    if (key != "_target_" && key != "_args_" && key != "_call_" && key != "_partial_" &&
        key != "_name_") {
      return node;
    }
  }
  const YAML::Node args = Child(node, "_args_");
  if (args && args.IsSequence() && args.size() > 0) return args[0];
  const std::string t = target.Scalar();
  const size_t dot = t.rfind('.');
  return YAML::Node(dot == std::string::npos ? t : t.substr(dot + 1));
}

std::string Flow(const YAML::Node& node) {
  if (!node || node.IsNull()) return "null";
  YAML::Emitter e;
  e << YAML::Flow << node;
  return e.c_str();
}

bool Neutral(const YAML::Node& node) {
  if (!node || node.IsNull()) return true;
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    return s == "false" || s == "False" || s == "null" || s == "None" || s == "~";
  }
  return node.size() == 0;
}

std::string Text(const YAML::Node& node) {
  return node && node.IsScalar() ? node.Scalar() : std::string();
}

}  // namespace remat::cli::yaml_util
