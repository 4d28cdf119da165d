// Autograd building blocks of the trial engine (engine-internal; includes LibTorch).
//
// - Checkpoint: Megatron's CheckpointFunction. Runs a region without building a graph, keeps only
//   its inputs, and in backward replays it (with the RNG state of the forward) and backpropagates.
// - OutputDiscardingCheckpoint: Megatron's CheckpointWithoutOutput. Runs a region without a graph,
//   keeps its inputs; after the consumers have saved the outputs, DiscardOutputs frees the outputs'
//   storage (the tensors keep their shape) and registers a hook on a later tensor; when that
//   tensor's gradient arrives the region is replayed and the fresh results are shared into the
//   discarded storages without a copy, before any consumer's backward reads them.
// - Linear: Megatron's column/row-parallel linear layers (input saved, sequence-parallel input
//   re-gathered in backward rather than saved), RMSNorm, the vocab-parallel embedding and
//   cross-entropy, sequence-parallel scatter and tensor-parallel copy regions, grouped expert GEMM.
//
// Every function is called on the trial's one compute thread. Collective failures surface as
// CollectiveError, allocation failures as c10 errors; the trial runner turns them into results.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <vector>

#include "engine/collectives.h"
#include "search/spec.h"  // CpCommType

namespace remat::engine {

// The process-wide context of one rank's trial.
struct Runtime {
  Collectives* comm = nullptr;
  Group tp;  // tensor-parallel group of this rank
  Group dp;  // data-parallel group of this rank
  // Expert parallel (carved out of DP): the ranks that split the experts among them, and the
  // ranks holding the same experts (expert gradients are reduced over the latter).
  Group ep;
  Group expert_dp;
  // Megatron's expert grid (search/rank_layout.h): the ranks that split each expert's linears
  // (expert tensor parallel, ETP) and the ETP x EP block the allgather dispatcher spans. Groups
  // of one, or the TP group, when the grid adds nothing.
  Group expert_tp;
  Group expert_tp_ep;
  // Pipeline parallel: the ranks holding the other stages of this rank's model replica (member
  // index = pipeline rank), and, with tied embeddings, the first and last stage (Megatron's
  // embedding group; a group of one elsewhere). Empty groups without pipeline parallelism.
  Group pp;
  Group embedding;
  // Context parallel (engine/context_parallel.h): the ranks that split one sequence, and
  // Megatron's dp-cp group, over which non-expert gradients are reduced (the DP group when CP = 1).
  Group cp;
  Group dp_cp;
  search::CpCommType cp_comm_type = search::CpCommType::kP2p;
  bool sequence_parallel = false;
  at::Device device = at::kCPU;

  int tp_size() const { return tp.size(); }
  int tp_rank() const { return tp.rank; }
  int ep_size() const { return ep.size() > 0 ? ep.size() : 1; }
  int ep_rank() const { return ep.size() > 0 ? ep.rank : 0; }
  int etp_size() const { return expert_tp.size() > 0 ? expert_tp.size() : 1; }
  int etp_rank() const { return expert_tp.size() > 0 ? expert_tp.rank : 0; }
  int pp_size() const { return pp.size() > 0 ? pp.size() : 1; }
  int pp_rank() const { return pp.size() > 0 ? pp.rank : 0; }
  int cp_size() const { return cp.size() > 0 ? cp.size() : 1; }
  int cp_rank() const { return cp.size() > 0 ? cp.rank : 0; }
};

// ---- RNG: Megatron restores the forward's RNG state when it replays a region.
// Copies of the default generators (plain objects, not tensors: on CPU runs a state tensor would
// count as device memory, which Megatron's host-side RNG snapshot is not).
struct RngState {
  at::Generator cpu;
  at::Generator cuda;  // undefined on CPU runs
};
RngState CaptureRng(const Runtime& rt);
void RestoreRng(const Runtime& rt, const RngState& state);

// ---- Recompute.
using Region = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>& inputs)>;

// Megatron's tensor_parallel.checkpoint (distribute_saved_activations=false).
std::vector<at::Tensor> Checkpoint(const Runtime& rt, Region fn, const std::vector<at::Tensor>& inputs);

class OutputDiscardingCheckpoint {
 public:
  OutputDiscardingCheckpoint();
  ~OutputDiscardingCheckpoint();
  std::vector<at::Tensor> Run(const Runtime& rt, Region fn, const std::vector<at::Tensor>& inputs);
  // Frees the outputs' storage; replays the region when `hook_tensor`'s gradient is computed.
  void DiscardOutputs(const at::Tensor& hook_tensor);

  struct State;

 private:
  c10::intrusive_ptr<State> state_;
};

// ---- Layers.
// Dropout as torch.nn.Dropout in training: the identity at p == 0 (nothing saved), else
// native_dropout (a one-byte mask saved).
at::Tensor Dropout(const at::Tensor& x, double p);

enum class LinearMode {
  kLocal,   // a plain linear layer (also TP-duplicated layers such as MLA down-projections)
  kColumn,  // output features split over TP; input copied (SP: all-gathered along the sequence)
  kRow,     // input features split over TP; output all-reduced (SP: reduce-scattered)
};
// y = x W^T (+ b). `bias` may be undefined (kRow never takes one: Megatron adds it after the
// reduction, in bias-dropout-add).
at::Tensor Linear(const Runtime& rt, const at::Tensor& x, const at::Tensor& weight,
                  const at::Tensor& bias, LinearMode mode);

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor LayerNorm(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                     double eps);

// ids [b, s] (int64), weight [vocab/tp, h] -> [b, s, h], summed over TP.
at::Tensor VocabParallelEmbedding(const Runtime& rt, const at::Tensor& ids,
                                  const at::Tensor& weight, int64_t vocab_start);
// How the softmax's exponentials reach the fp32 logits. Megatron's unfused vocab-parallel
// cross-entropy writes them in place. Its native fusion (cross_entropy_loss_fusion with
// cross_entropy_fusion_impl native, megatron/core/fusions/fused_cross_entropy.py at Megatron-LM
// d98e8a6) runs the same in-place code under torch.compile; functionalization turns the mutation
// of the compiled helper's input into a new buffer copied back into the input, so one more fp32
// logits-sized buffer is live for a moment in the loss's forward (measured on an H200,
// docs/fidelity.md). kThroughBuffer allocates that buffer; the values are the same.
enum class SoftmaxExp { kInPlace, kThroughBuffer };

// logits [s, b, vocab/tp], target [s, b] -> per-token loss [s, b] in fp32. Holds the fp32 softmax
// for backward, as Megatron's vocab_parallel_cross_entropy (and its native fusion, `exp`).
at::Tensor VocabParallelCrossEntropy(const Runtime& rt, const at::Tensor& logits,
                                     const at::Tensor& target, int64_t vocab_start,
                                     SoftmaxExp exp = SoftmaxExp::kInPlace);

// The vocabulary-parallel softmax both cross-entropies share: `x` [s, b, vocab/tp] fp32 logits
// becomes, in place, this shard's softmax (max and sum of exponentials combined over TP); the
// per-token loss [s, b] fp32, and where each target falls in this shard (`local` index,
// `outside` when another shard holds it).
struct VocabParallelSoftmax {
  at::Tensor loss;
  at::Tensor local;
  at::Tensor outside;
};
VocabParallelSoftmax SoftmaxInPlace(const Runtime& rt, at::Tensor& x, const at::Tensor& target,
                                    int64_t vocab_start, SoftmaxExp exp = SoftmaxExp::kInPlace);

// Sequence parallel: keep this rank's slice of dim 0 (backward: all-gather).
at::Tensor ScatterToSequenceParallel(const Runtime& rt, const at::Tensor& x);
// Sequence parallel: all-gather along dim 0 over TP (backward: reduce-scatter).
at::Tensor GatherFromSequenceParallel(const Runtime& rt, const at::Tensor& x);
// All-gather along the last dimension over TP (backward: this rank's slice of the gradient).
at::Tensor GatherFromTensorParallel(const Runtime& rt, const at::Tensor& x);
// Identity forward, all-reduce of the gradient over TP in backward.
at::Tensor CopyToTensorParallel(const Runtime& rt, const at::Tensor& x);

// x [tokens, k] sorted by expert, weight [experts, k, n], tokens_per_expert sums to tokens.
at::Tensor GroupedGemm(const at::Tensor& x, const at::Tensor& weight,
                       const std::vector<int64_t>& tokens_per_expert);

// Expert parallel token exchange over rt.ep: rows of x (dim 0) packed by destination member,
// send_rows[j] of them to member j; returns the received rows packed by source member. Backward
// is the reverse exchange of the gradient.
at::Tensor AllToAllRows(const Runtime& rt, const at::Tensor& x, const std::vector<int64_t>& send_rows,
                        const std::vector<int64_t>& recv_rows);

// The Collectives element type of a tensor's dtype (float32, bfloat16, float64, int64; throws
// std::invalid_argument for others).
DataType CollectiveType(at::ScalarType t);

// In-place all-reduce of a contiguous tensor over `group`.
void AllReduceTensor(const Runtime& rt, const Group& group, at::Tensor& t, ReduceOp op);

}  // namespace remat::engine
