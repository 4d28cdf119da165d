// The pipeline layout of a spec: which global layers each pipeline rank (and each of its virtual
// model chunks) builds, and the order in which Megatron Core's schedules run the forward and
// backward passes of the micro-batches on that rank, hence how many stay in flight.
//
// The split follows Megatron Core's get_num_layers_to_build / get_transformer_layer_offset: an
// even split, or uneven first/last stages (num_layers_in_{first,last}_pipeline_stage), or the
// embedding/loss counted as one layer of the first/last stage (account_for_*_in_pipeline_split);
// with virtual pipelining each rank's layers are cut into VPP equal chunks and the chunks are
// laid out chunk-major over the model: (chunk 0, rank 0), (chunk 0, rank 1), ..., (chunk 1,
// rank 0), ... An explicit layout (parallel.pipeline_model_parallel_layout, search/
// pipeline_layout.h) replaces the split: each (rank, chunk) builds what its stage of the layout
// lists, MTP layers included; without one, the MTP layers (model.mtp_num_layers) sit on the last
// chunk of the last rank, as Megatron Core's mtp_on_this_rank places them. The order follows schedules.py: plain 1F1B (warm-up min(PP - p - 1, M) forwards,
// then one forward and one backward at a time, then the cool-down backwards) and interleaved
// 1F1B (warm-up (PP - p - 1) x 2 + (VPP - 1) x group chunk-forwards, capped at M x VPP, with
// micro-batches taken in groups of `group` = PP per chunk; backwards walk the chunks in reverse).
// docs/memory-model.md, "Pipeline stages", writes the rules out.
//
// All functions are pure functions of their arguments (thread-safe). They expect a spec that
// ValidateSpec accepts; on others they return finite but meaningless answers (never crash).
// `pp_rank` is in [0, pipeline_model_parallel_size), `chunk` in [0, VirtualChunks()).
#pragma once

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "search/spec.h"
#include "search/status.h"

namespace remat::search {

// One model chunk (Megatron: one TransformerBlock, one virtual stage) of one pipeline rank.
struct StageChunk {
  int pp_rank = 0;
  int chunk = 0;               // virtual chunk on this rank (0 without interleaving)
  int first_layer = 0;         // global index of its first transformer layer
  int num_layers = 0;          // may be 0 (e.g. a first chunk that holds only the embedding)
  bool has_embedding = false;  // the first chunk of the first rank: word (+ position) embedding
  bool has_loss = false;       // the last chunk of the last rank: final norm, output layer, loss
  int mtp_layers = 0;          // multi-token-prediction layers it builds (search/mtp_model.h)
};

// The layers of `chunk` on `pp_rank`.
StageChunk ChunkOf(const SearchSpec& spec, int pp_rank, int chunk);

// Every chunk of `pp_rank`, in chunk order.
std::vector<StageChunk> ChunksOf(const SearchSpec& spec, int pp_rank);

// Transformer layers on `pp_rank`, over all its chunks.
int StageLayerCount(const SearchSpec& spec, int pp_rank);

// The most layers any one chunk holds: Megatron applies recompute_num_layers per chunk, so this
// bounds N of full:*:N (a larger N recomputes the same layers).
int MaxChunkLayers(const SearchSpec& spec);

// One compute step of a pipeline rank: the forward or the backward pass of one micro-batch
// through one of its chunks. Communication is not listed (it follows from the order).
struct PipelineOp {
  bool forward = true;
  int microbatch = 0;  // 0 .. NumMicrobatches() - 1
  int chunk = 0;
};

// Megatron's num_warmup_microbatches on `pp_rank`: the forwards run before the first backward
// (chunk-forwards under interleaving), at most M (M x VPP).
int WarmupForwards(const SearchSpec& spec, int pp_rank);

// The compute steps of one training step on `pp_rank`, in Megatron Core's order: every
// micro-batch's forward and backward through every chunk of the rank (2 x M x VPP steps).
std::vector<PipelineOp> ScheduleOps(const SearchSpec& spec, int pp_rank);

// What `pp_rank` holds for backward just before one of its backward steps starts: how many
// micro-batches of each chunk have run forward and await their backward (including the one
// about to run), and which chunk's backward runs. Memory peaks at one of these moments (a
// forward only adds to what the next backward sees).
struct InFlightState {
  int backward_chunk = 0;
  std::vector<int> live_per_chunk;  // indexed by chunk
};

// A list of InFlightStates, shared and immutable: a layout's states are computed once and kept
// (the memory model asks for them once per policy), so the list is handed out, not copied.
// Iterates like a const std::vector.
class InFlightStateList {
 public:
  using const_iterator = std::vector<InFlightState>::const_iterator;
  InFlightStateList() : states_(std::make_shared<const std::vector<InFlightState>>()) {}
  explicit InFlightStateList(std::shared_ptr<const std::vector<InFlightState>> states)
      : states_(std::move(states)) {}
  const_iterator begin() const { return states_->begin(); }
  const_iterator end() const { return states_->end(); }
  size_t size() const { return states_->size(); }
  bool empty() const { return states_->empty(); }
  const InFlightState& operator[](size_t i) const { return (*states_)[i]; }

 private:
  std::shared_ptr<const std::vector<InFlightState>> states_;
};

// The InFlightStates of `pp_rank` over one step at which its memory can peak, in order of first
// occurrence: under interleaving every distinct one; under plain 1F1B the first backward's alone
// (every later state holds as many micro-batches or fewer, of the one chunk). The cost is bounded
// by the layout, not the global batch: the states come from InFlightMicrobatches micro-batches
// of the schedule, which pass through the same ones (at most about 2 x PP x VPP states of VPP
// counts each).
InFlightStateList InFlightStates(const SearchSpec& spec, int pp_rank);

// The fewest micro-batches (at most the step's M; a multiple of PP under interleaving) whose
// schedule on `pp_rank` passes through the same in-flight states as the whole step, in the same
// order: the warm-up and one period of the steady state (PP x VPP chunk-forwards under
// interleaving, one micro-batch without).
int InFlightMicrobatches(const SearchSpec& spec, int pp_rank);

// The most micro-batches (chunk-forwards under interleaving) `pp_rank` holds at once:
// min(PP - p, M) under 1F1B; warm-up + 1, at most M x VPP, under interleaving.
int MaxInFlight(const SearchSpec& spec, int pp_rank);

// Megatron Core's rules for the global batch, the layer split (or the explicit layout), virtual
// pipelining and the interleaved schedule's micro-batch count. Ok, or InvalidArgument whose message starts with the
// offending field ("parallel.num_layers_in_first_pipeline_stage: ...").
Status ValidatePipelineLayout(const SearchSpec& spec);

}  // namespace remat::search
