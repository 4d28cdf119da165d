// The per-label rules that FP8 and CUDA graphs add to Megatron Core's recompute rules. The
// spec-wide rules of the same features are ValidateCompatibility's (search/spec.h); both live in
// compatibility.cc, the one home of what FP8, CUDA graphs, CPU offloading and the DDP overlap
// settings allow. Thread-safety: pure functions.
#pragma once

#include <string>

#include "search/policy.h"
#include "search/spec.h"

namespace remat::search {

// Why selective label `label` cannot run under the spec's FP8 recipe or CUDA graphs (a
// checkpoint must lie wholly inside or outside a captured graph, graphed regions replay no
// dropout, delayed scaling refuses output-discarding checkpoints of norms and activations), or
// "" when it can.
std::string Fp8AndGraphLabelProblem(const ModelSpec& m, Label label);

}  // namespace remat::search
