// A recompute policy and its canonical string form (the contract's policy strings).
//
//   selective:[]                     no recompute (alias: none)
//   selective:[core_attn,moe_act]    recompute_granularity=selective, recompute_modules=[...]
//   full:uniform:2                   recompute_granularity=full, method uniform, num_layers 2
//   full:block:3                     recompute_granularity=full, method block, num_layers 3
//
// Labels are kept in the canonical order of Label's enumerators, whatever order was parsed.
// Thread-safety: plain values.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "search/status.h"

namespace remat::search {

// Megatron Core's recompute_modules labels, in canonical order.
enum class Label {
  kCoreAttn = 0,
  kMoeAct,
  kLayernorm,
  kMlaUpProj,
  kMlp,
  kMoe,
  kSharedExperts,
  kGdnNormOut,
};
inline constexpr int kNumLabels = 8;

const char* LabelName(Label label);                      // "core_attn"
std::optional<Label> ParseLabel(const std::string& s);   // nullopt for an unknown label
std::vector<Label> AllLabels();                           // canonical order

enum class Granularity { kSelective, kFull };
enum class RecomputeMethod { kUniform, kBlock };

struct Policy {
  Granularity granularity = Granularity::kSelective;
  std::vector<Label> labels;  // selective only; canonical order, no duplicates
  RecomputeMethod method = RecomputeMethod::kUniform;  // full only
  int num_layers = 0;                                  // full only

  static Policy None() { return Policy(); }
  static Policy Selective(std::vector<Label> labels);  // sorts and de-duplicates
  static Policy Full(RecomputeMethod method, int num_layers);

  bool IsNone() const { return granularity == Granularity::kSelective && labels.empty(); }
  bool IsFull() const { return granularity == Granularity::kFull; }
  bool Has(Label label) const;
  Policy With(Label label) const;     // selective: this policy plus `label`
  Policy Without(Label label) const;  // selective: this policy minus `label`

  // The canonical string ("selective:[core_attn]", "full:block:3").
  std::string ToString() const;

  // The settings that apply this policy to a configuration that may already set recompute
  // (checked in tests/search/apply_test.cc against search/rules.h's copy of the rules):
  // Megatron Bridge Hydra overrides, which set every recompute field and reset to null the ones
  // this policy does not use ("model.recompute_granularity=selective
  // model.recompute_method=null model.recompute_num_layers=null model.recompute_modules=[...]");
  std::string MegatronBridgeOverrides() const;
  // the Megatron-LM flags to add ("" for no recompute: no flag at all);
  std::string MegatronLmFlags() const;
  // and the Megatron-LM flags to remove from the command line first, with their values
  // (argparse keeps a repeated flag's last value, but a leftover --recompute-method under
  // selective is refused and --recompute-activations turns full into selective).
  std::string MegatronLmFlagsToRemove() const;

  friend bool operator==(const Policy& a, const Policy& b) { return a.ToString() == b.ToString(); }
  friend bool operator!=(const Policy& a, const Policy& b) { return !(a == b); }
  friend bool operator<(const Policy& a, const Policy& b) { return a.ToString() < b.ToString(); }
};

// Parses a policy string. Accepts "none", labels in any order and surrounding spaces; rejects
// unknown labels, duplicates, unknown granularities/methods and non-positive layer counts with
// an InvalidArgument that says what is wrong.
StatusOr<Policy> ParsePolicy(const std::string& text);

}  // namespace remat::search
