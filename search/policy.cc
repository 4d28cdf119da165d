#include "search/policy.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "search/limits.h"
#include "search/text.h"

namespace remat::search {
namespace {

constexpr const char* kLabelNames[kNumLabels] = {
    "core_attn", "moe_act", "layernorm", "mla_up_proj", "mlp", "moe", "shared_experts",
    "gdn_norm_out"};

std::string Trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

void Canonicalize(std::vector<Label>& labels) {
  std::sort(labels.begin(), labels.end());
  labels.erase(std::unique(labels.begin(), labels.end()), labels.end());
}

std::string AllowedLabels() {
  std::string out;
  for (int i = 0; i < kNumLabels; ++i) {
    if (i) out += ", ";
    out += kLabelNames[i];
  }
  return out;
}

StatusOr<Policy> ParseSelective(const std::string& text, const std::string& rest) {
  if (rest.size() < 2 || rest.front() != '[' || rest.back() != ']') {
    return InvalidArgument("policy '" + text +
                           "': selective labels must be written in brackets, e.g. "
                           "selective:[core_attn]");
  }
  std::vector<Label> labels;
  std::string inner = rest.substr(1, rest.size() - 2);
  if (!Trim(inner).empty()) {
    if (Trim(inner).back() == ',') {
      return InvalidArgument("policy '" + text +
                             "': a recompute module is missing after the last ','");
    }
    std::stringstream ss(inner);
    std::string item;
    while (std::getline(ss, item, ',')) {
      std::string name = Trim(item);
      auto label = ParseLabel(name);
      if (!label) {
        return InvalidArgument("policy '" + text + "': unknown recompute module '" + name +
                               "'; Megatron Core allows: " + AllowedLabels());
      }
      if (std::find(labels.begin(), labels.end(), *label) != labels.end()) {
        return InvalidArgument("policy '" + text + "': recompute module '" + name +
                               "' is listed twice");
      }
      labels.push_back(*label);
    }
  }
  return Policy::Selective(std::move(labels));
}

StatusOr<Policy> ParseFull(const std::string& text, const std::string& rest) {
  size_t colon = rest.find(':');
  if (colon == std::string::npos) {
    return InvalidArgument("policy '" + text +
                           "': full recompute needs a method and a layer count, e.g. "
                           "full:uniform:1 or full:block:2");
  }
  std::string method = Trim(rest.substr(0, colon));
  std::string count = Trim(rest.substr(colon + 1));
  RecomputeMethod m;
  if (method == "uniform") {
    m = RecomputeMethod::kUniform;
  } else if (method == "block") {
    m = RecomputeMethod::kBlock;
  } else {
    return InvalidArgument("policy '" + text + "': recompute_method '" + method +
                           "' must be \"block\" or \"uniform\"");
  }
  if (count.empty() || count.size() > 6 ||
      !std::all_of(count.begin(), count.end(), [](char c) { return std::isdigit(c); })) {
    return InvalidArgument("policy '" + text +
                           "': recompute_num_layers must be a positive integer, got '" + count +
                           "'");
  }
  int n = std::stoi(count);
  if (n < 1) {
    return InvalidArgument("policy '" + text +
                           "': recompute_num_layers must be at least 1 (0 checkpoints nothing "
                           "with block and never ends with uniform)");
  }
  return Policy::Full(m, n);
}

}  // namespace

const char* LabelName(Label label) { return kLabelNames[static_cast<int>(label)]; }

std::optional<Label> ParseLabel(const std::string& s) {
  for (int i = 0; i < kNumLabels; ++i) {
    if (s == kLabelNames[i]) return static_cast<Label>(i);
  }
  return std::nullopt;
}

std::vector<Label> AllLabels() {
  std::vector<Label> all;
  for (int i = 0; i < kNumLabels; ++i) all.push_back(static_cast<Label>(i));
  return all;
}

Policy Policy::Selective(std::vector<Label> labels) {
  Policy p;
  p.granularity = Granularity::kSelective;
  Canonicalize(labels);
  p.labels = std::move(labels);
  return p;
}

Policy Policy::Full(RecomputeMethod method, int num_layers) {
  Policy p;
  p.granularity = Granularity::kFull;
  p.method = method;
  p.num_layers = num_layers;
  return p;
}

bool Policy::Has(Label label) const {
  return granularity == Granularity::kSelective &&
         std::find(labels.begin(), labels.end(), label) != labels.end();
}

Policy Policy::With(Label label) const {
  std::vector<Label> l = labels;
  l.push_back(label);
  return Selective(std::move(l));
}

Policy Policy::Without(Label label) const {
  std::vector<Label> l;
  for (Label x : labels) {
    if (x != label) l.push_back(x);
  }
  return Selective(std::move(l));
}

std::string Policy::ToString() const {
  if (granularity == Granularity::kFull) {
    return std::string("full:") + (method == RecomputeMethod::kUniform ? "uniform" : "block") +
           ":" + std::to_string(num_layers);
  }
  std::string out = "selective:[";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) out += ",";
    out += LabelName(labels[i]);
  }
  return out + "]";
}

std::string Policy::MegatronBridgeOverrides() const {
  // Every recompute field is written, the ones this policy does not use reset to null, so the
  // overrides apply cleanly over a recipe that set the other granularity: Megatron Core refuses
  // selective with a recompute_num_layers, and full leaves no stale module list behind.
  if (granularity == Granularity::kFull) {
    return std::string("model.recompute_granularity=full model.recompute_method=") +
           (method == RecomputeMethod::kUniform ? "uniform" : "block") +
           " model.recompute_num_layers=" + std::to_string(num_layers) +
           " model.recompute_modules=null";
  }
  std::string list;
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) list += ",";
    list += LabelName(labels[i]);
  }
  return "model.recompute_granularity=selective model.recompute_method=null "
         "model.recompute_num_layers=null model.recompute_modules=[" + list + "]";
}

std::string Policy::MegatronLmFlags() const {
  if (granularity == Granularity::kFull) {
    return std::string("--recompute-granularity full --recompute-method ") +
           (method == RecomputeMethod::kUniform ? "uniform" : "block") +
           " --recompute-num-layers " + std::to_string(num_layers);
  }
  if (labels.empty()) {
    // Megatron-LM's --recompute-modules defaults to [core_attn]; no recompute means no flag.
    return "";
  }
  std::string out = "--recompute-granularity selective --recompute-modules";
  for (Label l : labels) out += std::string(" ") + LabelName(l);
  return out;
}

std::string Policy::MegatronLmFlagsToRemove() const {
  // --recompute-activations turns any granularity into selective; Megatron-LM refuses a
  // recompute method under selective and distributed saved activations without full.
  if (granularity == Granularity::kFull) return "--recompute-modules --recompute-activations";
  if (labels.empty()) {
    return "--recompute-granularity --recompute-method --recompute-num-layers "
           "--recompute-modules --recompute-activations --distribute-saved-activations";
  }
  return "--recompute-method --recompute-num-layers --recompute-activations "
         "--distribute-saved-activations";
}

StatusOr<Policy> ParsePolicy(const std::string& raw) {
  // Every message below echoes the text: keep it short and printable first.
  if (raw.size() > limits::kMaxPolicyBytes) {
    return InvalidArgument("policy " + QuoteForError(raw) + ": longer than " +
                           std::to_string(limits::kMaxPolicyBytes) + " bytes");
  }
  if (!IsValidUtf8(raw) || std::any_of(raw.begin(), raw.end(), [](char c) {
        return static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
      })) {
    return InvalidArgument("policy " + QuoteForError(raw) + ": not a policy string");
  }
  std::string text = Trim(raw);
  if (text.empty()) return InvalidArgument("policy: must not be empty");
  if (text == "none") return Policy::None();
  size_t colon = text.find(':');
  std::string head = Trim(text.substr(0, colon));
  std::string rest = colon == std::string::npos ? "" : Trim(text.substr(colon + 1));
  if (head == "selective") return ParseSelective(text, rest);
  if (head == "full") return ParseFull(text, rest);
  return InvalidArgument("policy '" + text +
                         "': recompute_granularity must be \"full\" or \"selective\" (write "
                         "selective:[labels], full:uniform:N, full:block:N or none)");
}

}  // namespace remat::search
