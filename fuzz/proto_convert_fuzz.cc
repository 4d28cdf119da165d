// Proto <-> domain conversion on any wire bytes (what a client or a worker may send): a spec or
// a result that parses converts without crashing, and a converted spec converts back.
#include <cstddef>
#include <cstdint>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "proto/convert.h"

// Invalid UTF-8 in a string field is a parse failure, which protobuf also logs: keep the
// fuzzer's output readable.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  remat::v1::SearchSpec spec_msg;
  if (spec_msg.ParseFromString(bytes)) {
    auto spec = remat::proto::FromProto(spec_msg);
    if (spec.ok() && remat::search::ValidateSpec(*spec).ok()) {
      auto back = remat::proto::FromProto(remat::proto::ToProto(*spec));
      if (!back.ok()) __builtin_trap();
    }
  }
  remat::v1::TrialResult result_msg;
  if (result_msg.ParseFromString(bytes)) {
    auto result = remat::proto::FromProto(result_msg);
    if (result.ok()) (void)remat::proto::ToProto(*result).SerializeAsString();
  }
  return 0;
}
