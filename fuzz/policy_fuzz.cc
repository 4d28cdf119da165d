// The policy parser on any string: a policy it accepts prints a canonical string that parses
// back to the same policy; a refusal is one line.
#include <cstddef>
#include <cstdint>
#include <string>

#include "search/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto policy = remat::search::ParsePolicy(text);
  if (!policy.ok()) {
    if (policy.status().message().find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  const std::string canonical = policy->ToString();
  auto again = remat::search::ParsePolicy(canonical);
  if (!again.ok() || again->ToString() != canonical) __builtin_trap();
  // The apply strings of any accepted policy can be built.
  (void)policy->MegatronBridgeOverrides();
  return 0;
}
