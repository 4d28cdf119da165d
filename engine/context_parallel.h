// Context parallelism of the trial engine (engine-internal; includes LibTorch): Megatron Core's
// split of the sequence over the CP group and Transformer Engine's context-parallel attention.
//
// Megatron keeps each sequence in 2 x CP equal chunks and gives CP rank r chunks r and
// 2 x CP - 1 - r, so that every rank does the same causal work (megatron/core/utils.py
// get_batch_on_this_cp_rank, Megatron-LM at d98e8a6); tokens, labels, positions and RoPE's tables
// are cut alike, and everything outside attention is per token. Attention needs every earlier
// key, which Transformer Engine brings in one of three ways (parallel.cp_comm_type;
// transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py at d0067d0):
//   p2p        AttnFuncWithCPAndKVP2P: K and V travel round the CP ring in CP steps; each step
//              attends the local queries to one rank's chunks (step 0 the diagonal, causal; a
//              rank before this one: its first chunk only; a rank after it: only this rank's
//              second query chunk, unmasked) and merges the partial outputs by their log-sum-exp.
//              Saved for backward: q, one packed copy of k and v, the output and the fp32
//              log-sum-exp. Backward runs the ring again and passes each dK/dV round with its KV
//              chunk until it reaches its owner.
//   a2a        AttnFuncWithCPAndQKVOA2A (DeepSpeed Ulysses): an all-to-all turns q, k, v from
//              [s/CP, heads] into [s, heads/CP], a whole-sequence causal attention runs on those
//              heads and an all-to-all turns the output back. Saved: the exchanged q, k, v, the
//              output before its all-to-all and the log-sum-exp.
//   allgather  AttnFuncWithCPAndKVAllGather: K and V all-gathered; each local query chunk attends
//              the keys up to its end. Saved: the local q, k, v, the output, the log-sum-exp
//              (K and V are gathered again in backward; dK/dV reduce-scattered).
// Each is one autograd function with its own backward, so only what Transformer Engine saves is
// held. The per-step attention is explicit math in fp32 (LibTorch 1.13 on the CPU has no
// fused kernel that returns the log-sum-exp): scores and probabilities of one step are transient
// (never saved), the backward recomputes them from the saved log-sum-exp as a flash kernel does.
#pragma once

#include <ATen/ATen.h>

#include "engine/ops.h"

namespace remat::engine {

// This CP rank's part of `x` along `dim` (full length s, divisible by 2 x CP): chunks r and
// 2 x CP - 1 - r, concatenated (a new tensor). `x` itself when CP = 1.
at::Tensor LocalSequence(const Runtime& rt, const at::Tensor& x, int64_t dim);

// The positions (0 .. seq - 1) of this CP rank's tokens, in their local order, as int64 [s / CP]
// (0 .. seq - 1 when CP = 1) with `options`' device and dtype.
at::Tensor LocalPositions(const Runtime& rt, int64_t seq, const at::TensorOptions& options);

// Causal self-attention over the whole sequence, for this rank's queries: q [s/CP, b, n, dqk],
// k [s/CP, b, g, dqk], v [s/CP, b, g, dv] (g divides n: GQA, group-major as Megatron's QKV
// layout), each in the local order of LocalSequence; returns [s/CP, b, n * dv] in q's dtype.
// Runs rt.cp_comm_type over rt.cp (p2p, a2a or allgather; a2a needs n and g divisible by CP).
// No dropout. Call only with CP > 1.
at::Tensor ContextParallelAttention(const Runtime& rt, const at::Tensor& q, const at::Tensor& k,
                                    const at::Tensor& v, double scale);

}  // namespace remat::engine
