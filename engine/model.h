// The GPT decoder of the trial engine (engine-internal; includes LibTorch).
//
// Mirrors Megatron Core's GPTModel with the local (non-Transformer-Engine) layer spec and fusions
// off, so that the same tensors are held for backward: vocab-parallel embedding (+ learned
// absolute positions), N transformer layers (input norm, self-attention or MLA, bias-dropout-add,
// pre-MLP norm, dense MLP or MoE, bias-dropout-add), final norm, output layer and vocab-parallel
// cross-entropy. Recompute is placed where Megatron places it (engine/README.md, "What each label frees").
//
// The model declares its parameters (ParamInfo); the trial runner allocates, initialises and
// shards them and fills ParamInfo::value before the first Loss(). Not thread-safe.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>
#include <vector>

#include "search/memory_model.h"  // PaddedVocabSize
#include "search/pipeline.h"
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
  // Experts: an expert weight has its gradient reduced over the expert-data-parallel group.
  // This rank's shard is cut from the full tensor viewed as `expert_view` (empty: held whole):
  // dimension `expert_dim` indexes experts (split over EP: this rank's local experts),
  // dimension `etp_dim` the expert FFN width (split over expert TP); engine/moe_dispatch.h
  // ExpertShard. An absent parameter is another EP rank's expert (sequential experts): declared
  // so every rank initialises in the same order, never held.
  bool expert = false;
  std::vector<int64_t> expert_view;
  int expert_dim = -1;
  int etp_dim = -1;
  bool absent = false;
  // Pipeline parallel: a parameter of another stage's layers is declared (every rank initialises
  // in the same order, so PP > 1 starts from PP = 1's weights) and `absent`. With tied embeddings
  // the last stage holds a copy of the word embedding (Megatron's shared embedding): `copy_of` is
  // the index of the parameter it starts from (it draws nothing itself); `pipeline_tied` marks the
  // embedding and its copy, whose gradients are summed over the embedding group (first and last
  // stage); the copy is `shared` and left out of the gradient norm, as Megatron's
  // param_is_not_shared.
  int copy_of = -1;
  bool pipeline_tied = false;
  bool shared = false;
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
  // Returns the mean loss (fp32 scalar) with its graph. Only without pipeline parallelism.
  at::Tensor Loss(const at::Tensor& tokens, const at::Tensor& labels);

  // Pipeline parallel: this rank's model chunks are search::ChunksOf(spec, pp rank), each built
  // and recomputed as one Megatron TransformerBlock (recompute_num_layers counts per chunk).
  int NumChunks() const;
  // Forward of one micro-batch through chunk `chunk` of this rank: from `tokens` on the chunk that
  // holds the embedding, else from `input` (the previous stage's activation, ActivationShape()).
  // Returns the mean loss (fp32 scalar) on the chunk that holds the loss (`labels` used there),
  // else the activation for the next stage.
  at::Tensor Forward(int chunk, const at::Tensor& input, const at::Tensor& tokens,
                     const at::Tensor& labels);
  // The activation passed between stages: [seq (/ TP under sequence parallel), micro_batch, hidden].
  std::vector<int64_t> ActivationShape() const;

  // Called before each training step's first micro-batch (FP8 weight workspaces are remade then).
  void NewStep();

  // Static bytes of Transformer Engine's FP8 weight workspaces (engine/fp8_linear.h) once the
  // first forward has made them; 0 without FP8.
  uint64_t Fp8WorkspaceBytes() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat::engine
