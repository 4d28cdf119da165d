// What of FP8 (model.fp8, model.fp8_recipe, train.fp8_param_gather) the builtin engine runs: its
// FP8 linears (engine/fp8_linear.h) are Transformer Engine's tensorwise and delayed recipes on
// Hopper, for dense layers whose GEMM dimensions are multiples of 16. Standard library only;
// search::BuiltinBackendProblem calls it.
#pragma once

#include <string>

#include "search/spec.h"

namespace remat::search {

// "" when FP8 is off or the builtin engine runs the spec's FP8 settings; else one line naming
// the field and why. Whether the machine can (a GPU of compute capability 8.9+, LibTorch with
// FP8) is decided by the engine at the trial's start: here only search.device cpu is refused.
std::string Fp8BuiltinProblem(const SearchSpec& spec);

}  // namespace remat::search
