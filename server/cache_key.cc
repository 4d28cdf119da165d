#include "server/cache_key.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <set>
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
  // The kinds of slot, not how many: a trial of world size W measures the same on a node of 4
  // or 8 such GPUs.
  std::set<std::pair<std::string, uint64_t>> kinds;
  for (const v1::Gpu& gpu : worker.gpus()) kinds.insert({gpu.name(), gpu.memory_bytes()});
  std::string out;
  for (const auto& [name, memory] : kinds) {
    if (!out.empty()) out += ",";
    absl::StrAppend(&out, name, "/", memory);
  }
  return out;
}

std::string ResultsCacheKey(const v1::SearchSpec& spec, const std::string& policy,
                            const v1::RegisterRequest& worker, const v1::ReplayEntry* replay) {
  // Everything but the name and the options that cannot change a measurement, so an option
  // added later is in the key by default (reusing too little is safe; too much is not).
  v1::SearchSpec measured = spec;
  measured.clear_name();
  v1::SearchOptions* options = measured.mutable_search();
  options->clear_strategy();
  options->clear_objective();
  options->clear_memory_headroom_gib();
  options->clear_max_trials();
  options->clear_memory_metric();
  options->clear_replay_table();
  options->clear_trial_timeout_s();

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
