// The dtypes of a trial's main-gradient buffer and optimizer state, as Megatron Core allocates
// them, and AdamW on one shard in those dtypes (engine-internal; includes LibTorch).
//
// - grad_reduce_in_fp32: false (bf16 runs): the flat main-gradient buffer is bf16 (Megatron-LM
//   megatron/core/distributed/param_and_grad_buffer.py at d98e8a6: grad_dtype = param.dtype unless
//   grad_reduce_in_fp32). Without the precision-aware optimizer Megatron's optimizer upcasts each
//   shard's gradient to an fp32 copy at step time (`shard_model_grad.float()`,
//   megatron/core/optimizer/distrib_optimizer.py at d98e8a6, _copy_model_grads_to_main_grads):
//   a transient 4 bytes per shard element, gone after the step.
// - use_precision_aware_optimizer (bf16 runs): Transformer Engine's FusedAdam holds the master
//   weights and the moments (TransformerEngine transformer_engine/pytorch/optimizers/fused_adam.py
//   at d0067d0): an fp32 master as the int16 remainder of the bf16 parameter
//   (store_param_remainders, Megatron's default), an fp16 master as fp16, the moments in
//   exp_avg_dtype / exp_avg_sq_dtype; it reads the gradient buffer as it is (decoupled_grad), with
//   no fp32 copy. FP8 (uint8) moments are not run (search::BuiltinBackendProblem refuses them).
//
// Static bytes are then what search/static_memory.h's BytesPerParameter counts.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "search/spec.h"

namespace remat::engine {

enum class MasterWeights {
  kNone,       // fp32 runs: the fp32 parameter is its own master
  kFp32,       // Megatron's fp32 copy (Float16Optimizer / DistributedOptimizer)
  kRemainder,  // FusedAdam's int16 low halves of the fp32 master (the bf16 parameter is the high)
  kFp16,       // FusedAdam with main_params_dtype fp16
};

struct OptimizerDTypes {
  at::ScalarType param = at::kFloat;
  at::ScalarType grad = at::kFloat;  // the flat main-gradient buffer
  MasterWeights master = MasterWeights::kNone;
  at::ScalarType exp_avg = at::kFloat;
  at::ScalarType exp_avg_sq = at::kFloat;
  bool precision_aware = false;

  // True when the step first copies the (16-bit) gradient shards to fp32, as Megatron's
  // non-precision-aware optimizers do.
  bool UpcastsGrads() const { return !precision_aware && grad != at::kFloat; }
  // The master weights' storage dtype (undefined-free: kFloat for kNone, never allocated then).
  at::ScalarType MasterStorage() const;
  // Weights and gradient buffer over `numel` elements, master weights and moments over
  // `state_numel` (this rank's shards): the trial's static bytes once the state exists.
  uint64_t StaticBytes(int64_t numel, int64_t state_numel) const;
};

// The dtypes `spec` asks for (train.precision, grad_reduce_in_fp32, the precision-aware
// optimizer's dtypes). Call after search::BuiltinBackendProblem accepted the spec.
OptimizerDTypes OptimizerDTypesOf(const search::SearchSpec& spec);

// The master weights of a shard as the optimizer starts: Megatron's clone().float(), FusedAdam's
// zero remainders or the parameter in fp16. No-op for MasterWeights::kNone.
void InitMasterWeights(const OptimizerDTypes& types, const at::Tensor& param, at::Tensor& master);

struct AdamHyper {
  double lr = 1e-4, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
  int step = 1;  // 1-based, for the bias corrections
};

// AdamW on one shard, clipped by `coef` (a [1] fp32 tensor): `grad` (fp32: also the scratch that
// holds the denominator, as a fused Adam needs no extra memory; 16-bit: read, never written),
// `param` (updated from the master), `master` (ignored for kNone), the moments. With every buffer
// fp32 this runs in place with no temporaries; otherwise it works in chunks (4 Ki elements on
// the CPU, 4 Mi on a GPU), each upcast to fp32, updated and written back in its storage dtype (as
// FusedAdam does in registers), so the temporaries stay far below the activations.
void AdamUpdate(const OptimizerDTypes& types, const AdamHyper& hyper, at::Tensor grad,
                const at::Tensor& coef, at::Tensor param, at::Tensor master, at::Tensor exp_avg,
                at::Tensor exp_avg_sq);

// The fp32 master weights of a bf16 `param` and its int16 `remainder` (exact), and the inverse:
// the bf16 parameter (rounded to nearest, ties away from zero) and the remainder that makes the
// pair exact again. Exposed for tests.
at::Tensor MasterFromRemainder(const at::Tensor& param, const at::Tensor& remainder);
void SplitMaster(const at::Tensor& master, at::Tensor param, at::Tensor remainder);

}  // namespace remat::engine
