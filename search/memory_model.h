// The analytic memory and FLOP model: what a policy should cost before it is measured.
//
// Static memory follows Megatron's accounting (18 bytes/parameter for bf16 + Adam; 6 + 12/DP
// with the distributed optimizer; 16 and 8 + 8/DP in fp32). Activation bytes per layer follow
// Korthikanti et al. 2022 (s*b*h*(34 + 5*a*s/h) for unfused dense attention, with its TP/SP
// variants) generalised to what Megatron Core's local (non-Transformer-Engine) layer spec holds
// with fusions off, which the builtin engine mirrors: GQA, RoPE, SwiGLU, RMSNorm, fp32 softmax,
// biases, dropout masks, flash attention, MLA and MoE. Each pipeline stage is estimated on its
// most loaded rank, with its own layers (search/pipeline.h), the embedding on the first stage,
// the output layer and loss on the last, multi-token-prediction layers where the layout puts them
// (search/mtp_model.h), and every micro-batch its schedule (1F1B or
// interleaved) keeps in flight; the stage with the highest peak decides the fit. Context
// parallelism divides the sequence. FLOPs follow Megatron's model-FLOP formula.
// The derivation, and every assumption it makes, is written out in docs/memory-model.md.
//
// The functions expect a spec that ValidateSpec accepts; on other specs they return finite but
// meaningless numbers (they never divide by zero or throw).
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "search/layer_activations.h"  // LayerActivations, EstimateLayerActivations
#include "search/policy.h"
#include "search/spec.h"

namespace remat::search {

// One pipeline stage (its most loaded rank) under one policy.
struct StageMemory {
  int stage = 0;                // pipeline rank
  int layers = 0;               // transformer layers on it, over all its chunks
  double parameters = 0;
  double static_bytes = 0;      // weights + gradients + optimizer state + persistent buffers
  double microbatch_activation_bytes = 0;  // one micro-batch through all its chunks
  double activation_bytes = 0;  // held for backward at its peak: every micro-batch in flight
  double layer_activation_bytes = 0;  // the part of activation_bytes held by transformer layers
  double logits_bytes = 0;      // the part held for the loss (last stage only)
  int in_flight = 0;            // micro-batches (chunk-forwards) held at its peak
  double transient_bytes = 0;   // the running backward's working set above activation_bytes
  double peak_bytes = 0;        // static + activation + transient
  double recompute_flops = 0;   // extra forward FLOPs per step on this stage from recompute
};

// The whole-layout estimate: the scalar fields are those of the stage with the highest peak
// (peak_stage); `stages` lists every stage.
struct MemoryEstimate {
  double parameters = 0;        // parameter count on the most loaded rank (of peak_stage)
  double buffer_bytes = 0;      // persistent workspaces (unfused attention's baddbmm input,
                                // cuBLAS's on CUDA); included in static_bytes
  double static_bytes = 0;      // weights + gradients + optimizer state + buffer_bytes
  double activation_bytes = 0;  // held for backward at the peak: every micro-batch in flight
                                // (one with PP 1), its layers, embedding, logits
  double layer_activation_bytes = 0;  // the part of activation_bytes held by transformer layers
  double logits_bytes = 0;      // the part held for the loss (fp32 softmax of the logits)
  double transient_bytes = 0;   // largest extra live over activation_bytes during backward
                                // (one layer's recompute, gradient working set, logits' gradient)
  double peak_bytes = 0;        // static + activation + transient
  double recompute_flops = 0;   // extra forward FLOPs per step on this rank from recompute
  double model_flops = 0;       // model FLOPs per step on this rank (Megatron's formula: 3x
                                // forward, causal halving; recompute not counted)
  int in_flight = 1;            // micro-batches held at the peak
  int peak_stage = 0;           // the stage with the highest peak_bytes (the first on ties)
  std::vector<StageMemory> stages;  // one per pipeline stage
};

// The whole-layout estimate under `policy`. Selective labels apply per layer where they have an
// effect (mlp on dense layers, moe/moe_act/shared_experts on MoE layers; moe supersedes moe_act
// and shared_experts); full recompute supersedes selective labels. N of full:*:N applies to each
// model chunk and is clamped to its layers.
MemoryEstimate EstimateMemory(const SearchSpec& spec, const Policy& policy);

// Activation bytes `label` alone stops holding for one micro-batch, summed over the first
// stage's layers (0 when the label has no effect on this model).
double LabelSavingBytes(const SearchSpec& spec, Label label);

// Extra forward FLOPs per step on a first-stage rank that `label` alone replays in backward.
double LabelRecomputeFlops(const SearchSpec& spec, Label label);

// Parameter count on the most loaded rank of the first pipeline stage.
double ParameterCount(const SearchSpec& spec);

// Megatron's padded vocabulary: vocab_size rounded up to a multiple of 128 * TP
// (make_vocab_size_divisible_by = 128); the embedding, the output layer, the logits and the FLOP
// formula all use it.
int64_t PaddedVocabSize(const SearchSpec& spec);

// Megatron's model FLOPs for one step (every micro-batch of one data-parallel replica), divided
// over the TP x CP x PP ranks of that replica.
double ModelFlopsPerStep(const SearchSpec& spec);

// The smallest N for which full:block:N is predicted to peak at or under `budget_bytes`;
// nullopt when even full:block:<layers of the largest chunk> does not fit.
std::optional<int> SmallestFittingBlock(const SearchSpec& spec, double budget_bytes);

// Korthikanti et al. 2022, Table 2 (16-bit activations and softmax, 1-byte dropout masks,
// unfused attention, GELU, F = 4h, LayerNorm) for the spec's layout: no parallelism
// s*b*h*(34 + 5*a*s/h); tensor parallel s*b*h*(10 + 24/t + 5*a*s/(h*t)); tensor + sequence
// parallel s*b*h*(34/t + 5*a*s/(h*t)). For tests and docs.
double PaperActivationBytesPerLayer(const SearchSpec& spec);

}  // namespace remat::search
