// The spec's fields as data: what each field of search/spec_fields.def is, and a way to visit
// every field of a SearchSpec with its description.
//
// Everything that treats fields alike is written once against this: the YAML reader
// (specfile/), the protobuf conversion (proto/convert.cc), the generated spec messages
// (proto/spec_proto_main.cc), the importers' mapping of Megatron Bridge keys and Megatron-LM flags
// (cli/import_*), and the reference table (docs/spec.md, `remat fields`). Code that gives a field
// a meaning (validation, the memory model, the engine) uses the struct members directly.
// Thread-safety: immutable data and pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "search/spec.h"

namespace remat::search {

// Where Megatron keeps a field.
enum class MegatronHome {
  kRemat,              // remat's own (search options, the data-parallel size, the precision)
  kTransformerConfig,  // TransformerConfig / MLATransformerConfig (Bridge: the model provider)
  kGptModel,           // GPTModel's arguments (Bridge: the model provider)
  kDdpConfig,          // DistributedDataParallelConfig (Bridge: ddp.)
  kOptimizerConfig,    // OptimizerConfig (Bridge: optimizer.)
  kTraining,           // the training loop's arguments (Bridge: train., rng.)
};
const char* Name(MegatronHome home);

// What kind of value a field holds, whatever its C++ type.
enum class FieldKind { kBool, kInteger, kNumber, kString, kEnum, kList, kLayerFreq };

// Type traits for the member types a field may have.
template <typename T>
struct IsOptional : std::false_type {};
template <typename T>
struct IsOptional<std::optional<T>> : std::true_type {
  using Value = T;
};
template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {
  using Value = T;
};

template <typename T>
constexpr FieldKind KindOf() {
  if constexpr (IsOptional<T>::value) {
    return KindOf<typename IsOptional<T>::Value>();
  } else if constexpr (IsVector<T>::value) {
    return FieldKind::kList;
  } else if constexpr (std::is_same_v<T, bool>) {
    return FieldKind::kBool;
  } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
    return FieldKind::kInteger;
  } else if constexpr (std::is_same_v<T, double>) {
    return FieldKind::kNumber;
  } else if constexpr (std::is_same_v<T, std::string>) {
    return FieldKind::kString;
  } else if constexpr (std::is_same_v<T, MoeLayerFreq>) {
    return FieldKind::kLayerFreq;
  } else {
    static_assert(std::is_enum_v<T>, "a spec field of a type spec_fields.h does not know");
    return FieldKind::kEnum;
  }
}

// One declared field (search/spec_fields.def explains each member).
struct FieldInfo {
  const char* section;  // "model", "train", "parallel" or "search"
  const char* name;
  int proto_number;
  bool required;
  MegatronHome home;
  const char* bridge;       // Megatron Bridge keys, '|' between alternatives; "" none
  const char* megatron_lm;  // "--flag", "!--flag" (a switch that sets false), '|' between; or ""
  const char* doc;
  FieldKind kind;

  std::string Path() const { return std::string(section) + "." + name; }
  // The Megatron Bridge keys, split at '|'.
  std::vector<std::string> BridgeKeys() const;
  // The Megatron-LM flags, split at '|' (each "--flag" or "!--flag").
  std::vector<std::string> MegatronLmFlags() const;
};

// Every field, in declaration order (the sections in the order model, train, parallel, search).
const std::vector<FieldInfo>& SpecFields();
// The field `section.name`, or null.
const FieldInfo* FindField(const std::string& section, const std::string& name);
// The field read from Megatron Bridge key `key` ("ddp.overlap_grad_reduce"), or null.
const FieldInfo* FindFieldByBridgeKey(const std::string& key);
// The field set by Megatron-LM flag `flag` ("--overlap-grad-reduce" or "overlap_grad_reduce",
// dashes and underscores alike), or null; *sets_false is true for a "!--flag" switch.
const FieldInfo* FindFieldByMegatronLmFlag(const std::string& flag, bool* sets_false);

// Whether null means something for field `f` other than its default: an optional whose default
// is not null (MLA's q_lora_rank, 512; null is no q compression). For every other field null is
// the default. The protobuf conversion writes such a null as 0; the importers carry it.
bool NullDiffersFromDefault(const FieldInfo& f);

// Calls visit(const FieldInfo&, member) for every field of `spec`, in SpecFields() order; the
// member is a reference to the field's value in `spec` (const when `spec` is). `visit` is
// typically a generic lambda that dispatches on the member's type with the traits below.
template <typename Spec, typename Visit>
void VisitFields(Spec&& spec, Visit&& visit) {
  static_assert(std::is_same_v<std::decay_t<Spec>, SearchSpec>);
  const FieldInfo* info = SpecFields().data();
#define REMAT_MODEL(type, name, ...) visit(*info++, spec.model.name);
#define REMAT_TRAIN(type, name, ...) visit(*info++, spec.train.name);
#define REMAT_PARALLEL(type, name, ...) visit(*info++, spec.parallel.name);
#define REMAT_SEARCH(type, name, ...) visit(*info++, spec.search.name);
#include "search/spec_fields.def"
}

// A value as the spec's YAML writes it: 4096, true, 0.1, RMSNorm, [2, 4], null. Strings are
// written plain; callers that emit YAML quote them where YAML would read them otherwise.
std::string FormatValue(int v);
std::string FormatValue(uint64_t v);
std::string FormatValue(bool v);
std::string FormatValue(double v);
std::string FormatValue(const std::string& v);
std::string FormatValue(const MoeLayerFreq& v);
template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>>
std::string FormatValue(E v) {
  return Name(v);
}
template <typename T>
std::string FormatValue(const std::optional<T>& v) {
  return v ? FormatValue(*v) : "null";
}
template <typename T>
std::string FormatValue(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + FormatValue(v[i]);
  return out + "]";
}

// What values a member of type T takes, for the reference table ("integer", "true or false",
// "LayerNorm | RMSNorm", "list of integers").
template <typename T>
std::string TypeDescription() {
  if constexpr (IsOptional<T>::value) {
    return TypeDescription<typename IsOptional<T>::Value>();
  } else if constexpr (IsVector<T>::value) {
    return "list of " + TypeDescription<typename IsVector<T>::Value>() + "s";
  } else if constexpr (std::is_same_v<T, bool>) {
    return "true or false";
  } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, uint64_t>) {
    return "integer";
  } else if constexpr (std::is_same_v<T, double>) {
    return "number";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return "string";
  } else if constexpr (std::is_same_v<T, MoeLayerFreq>) {
    return "integer or list of 0/1";
  } else {
    std::string out;
    for (const std::string& n : EnumNames<T>()) out += (out.empty() ? "" : " | ") + n;
    return out;
  }
}

// The reference table of every field (Markdown: field, default, values, Megatron home and
// Bridge / Megatron-LM names, doc), as docs/spec.md holds it.
std::string SpecFieldsMarkdown();

// Every field's Megatron home and default as JSON, one line per field:
//   {"model.num_layers": {"home": "TransformerConfig", "default": null}, ...}
// (a required field's default is null; enums by their names, as the spec and the protobuf JSON
// write them). The megatron backend's driver reads this (worker/megatron_driver/
// declared_fields.json, a copy checked by a test) to pass every TransformerConfig field the spec
// sets away from its default, so a field declared here reaches Megatron Core without a second
// list in the driver.
std::string SpecFieldsJson();

}  // namespace remat::search
