// Static memory per pipeline rank: parameters, gradient buffers and optimizer states as Megatron
// allocates them (the weights' and states' dtypes, the distributed optimizer's and
// Megatron-FSDP's sharding, Transformer Engine's FP8 weight workspaces). Internal to
// remat_search: search/memory_model.h's EstimateMemory is the public entry.
// Thread-safety: pure functions.
#pragma once

#include "search/spec.h"

namespace remat::search {

// Expert tensor parallelism: the spec's, or TP when unset (Megatron Core's default; Megatron
// Bridge's MoE recipes set it, often to 1).
double ExpertTensorParallel(const SearchSpec& spec);

// Parameters on the most loaded rank of a pipeline stage.
struct ParamCount {
  double dense = 0;   // TP-sharded and replicated parameters on this rank
  double expert = 0;  // routed-expert parameters on this rank
  double linear = 0;  // the dense part's TE-linear weights (attention, MLP, shared experts)
};
ParamCount CountParams(const SearchSpec& spec, int pp_rank);

// Bytes per parameter as a weight, its gradient buffer and the optimizer's state, with the
// optimizer state sharded over `dp` ranks where the spec shards it.
double BytesPerParameter(const SearchSpec& spec, double dp);

// The static bytes of `p`: dense parameters over the DP x CP group, experts over expert-DP, plus
// the FP8 weight workspaces.
double StaticParameterBytes(const SearchSpec& spec, const ParamCount& p);

}  // namespace remat::search
