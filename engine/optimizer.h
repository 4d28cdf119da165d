// The trial's optimizer state and step.
//
// Flat buffers, as Megatron's DDP grad buffer and Float16Optimizer: the bf16 (or fp32) parameters,
// fp32 main gradients, fp32 master weights and the two Adam moments.
//
// With the distributed optimizer (train.use_distributed_optimizer, Megatron's
// DistributedOptimizer) the parameter and main-gradient buffers stay whole, but every
// data-parallel rank keeps master weights and Adam moments for its 1/DP shard of each bucket
// only: after the backward each bucket's gradients are reduce-scattered over its group (dense:
// DP, expert: expert-DP), each rank clips and updates its shard, and the parameters are
// all-gathered back. Static bytes are then 2 + 4 + 12/DP per parameter (fp32: 4 + 4 + 8/DP), as
// search/static_memory.h's BytesPerParameter counts them. The gradient buffer, master weights
// and moments take the dtypes of `types` (engine/te_optimizer.h: bf16 gradients, the
// precision-aware optimizer).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/model.h"
#include "engine/ops.h"
#include "engine/te_optimizer.h"

namespace remat::engine {

class Optimizer {
 public:
  // Lays the parameters of `params` (this rank's) into the flat buffers, registers the hooks that
  // add each gradient into the main-gradient buffer, and draws nothing: the weights are the
  // model's. Optimizer state is created at the first Step(), as Megatron's is.
  Optimizer(const Runtime& rt, std::vector<ParamInfo>& params, const OptimizerDTypes& types,
            uint64_t seed, bool distributed);
  ~Optimizer();
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  int64_t numel() const;  // the buffers' elements, padding included
  // Bytes of weights, main gradients, master weights and Adam states once all exist.
  uint64_t StaticBytes() const;
  void ZeroGrad();  // also clears Step()'s scratch use of the gradient buffer
  // Megatron's finalize_model_grads + clip_grad_norm + Adam step. Returns the gradient norm
  // (before clipping) as a device scalar.
  at::Tensor Step();

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat::engine
