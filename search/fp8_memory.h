// FP8 (model.fp8 with model.fp8_recipe) in the memory model: the bytes Transformer Engine keeps
// per element of an FP8 tensor and per TE-linear weight. Derivation and sources:
// docs/transformer-engine.md section 7 (NVIDIA/TransformerEngine at d0067d0:
// transformer_engine/pytorch/module/linear.py, layernorm_linear.py, module/base.py,
// tensor/float8_tensor.py, tensor/mxfp8_tensor.py, tensor/float8_blockwise_tensor.py).
// Standard library only. The figures are Hopper's (H100/H200: an FP8 GEMM reads only "TN"
// operands, so a transpose is kept beside the data).
#pragma once

#include "search/spec.h"

namespace remat::search {

bool Fp8On(const ModelSpec& m);

// Bytes per element of a tensor a TE module saves in FP8 (its quantized input): 1 byte of data
// plus the recipe's scales: delayed and tensorwise one fp32 per tensor (0 per element); mxfp8 one
// E8M0 byte per 32 elements; blockwise one fp32 per 1 x 128 block (4/128). Custom recipes are
// counted as tensorwise. Only with FP8 on.
double Fp8SavedBytesPerElement(const ModelSpec& m);

// Static bytes a TE-linear weight parameter (QKV, projection, fc1, fc2, experts; not embeddings,
// output layer, norms, router) takes beyond its bf16 weight under FP8. Without fp8_param_gather:
// the FP8 workspace TE keeps per weight and refreshes on the first micro-batch (rowwise data and
// its columnwise transpose): 2 (delayed, tensorwise), 2 + 1/16 (mxfp8), 2 + 8/16384 (blockwise,
// 128 x 128 fp32 scales for each copy). With fp8_param_gather the weight itself is FP8 (its bytes
// replace the bf16 weight's 2) and a columnwise copy is made for the backward: 0 (delayed,
// tensorwise), 1/16 (mxfp8), 8/16384 (blockwise). 0 without FP8.
double Fp8ExtraBytesPerLinearWeight(const SearchSpec& spec);

}  // namespace remat::search
