// One transformer layer's activations in the memory model (search/memory_model.h): what it holds
// for backward between its forward and its backward on one rank for one micro-batch, split by
// the region a recompute label discards, as Megatron Core's local layer spec holds them with
// fusions off (the builtin engine mirrors it): attention (GQA, RoPE, unfused or flash, MLA), the
// dense MLP, MoE, norms, dropout masks, and Transformer Engine's FP8 linears. The derivation is
// docs/memory-model.md, section 2.2.
// Thread-safety: pure functions of their arguments.
#pragma once

#include "search/spec.h"

namespace remat::search {

// Bytes one layer holds for backward between its forward and its backward, split by the region
// a recompute label discards. Sum of the regions = the layer's total under no recompute.
struct LayerActivations {
  double input = 0;           // the layer's input, saved by input_layernorm (kept by full recompute)
  double layernorm = 0;       // norm outputs (input_layernorm + pre_mlp_layernorm): what layernorm discards
  double attn_inputs = 0;     // what core attention's checkpoint keeps as its inputs (q, k, v)
  double core_attn = 0;       // what core_attn discards: scores/softmax/dropout (unfused) or the
                              // kernel's logsumexp (flash), plus GQA's expanded k/v copies; can be
                              // slightly negative where the checkpoint keeps more q/k/v storage
                              // than the unfused core does (see docs)
  double mla_up_proj = 0;     // expanded MLA query/key/value after RoPE: what mla_up_proj discards
  double attn_other = 0;      // MLA latents, out-proj input, attention dropout mask, the residual
                              // (pre_mlp_layernorm's input), norm statistics
  double mlp = 0;             // dense MLP internals (fc1 output, activation, fc2 input): what mlp discards
  double moe_router = 0;      // router probabilities and indices, dispatched tokens (expert fc1 input)
  double moe_expert_fc1 = 0;  // grouped expert fc1 outputs (kept under moe_act)
  double moe_act = 0;         // expert activation outputs: what moe_act discards
  double moe_other = 0;       // permutation indices kept for unpermute/combine
  double shared_experts = 0;  // shared-expert MLP internals: what shared_experts discards
  double mlp_other = 0;       // the MLP-side bias-dropout-add mask (dense and MoE layers)

  double Total() const;
  // What `moe` discards: router, dispatch, experts, combine and shared experts.
  double Moe() const;
};

// Per-layer activations of layer `layer` (global index) under no recompute, for one micro-batch
// on one rank of the given layout.
LayerActivations EstimateLayerActivations(const SearchSpec& spec, int layer);

// Bytes of fp32 statistics a norm keeps per token: LayerNorm mean + rstd, RMSNorm rstd.
double NormStatsBytes(const ModelSpec& m);

// Unfused core attention, per score element (b * heads * s * s on this rank): the bytes held for
// backward, and the peak of the backward's gradient chain above what the layer holds.
struct ScoreChain {
  double held = 0;
  double backward_peak = 0;
};

// The score chain of unfused core attention with activation dtype `e` bytes (softmax in fp32
// when attention_softmax_in_fp32 or e = 4; dropout when attention_dropout > 0), its backward run
// by ATen's CUDA kernels when `cuda` (their softmax backward holds one more score tensor).
ScoreChain UnfusedScoreChain(const ModelSpec& m, double e, bool cuda);

}  // namespace remat::search
