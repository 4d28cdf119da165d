// Megatron Core's multi-token prediction in the trial engine (engine-internal; includes LibTorch).
//
// Megatron-LM megatron/core/transformer/multi_token_prediction.py at d98e8a6
// (MultiTokenPredictionBlock, MultiTokenPredictionLayer, process_mtp_loss, MTPLossAutoScaler),
// per MTP depth k (k = 1 .. mtp_num_layers):
//   ids, labels and the loss mask rolled one more position left (roll_tensor: the last position
//   zeroed); embedding of the rolled ids (the shared word embedding, dropout, SP scatter);
//   enorm(embedding) and hnorm(hidden), concatenated [s, b, 2h]; eh_proj (column-parallel, no
//   bias) and its output gathered over TP (then scattered along the sequence under SP); one
//   transformer layer of the decoder's last layer's kind, under the policy's selective labels;
//   final_layernorm; the shared output layer and cross-entropy; the masked mean of the loss.
// `hidden` of depth 1 is the decoder's output after its final norm; of depth k + 1, depth k's.
// Full recompute with the uniform method checkpoints each MTP layer from its hidden input and
// embedding (_checkpointed_forward); with the block method Megatron skips MTP (kept whole).
// The losses' sum, scaled by mtp_loss_scaling_factor / mtp_num_layers, joins the gradient but not
// the reported loss (MTPLossAutoScaler). The spec has no mtp_loss_scaling_factor field yet: the
// engine uses TransformerConfig's default, 0.1 (DeepSeek-V3's recipe sets 0.1 too); the factor
// changes no memory. Context parallelism is not supported here (roll_tensor
// would exchange the boundary tokens between CP ranks); search::BuiltinBackendProblem refuses it.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "engine/model_params.h"
#include "engine/ops.h"
#include "search/spec.h"

namespace remat::engine {

// TransformerConfig.mtp_loss_scaling_factor's default (Megatron-LM transformer_config.py at
// d98e8a6).
constexpr double kMtpLossScalingFactor = 0.1;

// What the MTP layers borrow from the GPT model.
struct MtpHooks {
  // Token ids [b, s] -> the decoder's input [s (/ TP under SP), b, h]: the MTP stage's word
  // embedding, positions, SP scatter, embedding dropout.
  std::function<at::Tensor(const at::Tensor& ids)> embed;
  // The model's norm with parameters (weight, bias index; bias -1 for RMSNorm).
  std::function<at::Tensor(const at::Tensor& x, int weight, int bias)> norm;
  // Transformer layer `layer` (an index into ModelParams::layers) under the policy's labels.
  std::function<at::Tensor(int layer, const at::Tensor& x)> layer;
  // The output layer and cross-entropy: normed hidden [s (/ TP), b, h], target [s, b] ->
  // per-token loss [s, b] (fp32).
  std::function<at::Tensor(const at::Tensor& hidden, const at::Tensor& target)> head_loss;
  // A parameter's value.
  std::function<const at::Tensor&(int index)> param;
};

struct MtpOutput {
  at::Tensor main_hidden;  // the decoder's hidden states as the main head reads them
  at::Tensor loss;         // the MTP losses' sum, scaled (fp32 scalar with its graph)
};

// The MTP layers and their losses for one micro-batch, as Megatron runs them before the main
// head: `decoder_hidden` is the decoder's normed output, `tokens` and `labels` [b, s] the
// micro-batch's. The block's output concatenates the decoder's and every depth's hidden states
// (one new tensor, which the heads then read chunk by chunk, as process_mtp_loss): the main head
// must read `main_hidden`, its chunk. `checkpoint_whole`: full recompute with the uniform method.
MtpOutput MtpLoss(const Runtime& rt, const search::SearchSpec& spec,
                  const std::vector<ModelParams::MtpParams>& layers, bool checkpoint_whole,
                  const MtpHooks& hooks, const at::Tensor& decoder_hidden,
                  const at::Tensor& tokens, const at::Tensor& labels);

// `main` in the forward; the backward passes its incoming gradient to `main` and to `mtp` alike
// (Megatron's MTPLossAutoScaler, whose scale is the main loss's).
at::Tensor AddMtpLoss(const at::Tensor& main, const at::Tensor& mtp);

}  // namespace remat::engine
