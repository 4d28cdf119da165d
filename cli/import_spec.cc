#include "cli/import_spec.h"

#include <sstream>

#include "search/policy.h"
#include "search/spec.h"
#include "specfile/spec_file.h"

namespace remat::cli {
namespace {

constexpr const char* kSections[] = {"model", "train", "parallel", "search"};

// The search section's defaults, spelled out in the output (those that say something: not the
// empty strings and lists of options that only matter with another setting).
std::vector<std::pair<std::string, std::string>> SearchDefaults() {
  std::vector<std::pair<std::string, std::string>> out;
  search::VisitFields(search::SearchSpec(), [&](const search::FieldInfo& f, const auto& value) {
    const std::string text = search::FormatValue(value);
    if (std::string(f.section) == "search" && text != "null" && text != "[]" &&
        f.kind != search::FieldKind::kBool) {
      out.emplace_back(f.name, text);
    }
  });
  return out;
}

}  // namespace

void ImportedSpec::Set(const std::string& section, const std::string& key,
                       const std::string& yaml_value) {
  for (Field& f : fields_) {
    if (f.section == section && f.key == key) {
      f.value = yaml_value;
      return;
    }
  }
  fields_.push_back({section, key, yaml_value});
}

void ImportedSpec::SetField(const search::FieldInfo& f, const std::string& yaml_value) {
  if (yaml_value == "null" && !search::NullDiffersFromDefault(f)) return;
  Set(f.section, f.name, yaml_value);
}

bool ImportedSpec::Has(const std::string& section, const std::string& key) const {
  for (const Field& f : fields_) {
    if (f.section == section && f.key == key) return true;
  }
  return false;
}

std::string ImportedSpec::Render(const std::vector<Field>& fields,
                                 const std::vector<std::string>& notes) const {
  std::ostringstream out;
  out << "# " << origin_ << "\n";
  for (const std::string& n : notes) out << "# " << n << "\n";
  for (const Field& f : fields) {
    if (f.section.empty()) out << f.key << ": " << f.value << "\n";
  }
  for (const char* section : kSections) {
    std::vector<std::pair<std::string, std::string>> rows;
    for (const Field& f : fields) {
      if (f.section == section) rows.emplace_back(f.key, f.value);
    }
    if (std::string(section) == "search") {
      for (const auto& [key, value] : SearchDefaults()) {
        bool set = false;
        for (const auto& r : rows) set = set || r.first == key;
        if (!set) rows.emplace_back(key, value);
      }
    }
    if (rows.empty()) continue;
    out << section << ":\n";
    for (const auto& [key, value] : rows) out << "  " << key << ": " << value << "\n";
  }
  return out.str();
}

search::StatusOr<std::string> ImportedSpec::Finish() const {
  const std::string text = Render(fields_, notes_);
  auto parsed = spec::ParseSpecYaml(text);
  if (!parsed.ok()) return parsed.status();
  return text;
}

search::StatusOr<std::pair<std::string, std::string>> SplitOverride(const std::string& arg) {
  const size_t eq = arg.find('=');
  std::string key = arg.substr(0, eq);
  while (!key.empty() && key[0] == '+') key.erase(0, 1);
  if (eq == std::string::npos || key.empty()) {
    return search::InvalidArgument("override '" + arg + "': must be KEY=VALUE (e.g. "
                                   "model.tensor_model_parallel_size=4)");
  }
  return std::make_pair(key, arg.substr(eq + 1));
}

bool IsRematOnlyKey(const std::string& key) {
  return key.rfind("parallel.", 0) == 0 || key.rfind("search.", 0) == 0;
}

std::string PolicyOfRecomputeFields(const std::string& granularity, const std::string& method,
                                    const std::string& num_layers,
                                    const std::vector<std::string>& modules) {
  std::string text;
  if (granularity == "full") {
    text = "full:" + (method.empty() ? std::string("?") : method) + ":" +
           (num_layers.empty() ? std::string("?") : num_layers);
  } else if (granularity == "selective") {
    text = "selective:[";
    // Megatron Core's default list when recompute_modules is unset.
    const std::vector<std::string> labels = modules.empty() ? std::vector<std::string>{"core_attn"}
                                                            : modules;
    for (size_t i = 0; i < labels.size(); ++i) text += (i ? "," : "") + labels[i];
    text += "]";
  }
  // Canonical when it is a policy remat can write (labels in canonical order); as read otherwise.
  auto policy = search::ParsePolicy(text);
  return policy.ok() ? policy->ToString() : text;
}

std::string RematAttentionBackend(const std::string& megatron, std::string* why) {
  why->clear();
  if (megatron == "flash" || megatron == "unfused") return megatron;
  if (megatron == "local") {
    *why = "Megatron's local attention materialises the scores: remat's unfused";
    return "unfused";
  }
  if (megatron == "fused") {
    *why = "cuDNN fused attention keeps no score matrix, as flash: modelled as flash";
    return "flash";
  }
  if (megatron == "auto") {
    *why = "auto picks a fused kernel under Transformer Engine: modelled as flash; set "
           "model.attention_backend=unfused for the local implementation";
    return "flash";
  }
  return "";
}

}  // namespace remat::cli
