// The command backend's metrics-file reader on any bytes (a job writes that file): no crash;
// what it accepts becomes a result whose report the coordinator can parse.
#include <cstddef>
#include <cstdint>
#include <string>

#include "worker/assignment.h"
#include "worker/metrics_file.h"

namespace {

remat::worker::Assignment TwoRanks() {
  remat::v1::TrialAssignment wire;
  wire.set_trial_id("t-fuzz");
  wire.set_attempt(1);
  wire.set_world_size(2);
  wire.mutable_policy()->set_canonical("selective:[core_attn]");
  remat::v1::SearchSpec* spec = wire.mutable_spec();
  spec->mutable_model()->set_num_layers(2);
  spec->mutable_model()->set_hidden_size(64);
  spec->mutable_model()->set_num_attention_heads(4);
  spec->mutable_model()->set_seq_length(128);
  spec->mutable_model()->set_vocab_size(512);
  spec->mutable_parallel()->set_tensor_model_parallel_size(2);
  spec->mutable_search()->set_warmup_steps(1);
  spec->mutable_search()->set_measure_steps(2);
  return remat::worker::ToAssignment(wire);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const remat::worker::Assignment assignment = TwoRanks();
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto metrics = remat::worker::ParseMetricsJson(text);
  if (!metrics.ok()) return 0;
  const remat::search::TrialResult result = remat::worker::MetricsToResult(assignment, *metrics);
  const remat::v1::ReportTrialRequest report = remat::worker::MakeReport("w-1", assignment, result);
  remat::v1::ReportTrialRequest parsed;
  if (!parsed.ParseFromString(report.SerializeAsString())) __builtin_trap();
  return 0;
}
