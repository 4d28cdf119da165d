// The GPT decoder of the trial engine (engine-internal; includes LibTorch).
//
// Mirrors Megatron Core's GPTModel with the local (non-Transformer-Engine) layer spec and fusions
// off, so that the same tensors are held for backward: vocab-parallel embedding (+ learned
// absolute positions), N transformer layers (input norm, self-attention or MLA, bias-dropout-add,
// pre-MLP norm, dense MLP or MoE, bias-dropout-add), final norm, output layer and vocab-parallel
// cross-entropy. Recompute is placed where Megatron places it (README.md, "What each label frees").
//
// The model declares its parameters (ParamInfo); the trial runner allocates, initialises and
// shards them and fills ParamInfo::value before the first Loss(). Not thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "search/memory_model.h"  // PaddedVocabSize
#include "search/policy.h"
#include "search/spec.h"
#include "engine/ops.h"

namespace remat::engine {

struct ParamInfo {
  std::string name;
  std::vector<int64_t> full_shape;  // unsharded
  std::vector<int64_t> shape;       // this rank's shard
  int shard_dim = -1;               // -1: replicated over TP
  int shard_blocks = 1;             // shard_dim holds this many equal blocks, each split over TP
  double init_std = 0;              // normal(0, init_std); 0: filled with init_value
  double init_value = 0;
  bool sequence_parallel_grad = false;  // replicated, but its gradient is partial under SP
  // Expert parallel: an expert weight has its gradient reduced over the expert-data-parallel
  // group. With expert_shards > 1 this rank holds the flat chunk ep_rank of the full tensor
  // (grouped experts: its local experts). An absent parameter is another EP rank's expert
  // (sequential experts): declared so every rank initialises in the same order, never held.
  bool expert = false;
  int expert_shards = 1;
  bool absent = false;
  at::Tensor value;                     // set by the trial runner
  bool tp_duplicate() const { return shard_dim < 0; }
};

// Why this engine cannot run `spec` (status invalid), or "" when it can: search::ValidateSpec,
// search::BuiltinBackendProblem (the engine's limits, also checked at submit), and what depends
// on the LibTorch it was built against.
std::string UnsupportedReason(const search::SearchSpec& spec, const search::Policy& policy);

class GptModel {
 public:
  // `rt` must outlive the model. Call UnsupportedReason first.
  GptModel(const search::SearchSpec& spec, const search::Policy& policy, const Runtime& rt,
           at::ScalarType dtype);
  ~GptModel();

  std::vector<ParamInfo>& params();

  // Forward of one micro-batch: tokens and labels [micro_batch, seq] (int64, on the device).
  // Returns the mean loss (fp32 scalar) with its graph.
  at::Tensor Loss(const at::Tensor& tokens, const at::Tensor& labels);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat::engine
