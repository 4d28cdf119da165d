// The fused layers Megatron Core runs with its fusions on, and the parts of the Transformer Engine
// layer that change what is kept for backward (engine-internal; includes LibTorch). Each is an
// autograd function that saves exactly what the fused kernel saves; docs/transformer-engine.md
// derives those from NVIDIA/Megatron-LM at d98e8a6 and NVIDIA/TransformerEngine at d0067d0.
//
// - FusedSwiglu: Megatron's bias_swiglu_impl / weighted_bias_swiglu_impl
//   (megatron/core/fusions/fused_bias_swiglu.py): keeps its input (and bias, probabilities) only,
//   recomputes the activation in backward.
// - FusedRope: Transformer Engine's FusedRoPEFunc (transformer_engine/pytorch/attention/rope.py):
//   keeps only the shared fp32 frequency table, no per-call cos/sin tables.
// - FusedBiasDropoutAdd: Megatron's bias_dropout_add_fused_train (fusions/fused_bias_dropout.py
//   under torch.compile): keeps the one-byte keep-mask when p > 0, nothing when p == 0.
// - FusedAttention: a fused attention kernel's contract (FlashAttention / cuDNN FusedAttention):
//   keeps q, k, v, the output and the fp32 log-sum-exp [b, heads, s]; backward recomputes the
//   probabilities (and replays the dropout mask from a seed). This is the reference
//   implementation (per-sequence GEMMs, the s x s scores only transiently), used where LibTorch
//   has no scaled_dot_product_attention with GQA; memory-equivalent, not fast.
// - TeAttentionInputs: Transformer Engine's DotProductAttention makes strided q, k, v contiguous
//   (get_qkv_layout), so the fused QKV output is no longer held.
#pragma once

#include <ATen/ATen.h>

namespace remat::engine {

// x [..., 2F] (fc1's output without its bias), bias [2F] or undefined, probs [tokens, 1] or
// undefined (MoE experts) -> silu(a) * b (* probs), [..., F], in x's dtype.
at::Tensor FusedSwiglu(const at::Tensor& x, const at::Tensor& bias, const at::Tensor& probs);

// t [s, b, n, D], freqs [s, 1, 1, rot] fp32 (rot <= D; the rest of t passes through) ->
// Megatron's non-interleaved rotary embedding, a new contiguous tensor.
at::Tensor FusedRope(const at::Tensor& t, const at::Tensor& freqs);

// residual + dropout(x + bias, p) (bias may be undefined).
at::Tensor FusedBiasDropoutAdd(const at::Tensor& x, const at::Tensor& bias,
                               const at::Tensor& residual, double p);

// q [s, b, n, d], k [s, b, g, d], v [s, b, g, dv] (n a multiple of g; head i reads group
// i / (n / g), as Megatron's repeat_interleave) -> causal attention [s, b, n, dv], contiguous,
// with dropout p on the probabilities.
at::Tensor FusedAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          double scale, double p);

// Makes q, k and v contiguous in place (copies of views), as Transformer Engine does before its
// kernels.
void TeAttentionInputs(at::Tensor& q, at::Tensor& k, at::Tensor& v);

}  // namespace remat::engine
