// yaml-cpp helpers the importers share: reading values as Megatron Bridge writes them and writing
// them back as YAML flow text. Thread-safety: pure functions.
#pragma once

#include <yaml-cpp/yaml.h>

#include <string>

namespace remat::cli::yaml_util {

// The child `key` of a mapping, or an undefined node (never inserts).
YAML::Node Child(const YAML::Node& node, const std::string& key);
// A value as Bridge writes it, made plain: a `{_target_: X, _args_: [A, ...]}` mapping (enums)
// becomes A, a `{_target_: a.b.c}` mapping without arguments (dtypes, functions) becomes the
// scalar "c"; anything else (an object with fields of its own, such as a MixedPrecisionConfig) is
// returned as is.
YAML::Node Plain(const YAML::Node& node);
// YAML flow text of a node ("4096", "true", "[0, 1]", "'a: b'"); "null" for an undefined node.
std::string Flow(const YAML::Node& node);
// Null, undefined, false, or an empty sequence or mapping: a field left at its neutral default.
bool Neutral(const YAML::Node& node);
// The scalar text of a node, or "" when it is not a scalar.
std::string Text(const YAML::Node& node);

}  // namespace remat::cli::yaml_util
