// What recompute cannot fix: static memory (weights, gradients, optimizer state and persistent
// buffers, by the memory model) over the per-rank budget. No recompute policy frees any of it, so
// `remat plan` and the search result say so first and name the settings that can, each with the
// static memory the model predicts under it, instead of listing every policy as not fitting.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "search/spec.h"

namespace remat::search {

// One setting that lowers static memory per rank, as the model predicts it.
struct CapacityLever {
  std::string setting;            // e.g. "train.use_distributed_optimizer: true"
  double static_bytes = 0;        // predicted static memory per rank (worst stage) with it
  bool fits = false;              // static_bytes leaves room under the budget
  std::string note;               // what else it changes (world size), may be empty
};

struct CapacityFinding {
  double static_bytes = 0;        // predicted static memory per rank (worst stage)
  int stage = 0;                  // the pipeline stage with the most static memory
  uint64_t budget_bytes = 0;
  std::vector<CapacityLever> levers;  // the settings that lower it, most effective first
  std::string message;            // one sentence: static over budget, recompute cannot fix it
};

// The finding when static memory alone exceeds spec.search's budget, nullopt otherwise. Expects
// a spec ValidateSpec accepts. Levers: the distributed optimizer, DP x2 (with the distributed
// optimizer), TP x2, PP x2 and, for MoE, EP x2, each kept only when ValidateSpec accepts the
// changed spec and the model predicts less static memory.
std::optional<CapacityFinding> StaticCapacityProblem(const SearchSpec& spec);

// The finding as readable lines: the message, then one line per lever.
std::vector<std::string> CapacityLines(const CapacityFinding& finding);

}  // namespace remat::search
