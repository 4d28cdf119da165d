// FP8 linears of the trial engine (model.fp8 with model.fp8_recipe tensorwise or delayed), as
// Transformer Engine runs them under Megatron Core on Hopper (engine-internal; includes LibTorch).
// Derivation: docs/transformer-engine.md section 7 (NVIDIA/TransformerEngine at d0067d0,
// transformer_engine/pytorch/module/linear.py, module/base.py, tensor/float8_tensor.py).
//
// - GEMMs through at::_scaled_mm with one fp32 scale per tensor: forward x(e4m3) W^T(e4m3);
//   backward dgrad g W and wgrad g^T x with the gradient in e4m3 (fp8 e4m3) or e5m2 (hybrid).
// - Saved for backward: the input's FP8 transpose (the "columnwise" copy TE keeps after the
//   forward GEMM; 1 byte per element) and its scale; no bf16 copy of the input. A norm feeding
//   the linear therefore leaves only the FP8 copy, as TE's fused norm kernel does.
// - Weights: a persistent FP8 workspace per weight (rowwise data and its transpose, 2 bytes per
//   parameter), remade on the first micro-batch of each step (NewStep; TE: linear.py
//   is_first_microbatch).
// - Scaling: tensorwise (current scaling) takes each tensor's own amax; delayed keeps an amax
//   history per tensor with Megatron's defaults (fp8_amax_history_len 1, fp8_amax_compute_algo
//   most_recent, fp8_margin 0: NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py
//   at d98e8a6) and quantizes with the scale from the history before this use (first use: 1).
//
// Not as TE: delayed scaling's amaxes are not reduced over ranks, and a recomputed region's
// replay advances the history again (TE restores it); neither changes what is kept in memory.
#pragma once

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "engine/ops.h"
#include "search/spec.h"

// The one place that decides whether this build has FP8 GEMMs: LibTorch 2.5 or later has the
// float8 dtypes and _scaled_mm with per-tensor scale arguments.
#if TORCH_VERSION_MAJOR >= 3 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5)
#define REMAT_ENGINE_FP8 1
#endif

namespace remat::engine {

// Why this build or this device cannot run the spec's FP8 linears ("" when it can, or when FP8
// is off): one line naming model.fp8. Needs LibTorch with FP8 (REMAT_ENGINE_FP8) and a CUDA
// device of compute capability 8.9 or later (Transformer Engine's own floor,
// transformer_engine/pytorch/quantization.py at d0067d0, _compute_fp8_support).
std::string Fp8Unsupported(const search::SearchSpec& spec, const at::Device& device);

// The FP8 state of one model: per weight its workspace, per linear its delayed-scaling histories.
// Keys are the weights' parameter indexes. Not thread-safe (the trial's one compute thread).
class Fp8Linears {
 public:
  explicit Fp8Linears(const search::ModelSpec& m);
  ~Fp8Linears();

  // y = x W^T (+ bias) in FP8 on `rt`'s device; `mode` as engine::Linear (no sequence
  // parallelism: search::BuiltinBackendProblem refuses it with FP8). `save_original` (ignored
  // under delayed scaling): keep the bf16 input instead of its FP8 copy and quantize it again in
  // backward, as Megatron sets TE's linear_proj to for non-delayed recipes because the attention
  // kernel keeps that tensor anyway (NVIDIA/Megatron-LM megatron/core/transformer/attention.py at
  // d98e8a6, set_save_original_input). Throws where Fp8Unsupported would say why.
  at::Tensor Apply(const Runtime& rt, int key, const at::Tensor& x, const at::Tensor& weight,
                   const at::Tensor& bias, LinearMode mode, bool save_original = false);

  // A new training step: each weight's workspace is remade at its next use (Transformer Engine
  // requantizes on the first micro-batch of a step, after the optimizer changed the weights).
  void NewStep();

  // Bytes held by the weight workspaces (static memory, beside the bf16 weights).
  uint64_t WorkspaceBytes() const;

  struct State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace remat::engine
