// The remat spec an importer assembles from someone else's configuration (a Megatron Bridge
// ConfigContainer, Megatron-LM arguments), and the one way it is written out.
//
// An importer fills the spec's fields by their remat names, with values as YAML text, and notes
// every input field it did not carry and why. Which Megatron Bridge key or Megatron-LM flag is
// which field is the spec's declaration's (search/spec_fields.h: FindFieldByBridgeKey,
// FindFieldByMegatronLmFlag); the importers hold only what is not a one-to-one mapping. Finish
// writes the YAML (the search section with its defaults spelled out, so the user sees what to
// change) with one comment line per note, and parses it back through the spec reader, so what is
// printed is a spec remat accepts. Thread-safety: plain values and pure functions.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "search/spec_fields.h"
#include "search/status.h"

namespace remat::cli {

class ImportedSpec {
 public:
  // `origin` is the first comment line (what was imported, from where).
  explicit ImportedSpec(std::string origin) : origin_(std::move(origin)) {}

  // Sets `section.key` ("model", "train", "parallel", "search"; "" for top-level `name`) to
  // `yaml_value` (a YAML scalar or flow value: "4096", "true", "RMSNorm", "[2, 4]"); a later
  // Set of the same key replaces the earlier value in place.
  void Set(const std::string& section, const std::string& key, const std::string& yaml_value);
  // Sets declared field `f` from a value of the input: null only where null means something
  // (search::NullDiffersFromDefault; elsewhere null is the default and is left out).
  void SetField(const search::FieldInfo& f, const std::string& yaml_value);
  bool Has(const std::string& section, const std::string& key) const;
  // One comment line in the output: "ignored: <field> (<why>)" and the like.
  void Note(const std::string& line) { notes_.push_back(line); }

  // The YAML spec, checked by parsing it back (spec::ParseSpecYaml). InvalidArgument naming the
  // field when the assembled spec does not describe a valid model (e.g. a required field the
  // input did not have).
  search::StatusOr<std::string> Finish() const;

 private:
  struct Field {
    std::string section, key, value;
  };
  std::string Render(const std::vector<Field>& fields, const std::vector<std::string>& notes) const;

  std::string origin_;
  std::vector<Field> fields_;
  std::vector<std::string> notes_;
};

// A "KEY=VALUE" override: the key (dots between levels, a leading '+' or '++' dropped) and the
// value text; InvalidArgument naming the argument when there is no '=' or no key.
search::StatusOr<std::pair<std::string, std::string>> SplitOverride(const std::string& arg);

// True for a key of remat's own spec that no Megatron Bridge configuration has (`parallel.*`,
// `search.*`): importers apply these to the output as they are.
bool IsRematOnlyKey(const std::string& key);

// The recompute policy string (search/policy.h) a configuration's own recompute fields describe,
// e.g. "full:uniform:1" or "selective:[core_attn]"; "" when they set none.
std::string PolicyOfRecomputeFields(const std::string& granularity, const std::string& method,
                                    const std::string& num_layers,
                                    const std::vector<std::string>& modules);

// Megatron Core's attention_backend (flash, fused, unfused, local, auto) as remat's: "flash"
// or "unfused"; sets *why to a note when the mapping is not one to one. "" for an unknown name.
std::string RematAttentionBackend(const std::string& megatron, std::string* why);

}  // namespace remat::cli
