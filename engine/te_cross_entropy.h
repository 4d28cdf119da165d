// Transformer Engine's vocab-parallel cross-entropy (model.cross_entropy_fusion_impl: te), as the
// trial engine runs it (engine-internal; includes LibTorch).
//
// TE's CrossEntropyFunction (TransformerEngine transformer_engine/pytorch/cross_entropy.py and
// transformer_engine/pytorch/triton/cross_entropy.py at d0067d0) computes the loss and the
// gradient with respect to the logits in the forward, into one fp32 [tokens, vocab/TP] buffer, and
// saves only that gradient (no softmax, no targets). Its backward scales the saved gradient in
// place by the incoming per-token gradient and returns it; autograd casts it to the logits' dtype.
// What is held for backward is therefore 4 bytes per logit, the memory model's `te` term
// (docs/transformer-engine.md section 6), against the native path's fp32 softmax plus targets.
#pragma once

#include <ATen/ATen.h>

#include "engine/ops.h"

namespace remat::engine {

// logits [s, b, vocab/tp] (this rank's vocabulary slice starting at `vocab_start`), target [s, b]
// -> per-token loss [s, b] in fp32, equal to VocabParallelCrossEntropy's; keeps the fp32 gradient
// for backward.
at::Tensor TeVocabParallelCrossEntropy(const Runtime& rt, const at::Tensor& logits,
                                       const at::Tensor& target, int64_t vocab_start);

}  // namespace remat::engine
