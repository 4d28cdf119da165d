#include "specfile/spec_file.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <vector>

#include "common/read_file.h"
#include "search/limits.h"
#include "search/policy.h"
#include "search/spec_fields.h"
#include "search/text.h"

namespace remat::spec {
namespace {

using search::InvalidArgument;
using search::Status;
using search::StatusOr;
namespace limits = search::limits;

std::string Quote(const std::string& value) {
  return search::QuoteForError(value, limits::kMaxQuotedValueBytes);
}

// `path.key` for messages: the key as it is when it is a short plain name, quoted otherwise (a
// key is user text: it may hold a newline or be long).
std::string KeyPath(const std::string& path, const std::string& key) {
  bool plain = !key.empty() && key.size() <= limits::kMaxQuotedValueBytes;
  for (char c : key) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F || c == '"' || c == '\\') plain = false;
  }
  const std::string shown = plain ? key : Quote(key);
  return path.empty() ? shown : path + "." + shown;
}

// What the spec's reader needs of the YAML tree before any field is read, since yaml-cpp accepts
// it: keys are plain strings and appear once per mapping (yaml-cpp keeps both and `node[key]`
// would see only the first), every scalar is UTF-8 of bounded length, nesting is shallow and the
// tree is small once aliases are expanded (an alias bomb is a few lines of text).
class TreeCheck {
 public:
  // The path of each node is kept as parts and spelled out only for an error: a spec is checked
  // on every read (and by the fuzzer millions of times), and building a string per node was most
  // of the check's cost.
  Status Check(const YAML::Node& node, int depth) {
    if (++nodes_ > limits::kMaxYamlNodes) {
      return InvalidArgument("spec: more than " + std::to_string(limits::kMaxYamlNodes) +
                             " values (aliases that expand?)");
    }
    if (depth > limits::kMaxYamlDepth) return InvalidArgument(Where() + ": nested too deeply");
    switch (node.Type()) {
      case YAML::NodeType::Scalar: {
        const std::string& v = node.Scalar();
        if (!search::IsValidUtf8(v)) return InvalidArgument(Where() + ": not valid UTF-8");
        if (v.size() > limits::kMaxStringValueBytes) {
          return InvalidArgument(Where() + ": a value longer than " +
                                 std::to_string(limits::kMaxStringValueBytes) + " bytes");
        }
        return search::OkStatus();
      }
      case YAML::NodeType::Sequence:
        for (size_t i = 0; i < node.size(); ++i) {
          parts_.push_back({nullptr, i});
          Status st = Check(node[i], depth + 1);
          parts_.pop_back();
          if (!st.ok()) return st;
        }
        return search::OkStatus();
      case YAML::NodeType::Map: {
        std::set<std::string_view> keys;
        for (const auto& kv : node) {
          if (!kv.first.IsScalar()) {
            return InvalidArgument(Where() + ": a key must be a plain string, got a " +
                                   (kv.first.IsSequence() ? "list" : "mapping"));
          }
          const std::string& key = kv.first.Scalar();  // owned by the tree, which outlives this
          if (!search::IsValidUtf8(key) || key.size() > limits::kMaxNameBytes) {
            return InvalidArgument(Where() + ": a key must be UTF-8 of at most " +
                                   std::to_string(limits::kMaxNameBytes) + " bytes, got " +
                                   Quote(key));
          }
          if (!keys.insert(key).second) {
            return InvalidArgument(KeyPath(Path(), key) + ": duplicate key");
          }
          parts_.push_back({&key, 0});
          Status st = Check(kv.second, depth + 1);
          parts_.pop_back();
          if (!st.ok()) return st;
        }
        return search::OkStatus();
      }
      default:
        return search::OkStatus();
    }
  }

 private:
  struct Part {
    const std::string* key;  // null: a list index
    size_t index;
  };

  // `model.num_layers`, `search.proxy_layers[1]` ("" at the top).
  std::string Path() const {
    std::string path;
    for (const Part& p : parts_) {
      path = p.key != nullptr ? KeyPath(path, *p.key) : path + "[" + std::to_string(p.index) + "]";
    }
    return path;
  }
  std::string Where() const {
    std::string path = Path();
    return path.empty() ? "spec" : path;
  }

  size_t nodes_ = 0;
  std::vector<Part> parts_;
};

// YAML text is UTF-8 unless a byte-order mark says UTF-16 or UTF-32 (which yaml-cpp reads).
Status CheckEncoding(const std::string& text) {
  const auto starts = [&](std::string_view bom) { return text.compare(0, bom.size(), bom) == 0; };
  using namespace std::literals;
  if (starts("\xFF\xFE"sv) || starts("\xFE\xFF"sv) || starts("\0\0\xFE\xFF"sv)) {
    return search::OkStatus();
  }
  if (search::IsValidUtf8(text)) return search::OkStatus();
  // Where: the first line that is not valid UTF-8.
  size_t line_start = 0;
  int line = 1;
  for (size_t i = 0; i <= text.size(); ++i) {
    if (i == text.size() || text[i] == '\n') {
      if (!search::IsValidUtf8(std::string_view(text).substr(line_start, i - line_start))) break;
      line_start = i + 1;
      ++line;
    }
  }
  return InvalidArgument("spec: not valid UTF-8 at line " + std::to_string(line) +
                         " (save the file as UTF-8)");
}

// Reads the keys of one YAML mapping, remembering which were consumed so that unknown keys can
// be refused by name. Type errors name the full key path.
class Section {
 public:
  // Indexes the mapping's keys once (TreeCheck made them unique scalars): yaml-cpp looks a key
  // up by converting every key of the mapping to a string and comparing, and a non-const lookup
  // of an absent key adds a node to the mapping; a section asks for ~60 keys.
  Section(const YAML::Node& node, std::string path) : node_(node), path_(std::move(path)) {
    if (!node_ || !node_.IsMap()) return;
    for (const auto& kv : node_) {
      if (kv.first.IsScalar()) index_.emplace(kv.first.Scalar(), Field{kv.second, false});
    }
  }

  Status CheckIsMap() const {
    if (node_ && !node_.IsNull() && !node_.IsMap()) {
      return InvalidArgument(path_ + ": must be a mapping of keys to values");
    }
    return search::OkStatus();
  }

  std::string Key(const std::string& key) const { return KeyPath(path_, key); }

  // The node for `key`, or an undefined/null node when absent.
  YAML::Node Get(const std::string& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return absent_;
    it->second.seen = true;
    return it->second.node;
  }

  Status String(const std::string& key, std::string* out) {
    YAML::Node n = Get(key);
    if (!n || n.IsNull()) return search::OkStatus();
    if (!n.IsScalar()) return InvalidArgument(Key(key) + ": must be a string");
    *out = n.Scalar();
    return search::OkStatus();
  }

  // Refuses keys that were never asked for.
  Status RejectUnknown() const {
    if (!node_ || !node_.IsMap()) return search::OkStatus();
    for (const auto& kv : node_) {
      // Keys are scalars: TreeCheck ran first.
      const std::string& key = kv.first.Scalar();
      auto it = index_.find(key);
      if (it == index_.end() || !it->second.seen) return InvalidArgument(Key(key) + ": unknown key");
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
      return InvalidArgument(field + ": must be an integer, got " + Quote(s));
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
  struct Field {
    YAML::Node node;
    bool seen;  // asked for: RejectUnknown refuses the keys nobody asked for
  };
  std::map<std::string, Field, std::less<>> index_;
  YAML::Node absent_{YAML::NodeType::Undefined};  // what Get returns for a key not there
};

// Reads one field's value from its YAML node (present and not null) by the member's type.
template <typename T>
Status ReadValue(const YAML::Node& n, const std::string& field, T* out) {
  if constexpr (search::IsOptional<T>::value) {
    typename search::IsOptional<T>::Value v{};
    REMAT_SEARCH_RETURN_IF_ERROR(ReadValue(n, field, &v));
    *out = std::move(v);
    return search::OkStatus();
  } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
    out->clear();
    if (n.IsScalar()) {  // one item, as Megatron also accepts
      out->push_back(n.Scalar());
      return search::OkStatus();
    }
    if (!n.IsSequence()) return InvalidArgument(field + ": must be a list of strings");
    for (size_t i = 0; i < n.size(); ++i) {
      if (!n[i].IsScalar()) {
        return InvalidArgument(field + "[" + std::to_string(i) + "]: must be a string");
      }
      out->push_back(n[i].Scalar());
    }
    return search::OkStatus();
  } else if constexpr (search::IsVector<T>::value) {
    out->clear();
    if (!n.IsSequence()) return InvalidArgument(field + ": must be a list of integers, e.g. [2, 4]");
    for (size_t i = 0; i < n.size(); ++i) {
      typename search::IsVector<T>::Value v{};
      REMAT_SEARCH_RETURN_IF_ERROR(ReadValue(n[i], field + "[" + std::to_string(i) + "]", &v));
      out->push_back(v);
    }
    return search::OkStatus();
  } else if constexpr (std::is_same_v<T, search::MoeLayerFreq>) {
    if (n.IsSequence()) {
      out->every = 1;
      return ReadValue(n, field, &out->pattern);
    }
    if (!n.IsScalar()) return InvalidArgument(field + ": must be an integer or a list");
    // An integer, or Megatron's expression ("([0]*3+[1]*58)") as recipes write it.
    auto freq = search::ParseMoeLayerFreq(n.Scalar(), field);
    if (!freq.ok()) return freq.status();
    *out = *freq;
    return search::OkStatus();
  } else if constexpr (std::is_same_v<T, int>) {
    return Section::ParseInt(n, field, out);
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    if (!n.IsScalar()) return InvalidArgument(field + ": must be a non-negative integer");
    try {
      *out = n.as<uint64_t>();
    } catch (const YAML::Exception&) {
      return InvalidArgument(field + ": must be a non-negative integer, got " + Quote(n.Scalar()));
    }
    return search::OkStatus();
  } else if constexpr (std::is_same_v<T, double>) {
    if (!n.IsScalar()) return InvalidArgument(field + ": must be a number");
    try {
      double v = n.as<double>();
      if (!std::isfinite(v)) throw YAML::Exception(YAML::Mark(), "not finite");
      *out = v;
    } catch (const YAML::Exception&) {
      return InvalidArgument(field + ": must be a number, got " + Quote(n.Scalar()));
    }
    return search::OkStatus();
  } else if constexpr (std::is_same_v<T, bool>) {
    const std::string s = n.IsScalar() ? n.Scalar() : "";
    if (s == "true" || s == "True" || s == "TRUE") {
      *out = true;
    } else if (s == "false" || s == "False" || s == "FALSE") {
      *out = false;
    } else {
      return InvalidArgument(field + ": must be true or false, got " + Quote(s));
    }
    return search::OkStatus();
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (!n.IsScalar()) return InvalidArgument(field + ": must be a string");
    *out = n.Scalar();
    return search::OkStatus();
  } else {
    static_assert(std::is_enum_v<T>, "a spec field of a type the reader does not know");
    std::string allowed;
    for (const std::string& name : search::EnumNames<T>()) {
      allowed += (allowed.empty() ? "" : ", ") + name;
    }
    if (!n.IsScalar()) return InvalidArgument(field + ": must be one of " + allowed);
    auto v = search::ParseEnum<T>(n.Scalar());
    if (!v) {
      return InvalidArgument(field + ": must be one of " + allowed + ", got " + Quote(n.Scalar()));
    }
    *out = *v;
    return search::OkStatus();
  }
}

// Reads every declared field of `section` (search/spec_fields.def) from its mapping: required
// fields first, then each present field by its type; null keeps the default, except for a field
// whose null means something (an optional: MLA's q_lora_rank null is no q compression); then
// refuses the keys no field claimed.
Status ReadSection(Section& s, const char* section, search::SearchSpec* spec) {
  REMAT_SEARCH_RETURN_IF_ERROR(s.CheckIsMap());
  for (const search::FieldInfo& f : search::SpecFields()) {
    if (f.required && std::string(f.section) == section) {
      YAML::Node n = s.Get(f.name);
      if (!n || n.IsNull()) return InvalidArgument(s.Key(f.name) + ": required");
    }
  }
  Status status;
  search::VisitFields(*spec, [&](const search::FieldInfo& f, auto& member) {
    if (!status.ok() || std::string(f.section) != section) return;
    YAML::Node n = s.Get(f.name);
    if (!n) return;
    if (n.IsNull()) {
      using T = std::decay_t<decltype(member)>;
      if constexpr (search::IsOptional<T>::value) member.reset();
      return;
    }
    status = ReadValue(n, s.Key(f.name), &member);
  });
  REMAT_SEARCH_RETURN_IF_ERROR(status);
  return s.RejectUnknown();
}

// An exception's text for an error line: valid UTF-8, no line breaks, cut.
std::string OneLine(const std::string& text) {
  std::string out = search::BoundedUtf8(text, 256);
  for (char& c : out) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return out;
}

StatusOr<search::SearchSpec> ReadSpec(const YAML::Node& root);

StatusOr<std::string> ReadFile(const std::string& path, const char* what, size_t max_bytes) {
  common::FileText file = common::ReadRegularFile(path, max_bytes);
  if (!file.text) {
    return InvalidArgument(std::string(what) + " " + search::QuoteForError(path, 256) + ": " +
                           file.error);
  }
  return std::move(*file.text);
}

// The fields of a replay entry, each checked for its type and range by name (a negative peak
// must not read as 18446744073709551615).
Status Bytes(const nlohmann::json& obj, const char* key, const std::string& where, uint64_t* out) {
  if (!obj.contains(key) || obj[key].is_null()) return search::OkStatus();
  if (!obj[key].is_number_unsigned()) {
    return InvalidArgument(where + "." + key + ": must be a non-negative integer");
  }
  *out = obj[key].get<uint64_t>();
  return search::OkStatus();
}

Status Seconds(const nlohmann::json& obj, const char* key, const std::string& where, double* out) {
  if (!obj.contains(key) || obj[key].is_null()) return search::OkStatus();
  const double v = obj[key].is_number() ? obj[key].get<double>() : -1;
  if (!(v >= 0) || !std::isfinite(v)) {
    return InvalidArgument(where + "." + key + ": must be a non-negative number");
  }
  *out = v;
  return search::OkStatus();
}

Status Number(const nlohmann::json& obj, const char* key, const std::string& where, double* out) {
  if (!obj.contains(key) || obj[key].is_null()) return search::OkStatus();
  if (!obj[key].is_number()) return InvalidArgument(where + "." + key + ": must be a number");
  *out = obj[key].get<double>();
  return search::OkStatus();
}

Status ReadReplayEntry(const nlohmann::json& entry, const std::string& where, ReplayEntry* e) {
  std::string status_name = "ok";
  if (entry.contains("status")) {
    if (!entry["status"].is_string()) return InvalidArgument(where + ".status: must be a string");
    status_name = entry["status"].get<std::string>();
  }
  auto status = search::ParseTrialStatus(status_name);
  if (!status) {
    return InvalidArgument(where + ".status: unknown trial status " + Quote(status_name) +
                           " (ok, oom, failed, timeout, invalid or cancelled)");
  }
  e->result.status = *status;
  REMAT_SEARCH_RETURN_IF_ERROR(Seconds(entry, "step_time_s", where, &e->result.step_time_s));
  REMAT_SEARCH_RETURN_IF_ERROR(Seconds(entry, "tokens_per_s", where, &e->result.tokens_per_s));
  REMAT_SEARCH_RETURN_IF_ERROR(
      Seconds(entry, "step_time_spread_s", where, &e->result.step_time_spread_s));
  REMAT_SEARCH_RETURN_IF_ERROR(Seconds(entry, "wall_s", where, &e->wall_s));
  REMAT_SEARCH_RETURN_IF_ERROR(Number(entry, "loss", where, &e->result.loss));
  REMAT_SEARCH_RETURN_IF_ERROR(Number(entry, "grad_norm", where, &e->result.grad_norm));
  if (entry.contains("message")) {
    if (!entry["message"].is_string()) return InvalidArgument(where + ".message: must be a string");
    e->result.message = search::BoundedUtf8(entry["message"].get<std::string>(),
                                            limits::kMaxTrialMessageBytes);
  }
  if (e->result.status == search::TrialStatus::kOk && !(e->result.step_time_s > 0)) {
    return InvalidArgument(where + ".step_time_s: must be positive for an ok trial");
  }
  if (!entry.contains("ranks")) return search::OkStatus();
  const nlohmann::json& ranks = entry["ranks"];
  if (!ranks.is_array()) return InvalidArgument(where + ".ranks: must be a list");
  if (ranks.size() > static_cast<size_t>(limits::kMaxWorldSize)) {
    return InvalidArgument(where + ".ranks: more than " + std::to_string(limits::kMaxWorldSize));
  }
  for (size_t i = 0; i < ranks.size(); ++i) {
    const nlohmann::json& r = ranks[i];
    const std::string at = where + ".ranks[" + std::to_string(i) + "]";
    if (!r.is_object()) return InvalidArgument(at + ": must be an object");
    search::RankResult rr;
    uint64_t rank = i;
    REMAT_SEARCH_RETURN_IF_ERROR(Bytes(r, "rank", at, &rank));
    if (rank >= static_cast<uint64_t>(limits::kMaxWorldSize)) {
      return InvalidArgument(at + ".rank: above remat's limit of " +
                             std::to_string(limits::kMaxWorldSize));
    }
    rr.rank = static_cast<int>(rank);
    REMAT_SEARCH_RETURN_IF_ERROR(Bytes(r, "peak_allocated_bytes", at, &rr.peak_allocated_bytes));
    rr.peak_reserved_bytes = rr.peak_allocated_bytes;
    REMAT_SEARCH_RETURN_IF_ERROR(Bytes(r, "peak_reserved_bytes", at, &rr.peak_reserved_bytes));
    REMAT_SEARCH_RETURN_IF_ERROR(Bytes(r, "static_bytes", at, &rr.static_bytes));
    REMAT_SEARCH_RETURN_IF_ERROR(Bytes(r, "alloc_retries", at, &rr.alloc_retries));
    rr.step_time_s = e->result.step_time_s;
    REMAT_SEARCH_RETURN_IF_ERROR(Seconds(r, "step_time_s", at, &rr.step_time_s));
    // Each measured step, when the table keeps them: the replayed trial's median interval
    // (search/noise.h) comes from them.
    if (r.contains("step_times_s") && !r["step_times_s"].is_null()) {
      const nlohmann::json& steps = r["step_times_s"];
      if (!steps.is_array() || steps.size() > static_cast<size_t>(limits::kMaxSteps)) {
        return InvalidArgument(at + ".step_times_s: must be a list of at most " +
                               std::to_string(limits::kMaxSteps) + " step times");
      }
      for (const nlohmann::json& t : steps) {
        const double v = t.is_number() ? t.get<double>() : -1;
        if (!(v > 0) || !std::isfinite(v)) {
          return InvalidArgument(at + ".step_times_s: each must be a positive number of seconds");
        }
        rr.step_times_s.push_back(v);
      }
    }
    e->result.ranks.push_back(rr);
  }
  return search::OkStatus();
}

}  // namespace

StatusOr<search::SearchSpec> ParseSpecYaml(const std::string& yaml_text) {
  REMAT_SEARCH_RETURN_IF_ERROR(CheckEncoding(yaml_text));
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return InvalidArgument("spec: not valid YAML: " + OneLine(e.what()));
  }
  if (!root || !root.IsMap()) return InvalidArgument("spec: must be a YAML mapping");
  REMAT_SEARCH_RETURN_IF_ERROR(TreeCheck().Check(root, 0));
  // Whatever the tree check missed, a conversion that throws is bad input, not a crash.
  try {
    return ReadSpec(root);
  } catch (const std::exception& e) {
    return InvalidArgument("spec: " + OneLine(e.what()));
  }
}

namespace {
StatusOr<search::SearchSpec> ReadSpec(const YAML::Node& root) {
  search::SearchSpec spec;
  Section top(root, "");
  REMAT_SEARCH_RETURN_IF_ERROR(top.String("name", &spec.name));
  YAML::Node model = top.Get("model");
  if (!model || model.IsNull()) return InvalidArgument("model: required");
  for (const char* section : {"model", "train", "parallel", "search"}) {
    Section s(top.Get(section), section);
    REMAT_SEARCH_RETURN_IF_ERROR(ReadSection(s, section, &spec));
  }
  {
    // Megatron's attention_backend auto (also when absent) depends on the layer implementation.
    const YAML::Node& model_map = model;
    const YAML::Node backend = model_map["attention_backend"];
    if (!backend || backend.IsNull() || (backend.IsScalar() && backend.Scalar() == "auto")) {
      spec.model.attention_backend = search::AutoAttentionBackend(spec.model.transformer_impl);
    }
  }
  REMAT_SEARCH_RETURN_IF_ERROR(top.RejectUnknown());
  REMAT_SEARCH_RETURN_IF_ERROR(search::ValidateSpec(spec));
  return spec;
}
}  // namespace

StatusOr<search::SearchSpec> LoadSpecFile(const std::string& path) {
  auto text = ReadFile(path, "spec", limits::kMaxSpecFileBytes);
  if (!text.ok()) return text.status();
  auto spec = ParseSpecYaml(*text);
  if (!spec.ok()) return spec;
  auto& table = spec->search.replay_table;
  if (!table.empty() && std::filesystem::path(table).is_relative()) {
    table = (std::filesystem::path(path).parent_path() / table).lexically_normal().string();
  }
  if (spec->name.empty()) {
    // A file name is any bytes: the name goes into protobuf and JSON, which need UTF-8.
    spec->name = search::BoundedUtf8(std::filesystem::path(path).stem().string(),
                                     limits::kMaxNameBytes);
  }
  return spec;
}

StatusOr<ReplayTable> ParseReplayTableJson(const std::string& json_text) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument("replay table: not valid JSON: " + OneLine(e.what()));
  }
  if (!root.is_object() || !root.contains("trials") || !root["trials"].is_object()) {
    return InvalidArgument("replay table: must be an object with a \"trials\" object");
  }
  if (root["trials"].size() > limits::kMaxReplayTableEntries) {
    return InvalidArgument("replay table: more than " +
                           std::to_string(limits::kMaxReplayTableEntries) + " trials");
  }
  ReplayTable table;
  for (const auto& [key, entry] : root["trials"].items()) {
    const std::string where = "replay table: trials[" + Quote(key) + "]";
    auto policy = search::ParsePolicy(key);
    if (!policy.ok()) return InvalidArgument(where + ": " + policy.status().message());
    if (!entry.is_object()) return InvalidArgument(where + ": must be an object");
    ReplayEntry e;
    e.result.policy = *policy;
    REMAT_SEARCH_RETURN_IF_ERROR(ReadReplayEntry(entry, where, &e));
    if (!table.emplace(policy->ToString(), std::move(e)).second) {
      return InvalidArgument(where + ": the same policy appears twice");
    }
  }
  return table;
}

StatusOr<ReplayTable> LoadReplayTableFile(const std::string& path) {
  // The field that named the file leads every message.
  const std::string where = "search.replay_table: " + search::QuoteForError(path, 256);
  common::FileText file = common::ReadRegularFile(path, limits::kMaxReplayTableFileBytes);
  if (!file.text) return InvalidArgument(where + " " + file.error);
  auto table = ParseReplayTableJson(*file.text);
  if (!table.ok()) return InvalidArgument(where + ": " + table.status().message());
  return table;
}

}  // namespace remat::spec
