// MoE token dispatch on Megatron's expert grid (engine-internal; includes LibTorch).
//
// Megatron Core's token dispatchers (NVIDIA/Megatron-LM megatron/core/transformer/moe/
// token_dispatcher.py at d98e8a6), for any TP, expert TP (ETP) and EP the spec's rules allow:
// - allgather (MoEAllGatherTokenDispatcher): every rank of the ETP x EP block gathers the block's
//   tokens, probabilities and routing (its sequence-parallel shards), keeps the tokens routed to
//   its local experts, runs them, unpermutes into the gathered token order and reduce-scatters:
//   each rank gets its own tokens back, summed over the experts and the ETP shards.
// - alltoall (MoEAlltoAllTokenDispatcher; flex is measured as this one): permute this rank's
//   tokens by expert, gather the per-expert counts over ETP x EP, exchange the tokens and
//   probabilities over EP, all-gather them over ETP (variable sizes), sort the chunks by local
//   expert, run the experts, undo it all in reverse (reduce-scatter over ETP, the reverse
//   exchange over EP) and unpermute.
// Under tensor parallelism the MoE layer's input is the rank's sequence-parallel shard (the spec
// requires sequence parallelism with MoE and TP > 1, as Megatron does): tokens are never
// gathered over the dense TP group, only over the expert grid's groups. Expert linears are split
// over ETP (fc1 column-wise, fc2 row-wise, Megatron's experts.py); their partial outputs are
// summed by the dispatcher's reduce-scatter, as Megatron's. The routing mask travels as top-k
// expert indices (int64) rather than Megatron's boolean [tokens, experts] map (the collectives
// carry no bool); the mask is rebuilt from them.
//
// Called on the trial's compute thread, inside autograd regions (recompute replays them, so every
// rank issues the same collectives in the same order). Collective failures throw CollectiveError.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "engine/model.h"
#include "engine/ops.h"
#include "search/spec.h"

namespace remat::engine {

// This rank's local experts: `tokens` sorted by local expert (`counts` rows each) and their
// routing probabilities (1-D). Returns one output row per token, partial over ETP.
using LocalExperts = std::function<at::Tensor(
    const at::Tensor& tokens, const std::vector<int64_t>& counts, const at::Tensor& probs)>;

// The routed part of a MoE layer: `hs` [tokens, hidden] (this rank's tokens), `probs`
// [tokens, experts] (zero off the top-k), `top_idx` [tokens, k] (int64). Returns [tokens,
// hidden], the sum over each token's experts of probability-weighted expert outputs. Experts
// [ep_rank x local, (ep_rank + 1) x local) are this rank's, local = experts / EP.
at::Tensor DispatchToExperts(const Runtime& rt, search::MoeTokenDispatcher dispatcher,
                             const at::Tensor& hs, const at::Tensor& probs,
                             const at::Tensor& top_idx, const LocalExperts& experts);

// This rank's shard of an expert parameter (ParamInfo::expert_view, expert_dim, etp_dim) cut
// from the full tensor: its EP rank's experts, its expert-TP rank's slice of their FFN width.
at::Tensor ExpertShard(const Runtime& rt, const at::Tensor& full, const ParamInfo& p);

}  // namespace remat::engine
