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

// The Megatron Core a megatron-backend worker runs, for the results-cache key: "0.20.0" from
// `megatron_path`/megatron/core/package_info.py, plus " commit C" when the folder holds a
// REMAT_COMMIT file (the commit a carried source tree was exported from; bench/fidelity/README.md).
// "installed" when `megatron_path` is empty; "unknown" when the file cannot be read.
std::string MegatronCoreVersion(const std::string& megatron_path);

}  // namespace remat::worker
