// `remat plan` and `remat validate`: the search core's face on the command line. They need no
// coordinator. Each returns the process exit code (0 ok, 2 bad input, 1 other) and writes
// results to `out`, errors to `err` as one line starting with "error:".
// Thread-safety: pure functions of their arguments (and the spec file).
#pragma once

#include <ostream>
#include <string>

namespace remat::cli {

// Prints what the guided search will try before any result can change its course: the
// control, the single labels led by the architecture's first boundary, the full-recompute
// policies; each with its reason and predicted memory. `json`: the contract's plan JSON.
int RunPlan(const std::string& spec_path, bool json, std::ostream& out, std::ostream& err);

// Exit 0 when `policy` is valid for the spec (Megatron Core's rules, and every label has an
// effect on this model), 2 with the reason otherwise. `json`: the policy's prediction as the
// plan JSON gives a candidate's (the whole layout and every stage, `predicted_fits` against
// search.memory_budget_gib), its warnings and its apply strings, instead of the text.
int RunValidate(const std::string& spec_path, const std::string& policy, bool json,
                std::ostream& out, std::ostream& err);

}  // namespace remat::cli
