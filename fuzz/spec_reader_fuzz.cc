// The spec reader on any bytes: never crashes, hangs or leaks; what it accepts is valid
// (ValidateSpec holds) and survives the trip through the wire format unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "proto/convert.h"
#include "specfile/spec_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = remat::spec::ParseSpecYaml(text);
  if (!spec.ok()) {
    // Every error is one line.
    if (spec.status().message().find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  if (!remat::search::ValidateSpec(*spec).ok()) __builtin_trap();
  const remat::v1::SearchSpec wire = remat::proto::ToProto(*spec);
  auto back = remat::proto::FromProto(wire);
  if (!back.ok()) __builtin_trap();
  if (remat::proto::ToProto(*back).SerializeAsString() != wire.SerializeAsString()) {
    __builtin_trap();
  }
  return 0;
}
