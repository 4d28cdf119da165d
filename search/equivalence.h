// Equivalence classes of recompute policies: policies that Megatron Core makes keep the same
// tensors for the backward pass are one class, measured once through its simplest member.
//
// The rules, each read from Megatron Core's code (NVIDIA/Megatron-LM at commit
// d98e8a64ddf34856e74b24714e3bedb2f5a39553):
//   - `moe` wraps the whole MoE layer: MoELayer.forward (megatron/core/transformer/moe/
//     moe_layer.py) runs custom_forward (shared_experts_compute, route, dispatch,
//     routed_experts_compute, combine) under tensor_parallel.checkpoint when moe_layer_recompute
//     is set ("moe" in recompute_modules and cuda_graph_impl != 'local'). Inside that checkpoint
//     nothing is saved, so `moe_act` (the expert activation, experts.py) and `shared_experts`
//     (MoELayer.shared_experts_compute's own checkpoint) keep nothing more or less beside it;
//     they only replay their part a second time in the backward. Both act on MoE layers alone.
//   - full:block:N with N at least the layers of every model chunk is full:uniform:1:
//     checkpointed_forward (megatron/core/recompute.py, called by TransformerBlock's
//     _checkpointed_forward) runs chunk_runner(l, l + 1, True) for every layer l of the chunk
//     under uniform with recompute_num_layers 1, and chunk_runner(l, l + 1, l < N) under block:
//     the same checkpoints when N covers num_layers_per_pipeline_rank. (Under FP8/FP4 block skips
//     leading layers whose input needs no gradient; remat's precisions are bf16 and fp32.)
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "search/policy.h"
#include "search/spec.h"

namespace remat::search {

// A policy's class: the member that stands for it (the simplest: fewest labels, uniform:1 over
// block) and why `policy` keeps the same tensors ("" when `policy` is the representative).
struct ClassOf {
  Policy representative;
  std::string reason;
};
ClassOf EquivalenceClassOf(const SearchSpec& spec, const Policy& policy);

// One class of the valid policies: its representative and the others with their reasons.
struct PolicyClass {
  Policy representative;
  std::vector<ClassOf> others;  // each: the member (as representative) and why it is equal
};

// The classes of EnumerateValidPolicies(spec), in the order their representatives appear there.
std::vector<PolicyClass> EquivalenceClasses(const SearchSpec& spec);

// True when `policy` stands for its class (the policies a search measures).
bool IsRepresentative(const SearchSpec& spec, const Policy& policy);

}  // namespace remat::search
