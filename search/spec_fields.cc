#include "search/spec_fields.h"

#include <cstdio>

namespace remat::search {

const char* Name(MegatronHome home) {
  switch (home) {
    case MegatronHome::kRemat: return "remat";
    case MegatronHome::kTransformerConfig: return "TransformerConfig";
    case MegatronHome::kGptModel: return "GPTModel";
    case MegatronHome::kDdpConfig: return "DistributedDataParallelConfig";
    case MegatronHome::kOptimizerConfig: return "OptimizerConfig";
    case MegatronHome::kTraining: return "training";
  }
  return "?";
}

namespace {
std::vector<std::string> SplitAlternatives(const char* text) {
  std::vector<std::string> keys;
  std::string key;
  for (const char* c = text; *c != '\0'; ++c) {
    if (*c == '|') {
      keys.push_back(key);
      key.clear();
    } else {
      key += *c;
    }
  }
  if (!key.empty()) keys.push_back(key);
  return keys;
}
}  // namespace

std::vector<std::string> FieldInfo::BridgeKeys() const { return SplitAlternatives(bridge); }
std::vector<std::string> FieldInfo::MegatronLmFlags() const {
  return SplitAlternatives(megatron_lm);
}

const std::vector<FieldInfo>& SpecFields() {
  static const std::vector<FieldInfo> kFields = {
#define REMAT_FIELD_INFO(section, type, name, default_value, number, required, home, bridge, lm, \
                         doc)                                                                    \
  {section, #name, number, required, MegatronHome::k##home, bridge, lm, doc, KindOf<type>()},
#define REMAT_MODEL(...) REMAT_FIELD_INFO("model", __VA_ARGS__)
#define REMAT_TRAIN(...) REMAT_FIELD_INFO("train", __VA_ARGS__)
#define REMAT_PARALLEL(...) REMAT_FIELD_INFO("parallel", __VA_ARGS__)
#define REMAT_SEARCH(...) REMAT_FIELD_INFO("search", __VA_ARGS__)
#include "search/spec_fields.def"
#undef REMAT_FIELD_INFO
  };
  return kFields;
}

const FieldInfo* FindField(const std::string& section, const std::string& name) {
  for (const FieldInfo& f : SpecFields()) {
    if (section == f.section && name == f.name) return &f;
  }
  return nullptr;
}

const FieldInfo* FindFieldByBridgeKey(const std::string& key) {
  for (const FieldInfo& f : SpecFields()) {
    for (const std::string& k : f.BridgeKeys()) {
      if (k == key) return &f;
    }
  }
  return nullptr;
}

namespace {
std::string Underscores(std::string s) {
  for (char& c : s) {
    if (c == '-') c = '_';
  }
  return s;
}
}  // namespace

const FieldInfo* FindFieldByMegatronLmFlag(const std::string& flag, bool* sets_false) {
  std::string want = Underscores(flag);
  while (!want.empty() && want[0] == '_') want.erase(0, 1);
  for (const FieldInfo& f : SpecFields()) {
    for (std::string lm : f.MegatronLmFlags()) {
      const bool inverted = !lm.empty() && lm[0] == '!';
      if (inverted) lm.erase(0, 1);
      lm = Underscores(lm);
      while (!lm.empty() && lm[0] == '_') lm.erase(0, 1);
      if (!lm.empty() && lm == want) {
        *sets_false = inverted;
        return &f;
      }
    }
  }
  return nullptr;
}

bool NullDiffersFromDefault(const FieldInfo& f) {
  static const std::vector<bool> kDiffers = [] {
    std::vector<bool> out;
    VisitFields(SearchSpec(), [&](const FieldInfo&, const auto& member) {
      using T = std::decay_t<decltype(member)>;
      if constexpr (IsOptional<T>::value) {
        out.push_back(member.has_value());
      } else {
        out.push_back(false);
      }
    });
    return out;
  }();
  return kDiffers[&f - SpecFields().data()];
}

std::string FormatValue(int v) { return std::to_string(v); }
std::string FormatValue(uint64_t v) { return std::to_string(v); }
std::string FormatValue(bool v) { return v ? "true" : "false"; }
std::string FormatValue(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.15g", v);
  return buf;
}
std::string FormatValue(const std::string& v) { return v.empty() ? "null" : v; }
std::string FormatValue(const MoeLayerFreq& v) {
  return v.pattern.empty() ? FormatValue(v.every) : FormatValue(v.pattern);
}

namespace {

// A table cell's text: a '|' would end the cell, so it is escaped (GitHub's Markdown reads "\|"
// as a bar, in code spans too).
std::string EscapeCell(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (c == '|') out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::string SpecFieldsMarkdown() {
  std::string out =
      "| field | default | values | Megatron | Megatron Bridge | Megatron-LM | notes |\n"
      "| --- | --- | --- | --- | --- | --- | --- |\n";
  const SearchSpec defaults;
  VisitFields(defaults, [&](const FieldInfo& f, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    const auto code = [](const std::string& s) { return s.empty() ? "" : "`" + s + "`"; };
    std::string bridge;
    for (const std::string& k : f.BridgeKeys()) bridge += (bridge.empty() ? "" : ", ") + code(k);
    std::string lm;
    for (const std::string& flag : f.MegatronLmFlags()) {
      lm += (lm.empty() ? "" : ", ") +
            (flag[0] == '!' ? code(flag.substr(1)) + " (sets false)" : code(flag));
    }
    out += "| `" + f.Path() + "` | " +
           (f.required ? "required" : code(EscapeCell(FormatValue(value)))) + " | " +
           EscapeCell(TypeDescription<T>()) + " | " +
           (f.home == MegatronHome::kRemat ? "" : Name(f.home)) + " | " + bridge + " | " + lm +
           " | " + EscapeCell(f.doc) + " |\n";
  });
  return out;
}

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string JsonValue(bool v) { return v ? "true" : "false"; }
std::string JsonValue(int v) { return std::to_string(v); }
std::string JsonValue(uint64_t v) { return std::to_string(v); }
std::string JsonValue(double v) { return FormatValue(v); }
std::string JsonValue(const std::string& v) { return JsonString(v); }
std::string JsonValue(const MoeLayerFreq& v) {
  if (v.pattern.empty()) return std::to_string(v.every);
  std::string out = "[";
  for (size_t i = 0; i < v.pattern.size(); ++i) out += (i ? ", " : "") + std::to_string(v.pattern[i]);
  return out + "]";
}
template <typename E, typename = std::enable_if_t<std::is_enum_v<E>>>
std::string JsonValue(E v) {
  return JsonString(Name(v));
}
template <typename T>
std::string JsonValue(const std::optional<T>& v) {
  return v ? JsonValue(*v) : "null";
}
template <typename T>
std::string JsonValue(const std::vector<T>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + JsonValue(v[i]);
  return out + "]";
}

}  // namespace

std::string SpecFieldsJson() {
  std::string out = "{\n";
  const SearchSpec defaults;
  bool first = true;
  VisitFields(defaults, [&](const FieldInfo& f, const auto& value) {
    out += std::string(first ? "" : ",\n") + JsonString(f.Path()) + ": {\"home\": " +
           JsonString(Name(f.home)) + ", \"default\": " + (f.required ? "null" : JsonValue(value)) +
           "}";
    first = false;
  });
  return out + "\n}\n";
}

}  // namespace remat::search
