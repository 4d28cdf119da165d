// Reading the user's files into search/ types: the YAML search spec and the JSON replay table.
//
// Unknown keys, wrong types and out-of-range values are refused with InvalidArgument whose
// message names the key ("model.kv_lora_rank: must be a positive integer"). Omitted keys take
// Megatron Core's defaults (the defaults of search::SearchSpec). Thread-safety: pure functions.
#pragma once

#include <map>
#include <string>

#include "search/spec.h"
#include "search/status.h"
#include "search/trial.h"

namespace remat::spec {

// Parses YAML text; also runs search::ValidateSpec. `search.replay_table` is kept as written.
search::StatusOr<search::SearchSpec> ParseSpecYaml(const std::string& yaml_text);

// Reads and parses a spec file. A relative search.replay_table is resolved against the spec
// file's folder, so the returned path can be opened as is.
search::StatusOr<search::SearchSpec> LoadSpecFile(const std::string& path);

// One replayed trial (contract: "Replay tables").
struct ReplayEntry {
  search::TrialResult result;  // status, ranks, step_time_s, ...; policy = the table's key
  double wall_s = 0;           // how long the replayed trial takes
};
// Keyed by canonical policy string (keys are canonicalised when read: "none" -> "selective:[]").
using ReplayTable = std::map<std::string, ReplayEntry>;

search::StatusOr<ReplayTable> ParseReplayTableJson(const std::string& json_text);
search::StatusOr<ReplayTable> LoadReplayTableFile(const std::string& path);

}  // namespace remat::spec
