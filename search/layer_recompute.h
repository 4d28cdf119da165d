// What recompute does to one transformer layer in the memory model (search/memory_model.h): the
// gradient working set of its backward, per half; what selective labels discard from it and
// replay, per half; the highest its backward reaches above what is held. The layer's activations
// come from search/layer_activations.h. docs/memory-model.md, sections 3 and 4.
// Thread-safety: pure functions of their arguments.
#pragma once

#include "search/layer_activations.h"
#include "search/layer_shape.h"
#include "search/policy.h"
#include "search/spec.h"

namespace remat::search {

// Gradient working set of one layer's backward above what the layer holds, for its MLP half
// and its attention half (approximate; see docs).
struct LayerWork {
  double attn = 0;
  double mlp = 0;
};

// The working set of layer `layer` (global index) on one rank for one micro-batch.
LayerWork EstimateLayerWork(const SearchSpec& spec, int layer);

// The MLP half of what a layer holds (its pre-MLP norm output, the MLP or MoE internals, the
// MLP-side dropout mask); the rest is the attention half. Backward frees the MLP half first.
double MlpSide(const LayerActivations& a);

// What selective `policy` discards on one layer, by half.
struct Discard {
  double attn = 0;
  double mlp = 0;
  double Total() const { return attn + mlp; }
};

// What selective `policy` discards on layer `layer` (global index) whose activations are `a`:
// nothing under full recompute; labels act only where they have an effect (mlp on dense layers,
// moe, moe_act and shared_experts on MoE layers, moe superseding the other two, mla_up_proj with
// MLA). May be slightly negative in attention where a checkpoint pins more than the region holds.
Discard SelectiveDiscard(const SearchSpec& spec, const Policy& policy, const LayerActivations& a,
                         int layer);

// Extra forward FLOPs per micro-batch that selective `policy` replays on layer `layer` (global
// index) whose FLOPs are `f`, where its labels have an effect as in SelectiveDiscard.
double SelectiveFlops(const SearchSpec& spec, const Policy& policy, const LayerFlops& f,
                      int layer);

// Highest live bytes above everything held (this layer's kept bytes included) while one layer's
// backward runs with its selective discards `d` replayed: the MLP half first (its discarded
// region replayed, its working set), then the attention half, once the MLP half's kept and
// replayed tensors are freed. A region of one half is therefore never live with the other's:
// Megatron's output-discarding checkpoints (mla_up_proj, moe_act) recompute when the gradient of
// the tensor after them arrives (CheckpointWithoutOutput.discard_output_and_register_recompute,
// Megatron-LM megatron/core/tensor_parallel/random.py at d98e8a6), the others in their own
// backward, so each replay runs inside its own half's backward.
double SelectiveLayerBackward(const LayerActivations& a, const LayerWork& w, const Discard& d);

}  // namespace remat::search
