// The analytic memory and FLOP model: what a policy should cost before it is measured.
//
// Static memory follows Megatron's accounting (18 bytes/parameter for bf16 + Adam; 6 + 12/DP
// with the distributed optimizer). Activation bytes per layer follow Korthikanti et al. 2022
// (s*b*h*(34 + 5*a*s/h) for unfused dense attention, with its TP/SP variants) generalised to
// what the builtin engine and Megatron's local layer spec hold: GQA, SwiGLU, RMSNorm, fp32
// softmax, biases, dropout masks, MLA and MoE. All figures are for the most loaded rank of the
// first pipeline stage. The derivation is written out in docs/memory-model.md.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "search/policy.h"
#include "search/spec.h"

namespace remat::search {

// Bytes one layer holds for backward between its forward and its backward, split by the region
// a recompute label discards. Sum of the regions = the layer's total.
struct LayerActivations {
  double layernorm = 0;       // norm outputs (input_layernorm + pre_mlp_layernorm)
  double attn_inputs = 0;     // what core attention keeps as its inputs (q, k, v, ...)
  double core_attn = 0;       // scores, softmax, attention dropout: what core_attn discards
  double mla_up_proj = 0;     // expanded q/k/v after RoPE: what mla_up_proj discards
  double attn_other = 0;      // QKV/MLA down-projection inputs, out-proj input, residual, dropout
  double mlp = 0;             // dense MLP internals: what mlp discards (dense layers)
  double moe_router = 0;      // router logits/probs, permutation indices, dispatched tokens
  double moe_expert_fc1 = 0;  // grouped expert fc1 outputs (kept under moe_act)
  double moe_act = 0;         // expert activation outputs: what moe_act discards
  double moe_other = 0;       // unpermute / combine
  double shared_experts = 0;  // shared-expert MLP internals
  double input = 0;           // the layer's input (kept under full recompute)

  double Total() const;
};

struct MemoryEstimate {
  double parameters = 0;        // parameter count on the most loaded rank
  double static_bytes = 0;      // weights + gradients + optimizer state
  double activation_bytes = 0;  // held by one micro-batch's forward (layers, embedding, logits)
  double transient_bytes = 0;   // largest extra live during backward (e.g. one layer's recompute)
  double peak_bytes = 0;        // static + activation + transient
  double recompute_flops = 0;   // extra forward FLOPs per step from recompute
  double model_flops = 0;       // model FLOPs per step on this rank (3x forward; no recompute)
};

// Per-layer activations of layer `layer` (global index) under no recompute, for one micro-batch
// on one rank of the given layout.
LayerActivations EstimateLayerActivations(const SearchSpec& spec, int layer);

// The whole-model estimate under `policy`.
MemoryEstimate EstimateMemory(const SearchSpec& spec, const Policy& policy);

// Korthikanti et al. Table 2, no parallelism, unfused, 16-bit softmax, dropout on:
// s*b*h*(34 + 5*a*s/h). For tests and docs.
double PaperActivationBytesPerLayer(const SearchSpec& spec);

}  // namespace remat::search
