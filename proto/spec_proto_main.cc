// remat-spec-proto OUT: writes remat/v1/spec.proto, the remat.v1 spec messages (ModelSpec,
// TrainSpec, ParallelSpec, SearchOptions, SearchSpec), generated from the spec's one declaration
// (search/spec_fields.def) at build time. remat.proto imports it publicly, so the messages are
// remat.v1's as before; the wire format is the declaration's field numbers.
//
// Proto types by member type: a required integer is a plain int32; every other scalar is
// `optional` (unset: the default), enums travel as their names (strings), lists as repeated
// fields. A MoeLayerFreq field is two proto fields: the interval at its number and the 0/1
// pattern (named with _pattern for _freq) at the next.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "search/spec_fields.h"

namespace {

using remat::search::FieldInfo;

template <typename T>
std::string ProtoType(const FieldInfo& f) {
  using remat::search::IsOptional;
  using remat::search::IsVector;
  if constexpr (IsOptional<T>::value) {
    return ProtoType<typename IsOptional<T>::Value>(f);
  } else if constexpr (IsVector<T>::value) {
    using V = typename IsVector<T>::Value;
    return "repeated " + std::string(std::is_same_v<V, int> ? "int32" : "string");
  } else if constexpr (std::is_same_v<T, int> || std::is_same_v<T, remat::search::MoeLayerFreq>) {
    return f.required ? "int32" : "optional int32";
  } else if constexpr (std::is_same_v<T, uint64_t>) {
    return "optional uint64";
  } else if constexpr (std::is_same_v<T, bool>) {
    return "optional bool";
  } else if constexpr (std::is_same_v<T, double>) {
    return "optional double";
  } else {
    static_assert(std::is_same_v<T, std::string> || std::is_enum_v<T>);
    return "optional string";
  }
}

// `text` as // comment lines of at most 100 columns, indented by two.
std::string Comment(const std::string& text) {
  std::string out, line;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    if (!line.empty() && 5 + line.size() + 1 + word.size() > 100) {
      out += "  // " + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
    start = end + 1;
  }
  if (!line.empty()) out += "  // " + line + "\n";
  return out;
}

std::string Render() {
  static const char* const kMessages[][2] = {{"model", "ModelSpec"},
                                             {"train", "TrainSpec"},
                                             {"parallel", "ParallelSpec"},
                                             {"search", "SearchOptions"}};
  std::string out =
      "// Generated at build time by remat-spec-proto from search/spec_fields.def (the spec's one\n"
      "// declaration: names, defaults and docs are there). Do not edit.\n"
      "//\n"
      "// Field names are Megatron Core / Megatron Bridge names. An unset optional field takes its\n"
      "// default (docs/spec.md), so any client may send only what its recipe changes.\n"
      "syntax = \"proto3\";\n\npackage remat.v1;\n";
  const remat::search::SearchSpec defaults;
  for (const auto& names : kMessages) {
    // Plain names: a lambda cannot capture a structured binding in C++17.
    const std::string section = names[0], message = names[1];
    out += "\nmessage " + message + " {\n";
    remat::search::VisitFields(defaults, [&](const FieldInfo& f, const auto& value) {
      using T = std::decay_t<decltype(value)>;
      if (std::string(f.section) != section) return;
      std::string doc = f.doc;
      if (!f.required) doc += " (default: " + remat::search::FormatValue(value) + ")";
      out += Comment(doc);
      out += "  " + ProtoType<T>(f) + " " + f.name + " = " + std::to_string(f.proto_number) +
             ";\n";
      if constexpr (std::is_same_v<T, remat::search::MoeLayerFreq>) {
        std::string pattern = f.name;
        pattern.replace(pattern.rfind("_freq"), 5, "_pattern");
        out += "  repeated int32 " + pattern + " = " + std::to_string(f.proto_number + 1) +
               ";  // the 0/1 list form of " + f.name + "; wins over it when not empty\n";
      }
    });
    out += "}\n";
  }
  out +=
      "\nmessage SearchSpec {\n"
      "  string name = 1;\n"
      "  ModelSpec model = 2;\n"
      "  TrainSpec train = 3;\n"
      "  ParallelSpec parallel = 4;\n"
      "  SearchOptions search = 5;\n"
      "}\n";
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: remat-spec-proto OUT.proto\n");
    return 2;
  }
  const std::string text = Render();
  // Rewritten only when it changed, so that protoc and what depends on it do not rerun.
  {
    std::ifstream in(argv[1], std::ios::binary);
    std::string old((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in && old == text) return 0;
  }
  std::ofstream out(argv[1], std::ios::binary | std::ios::trunc);
  if (!(out << text) || !out.flush()) {
    std::fprintf(stderr, "error: cannot write %s\n", argv[1]);
    return 1;
  }
  return 0;
}
