// The software versions a worker reports when it registers (part of the results-cache key).
// Thread-safety: ProbeVersions runs `remat-trial --version` (safe from any thread).
#pragma once

#include <map>
#include <string>

namespace remat::worker {

// Parses `key=value` lines (blank lines and lines without '=' are ignored).
std::map<std::string, std::string> ParseKeyValueLines(const std::string& text);

// {"remat": common::kVersion} plus what `trial_binary --version` prints (torch, cuda, nccl,
// device, ...). When the binary is missing or fails, only remat's version.
std::map<std::string, std::string> ProbeVersions(const std::string& trial_binary);

}  // namespace remat::worker
