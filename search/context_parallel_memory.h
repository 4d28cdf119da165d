// What Transformer Engine's context-parallel attention keeps for backward beyond the q, k, v it is
// given (search/memory_model.cc adds it to core attention's bytes). Thread-safety: pure.
#ifndef REMAT_SEARCH_CONTEXT_PARALLEL_MEMORY_H_
#define REMAT_SEARCH_CONTEXT_PARALLEL_MEMORY_H_

#include "search/spec.h"

namespace remat::search {

// Widths per token (elements of one [s/CP, b, width] tensor) of what the context-parallel
// attention holds for backward in place of its inputs, minus `given` (the width of the inputs it
// is handed, which a core_attn checkpoint keeps instead): 0 without context parallelism. May be
// negative (the attention then holds less than its inputs: they are freed once it has run).
// `q`, `kv`: widths of the query and of the key (or value) per rank; `v`: of the value, `out`:
// of the output. Transformer Engine at d0067d0,
// transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py:
//   p2p        (AttnFuncWithCPAndKVP2P) saves q and one packed copy of k and v: q + k + v.
//   a2a        (AttnFuncWithCPAndQKVOA2A) saves the exchanged q, k, v and its output before the
//              reverse all-to-all (the exchanged output is a new tensor): q + k + v + out.
//   allgather  (AttnFuncWithCPAndKVAllGather) saves the local q, k, v as given: 0.
//   a2a+p2p    modelled as a2a (its all-to-all copies; the ring's packed KV replaces the
//              exchanged k, v).
double ContextParallelAttentionExtraWidth(const SearchSpec& spec, double q, double k, double v,
                                          double out, double given);

}  // namespace remat::search

#endif  // REMAT_SEARCH_CONTEXT_PARALLEL_MEMORY_H_
