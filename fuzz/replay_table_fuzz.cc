// The replay-table reader on any bytes: no crash; what it accepts has canonical keys, known
// statuses and bounded messages.
#include <cstddef>
#include <cstdint>
#include <string>

#include "search/limits.h"
#include "search/text.h"
#include "specfile/spec_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto table = remat::spec::ParseReplayTableJson(text);
  if (!table.ok()) {
    if (table.status().message().find('\n') != std::string::npos) __builtin_trap();
    return 0;
  }
  for (const auto& [key, entry] : *table) {
    if (entry.result.policy.ToString() != key) __builtin_trap();
    if (entry.result.message.size() > remat::search::limits::kMaxTrialMessageBytes ||
        !remat::search::IsValidUtf8(entry.result.message)) {
      __builtin_trap();
    }
    if (entry.wall_s < 0 || entry.result.step_time_s < 0) __builtin_trap();
  }
  return 0;
}
