// Multi-token prediction (model.mtp_num_layers) in the memory and FLOP model.
//
// Megatron Core's MultiTokenPredictionLayer (megatron/core/transformer/multi_token_prediction.py
// at d98e8a6): the shifted tokens' embedding goes through enorm, the main model's hidden states
// through hnorm, their concatenation [s, b, 2h] through eh_proj (a column-parallel 2h -> h linear
// without bias), then one transformer layer built from the decoder's last layer spec (an MoE layer
// for DeepSeek-V3), then final_layernorm and the shared output head, whose logits feed a second
// cross-entropy loss. The MTP layers sit on the stage the layout's `m` names, else on the last
// chunk of the last rank (search/pipeline.h StageChunk::mtp_layers); a rank holding MTP layers
// also builds the embedding (GPTModel builds it when pre_process or mtp_process).
//
// This file holds the terms outside the MTP's transformer layer; the layer itself is costed as
// the decoder's last layer by the memory model, under the policy's labels (selective labels apply
// inside it; full recompute checkpoints it under the uniform method and, as Megatron Core skips it
// under block, keeps it whole there). Pure functions.
#pragma once

#include <string>

#include "search/spec.h"

namespace remat::search {

// The global index of the decoder layer whose spec an MTP layer's transformer layer copies.
int MtpInnerLayer(const SearchSpec& spec);

// Parameters of one MTP layer on its rank outside its transformer layer: enorm, hnorm,
// final_layernorm and eh_proj (split over TP).
double MtpExtraParams(const SearchSpec& spec);

// What one MTP layer holds for backward for one micro-batch outside its transformer layer, given
// the sizes the memory model uses for the main model's head: `final_norm` (final norm's input and
// statistics, the output layer's input) and `logits` (the fp32 softmax the cross-entropy keeps).
// Adds the shifted embedding's output (enorm's input), hnorm's input, both norms' statistics and
// eh_proj's input (the [s, b, 2h] concatenation, sequence-sharded under SP). With `checkpointed`
// (full recompute, uniform method: Megatron's _checkpointed_forward wraps eh_proj, the layer and
// final_layernorm) only the checkpoint's inputs beyond what the main head holds anyway (the
// shifted embedding's output) and the block's concatenated output (the main head's copy of the
// decoder's hidden states and this layer's output, which the heads read) stay, with the ids and
// the head's logits.
double MtpHeldBytes(const SearchSpec& spec, double final_norm, double logits,
                    bool checkpointed = false);

// Megatron-LM's num_floating_point_operations terms for MTP, per token (forward and backward):
// each MTP layer's norms and eh_proj, 3 x 2 x (3h + 2h^2) (training.py at d98e8a6; the
// transformer layer and the extra logits are counted with the decoder's).
double MtpFlopsPerToken(const SearchSpec& spec);

// What of MTP the builtin engine (engine/mtp_block.h) does not run, or "": context parallelism
// (roll_tensor's exchange between CP ranks), MTP layers on a stage without the loss (Megatron's
// standalone MTP stage hands its hidden states on), and learned absolute positions with pipeline
// parallelism (the MTP stage would need the position embedding too). Called by
// BuiltinBackendProblem.
std::string MtpEngineProblem(const SearchSpec& spec);

}  // namespace remat::search
