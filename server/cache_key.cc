#include "server/cache_key.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"

namespace remat::server {
namespace {

std::string Deterministic(const google::protobuf::MessageLite& msg) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    msg.SerializeToCodedStream(&coded);
  }
  return out;
}

void AppendField(std::string* key, const std::string& value) {
  absl::StrAppend(key, value.size(), ":", value, ";");
}

}  // namespace

std::string HardwareSignature(const v1::RegisterRequest& worker) {
  std::map<std::pair<std::string, uint64_t>, int> counts;
  for (const v1::Gpu& gpu : worker.gpus()) ++counts[{gpu.name(), gpu.memory_bytes()}];
  std::string out;
  for (const auto& [gpu, n] : counts) {
    if (!out.empty()) out += ",";
    absl::StrAppend(&out, gpu.first, "/", gpu.second, "x", n);
  }
  return out;
}

std::string ResultsCacheKey(const v1::SearchSpec& spec, const std::string& policy,
                            const v1::RegisterRequest& worker, const v1::ReplayEntry* replay) {
  v1::SearchSpec measured;
  *measured.mutable_model() = spec.model();
  *measured.mutable_train() = spec.train();
  *measured.mutable_parallel() = spec.parallel();
  const v1::SearchOptions& in = spec.search();
  v1::SearchOptions* out = measured.mutable_search();
  if (in.has_memory_budget_gib()) out->set_memory_budget_gib(in.memory_budget_gib());
  if (in.has_warmup_steps()) out->set_warmup_steps(in.warmup_steps());
  if (in.has_measure_steps()) out->set_measure_steps(in.measure_steps());
  if (in.has_backend()) out->set_backend(in.backend());
  if (in.has_command_template()) out->set_command_template(in.command_template());
  if (in.has_device()) out->set_device(in.device());

  v1::RegisterRequest software;
  *software.mutable_versions() = worker.versions();

  std::string key = "remat-cache-v1;";
  AppendField(&key, Deterministic(measured));
  AppendField(&key, policy);
  AppendField(&key, HardwareSignature(worker));
  AppendField(&key, Deterministic(software));
  if (replay != nullptr) {
    v1::ReplayEntry entry = *replay;
    entry.mutable_result()->clear_policy();
    AppendField(&key, Deterministic(entry));
  } else {
    AppendField(&key, "");
  }
  return key;
}

}  // namespace remat::server
