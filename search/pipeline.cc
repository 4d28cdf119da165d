#include "search/pipeline.h"

#include <algorithm>
#include <string>

namespace remat::search {
namespace {

int Pp(const SearchSpec& spec) { return std::max(1, spec.parallel.pipeline_model_parallel_size); }

// Layers on `pp_rank` before virtual chunking, as Megatron counts them: with
// account_for_*_in_pipeline_split the embedding (loss) is one of the first (last) rank's "layers"
// and is taken off again per chunk in ChunkOf.
int RankShare(const SearchSpec& spec, int pp_rank) {
  const ParallelSpec& p = spec.parallel;
  const int pp = Pp(spec);
  const int layers = spec.model.num_layers;
  const auto& first = p.num_layers_in_first_pipeline_stage;
  const auto& last = p.num_layers_in_last_pipeline_stage;
  if (first || last) {
    int middle_layers = layers - first.value_or(0) - last.value_or(0);
    int middle_stages = pp - (first ? 1 : 0) - (last ? 1 : 0);
    if (pp_rank == 0 && first) return *first;
    if (pp_rank == pp - 1 && last) return *last;
    return middle_stages > 0 ? std::max(0, middle_layers) / middle_stages : 0;
  }
  const int counted = layers + (p.account_for_embedding_in_pipeline_split ? 1 : 0) +
                      (p.account_for_loss_in_pipeline_split ? 1 : 0);
  return counted / pp;
}

// Layers of (pp_rank, chunk) alone, without the offset.
int ChunkCount(const SearchSpec& spec, int pp_rank, int chunk) {
  const ParallelSpec& p = spec.parallel;
  const int pp = Pp(spec), vpp = p.VirtualChunks();
  int n = RankShare(spec, pp_rank) / vpp;
  const bool uneven = p.num_layers_in_first_pipeline_stage || p.num_layers_in_last_pipeline_stage;
  if (!uneven) {
    if (p.account_for_embedding_in_pipeline_split && pp_rank == 0 && chunk == 0) --n;
    if (p.account_for_loss_in_pipeline_split && pp_rank == pp - 1 && chunk == vpp - 1) --n;
  }
  return std::max(0, n);
}

// The interleaved schedule's table: virtual step k -> (micro-batch, chunk) of its forward.
// Micro-batches go in groups of `group` per chunk; the last group takes what is left.
struct TableEntry {
  int microbatch;
  int chunk;
};

std::vector<TableEntry> ScheduleTable(int microbatches, int chunks, int group) {
  std::vector<TableEntry> table;
  table.reserve(static_cast<size_t>(microbatches) * chunks);
  for (int start = 0; start < microbatches; start += group) {
    const int end = start + group >= microbatches ? microbatches : start + group;
    for (int c = 0; c < chunks; ++c) {
      for (int mb = start; mb < end; ++mb) table.push_back({mb, c});
    }
  }
  return table;
}

Status PositiveOptional(const char* field, const std::optional<int>& v) {
  if (v && *v <= 0) return InvalidArgument(std::string(field) + ": must be a positive integer");
  return OkStatus();
}

Status ValidateGlobalBatch(const SearchSpec& spec) {
  const auto& gbs = spec.train.global_batch_size;
  REMAT_SEARCH_RETURN_IF_ERROR(PositiveOptional("train.global_batch_size", gbs));
  if (!gbs) return OkStatus();
  const long long per_pass = 1LL * spec.train.micro_batch_size * spec.parallel.data_parallel_size;
  if (per_pass > 0 && *gbs % per_pass != 0) {
    return InvalidArgument("train.global_batch_size: " + std::to_string(*gbs) +
                           " must be divisible by micro_batch_size x data_parallel_size (" +
                           std::to_string(per_pass) + "): the micro-batches per step are whole");
  }
  return OkStatus();
}

Status ValidateUnevenSplit(const SearchSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  const int pp = Pp(spec), layers = spec.model.num_layers;
  const auto& first = p.num_layers_in_first_pipeline_stage;
  const auto& last = p.num_layers_in_last_pipeline_stage;
  REMAT_SEARCH_RETURN_IF_ERROR(
      PositiveOptional("parallel.num_layers_in_first_pipeline_stage", first));
  REMAT_SEARCH_RETURN_IF_ERROR(
      PositiveOptional("parallel.num_layers_in_last_pipeline_stage", last));
  const char* field = first ? "parallel.num_layers_in_first_pipeline_stage"
                            : "parallel.num_layers_in_last_pipeline_stage";
  if (p.account_for_embedding_in_pipeline_split || p.account_for_loss_in_pipeline_split) {
    return InvalidArgument(std::string(field) +
                           ": cannot be set together with account_for_embedding_in_pipeline_split "
                           "or account_for_loss_in_pipeline_split (Megatron Core refuses both)");
  }
  if (pp <= 1) {
    return InvalidArgument(std::string(field) + ": needs pipeline_model_parallel_size > 1");
  }
  const int vpp = p.VirtualChunks();
  if (first && *first % vpp != 0) {
    return InvalidArgument(
        "parallel.num_layers_in_first_pipeline_stage: " + std::to_string(*first) +
        " must be divisible by "
        "virtual_pipeline_model_parallel_size (" +
        std::to_string(vpp) + ")");
  }
  if (last && *last % vpp != 0) {
    return InvalidArgument("parallel.num_layers_in_last_pipeline_stage: " + std::to_string(*last) +
                           " must be divisible by virtual_pipeline_model_parallel_size (" +
                           std::to_string(vpp) + ")");
  }
  const int middle_layers = layers - first.value_or(0) - last.value_or(0);
  const int middle_stages = pp - (first ? 1 : 0) - (last ? 1 : 0);
  if (middle_layers < 0 || (middle_layers > 0) != (middle_stages > 0)) {
    return InvalidArgument(std::string(field) + ": leaves " + std::to_string(middle_layers) +
                           " of model.num_layers (" + std::to_string(layers) + ") for " +
                           std::to_string(middle_stages) +
                           " middle pipeline stages; each middle stage needs layers, and only "
                           "middle stages may take the rest");
  }
  if (middle_stages > 0 && middle_layers % middle_stages != 0) {
    return InvalidArgument(
        std::string(field) + ": the " + std::to_string(middle_layers) +
        " layers left for the middle stages must be divisible by their number (" +
        std::to_string(middle_stages) + ")");
  }
  if (middle_stages > 0 && (middle_layers / middle_stages) % vpp != 0) {
    return InvalidArgument("parallel.virtual_pipeline_model_parallel_size: the " +
                           std::to_string(middle_layers / middle_stages) +
                           " layers of each middle pipeline stage must be divisible by " +
                           std::to_string(vpp));
  }
  return OkStatus();
}

Status ValidateEvenSplit(const SearchSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  const int pp = Pp(spec);
  const bool emb = p.account_for_embedding_in_pipeline_split;
  const bool loss = p.account_for_loss_in_pipeline_split;
  const int counted = spec.model.num_layers + (emb ? 1 : 0) + (loss ? 1 : 0);
  if (counted % pp != 0) {
    std::string what = "model.num_layers: " + std::to_string(spec.model.num_layers);
    if (emb || loss) {
      what += std::string(" (+1 for the ") +
              (emb && loss ? "embedding and the loss"
               : emb       ? "embedding"
                           : "loss") +
              ", account_for_*_in_pipeline_split)";
    }
    return InvalidArgument(what + " must be divisible by parallel.pipeline_model_parallel_size (" +
                           std::to_string(pp) + ")");
  }
  const int vpp = p.VirtualChunks();
  if ((counted / pp) % vpp != 0) {
    return InvalidArgument("parallel.virtual_pipeline_model_parallel_size: the " +
                           std::to_string(counted / pp) +
                           " layers of each pipeline stage must be divisible by " +
                           std::to_string(vpp) + " (every model chunk gets the same number)");
  }
  return OkStatus();
}

Status ValidateInterleaving(const SearchSpec& spec) {
  const ParallelSpec& p = spec.parallel;
  REMAT_SEARCH_RETURN_IF_ERROR(PositiveOptional("parallel.virtual_pipeline_model_parallel_size",
                                                p.virtual_pipeline_model_parallel_size));
  const int vpp = p.virtual_pipeline_model_parallel_size.value_or(1);
  if (vpp <= 1) return OkStatus();
  const int pp = Pp(spec);
  if (pp <= 1) {
    return InvalidArgument(
        "parallel.virtual_pipeline_model_parallel_size: needs pipeline_model_parallel_size > 1");
  }
  // schedules.py: micro-batches run in groups of microbatch_group_size_per_vp_stage (default PP)
  // per chunk; a group may not exceed M, and a last partial group smaller than PP is refused.
  const int m = spec.NumMicrobatches();
  if (m < pp || m % pp != 0) {
    return InvalidArgument(
        "train.global_batch_size: the interleaved schedule needs the micro-batches per step (" +
        std::to_string(m) +
        " = global_batch_size / (micro_batch_size x data_parallel_size)) to "
        "be a multiple of pipeline_model_parallel_size (" +
        std::to_string(pp) + ")");
  }
  return OkStatus();
}

}  // namespace

StageChunk ChunkOf(const SearchSpec& spec, int pp_rank, int chunk) {
  const int pp = Pp(spec), vpp = spec.parallel.VirtualChunks();
  StageChunk c;
  c.pp_rank = pp_rank;
  c.chunk = chunk;
  c.num_layers = ChunkCount(spec, pp_rank, chunk);
  // Chunks sit on the model chunk-major: every rank's chunk 0, then every rank's chunk 1, ...
  for (int v = 0; v <= chunk; ++v) {
    for (int r = 0; r < (v == chunk ? pp_rank : pp); ++r) c.first_layer += ChunkCount(spec, r, v);
  }
  c.has_embedding = pp_rank == 0 && chunk == 0;
  c.has_loss = pp_rank == pp - 1 && chunk == vpp - 1;
  return c;
}

std::vector<StageChunk> ChunksOf(const SearchSpec& spec, int pp_rank) {
  std::vector<StageChunk> chunks;
  for (int v = 0; v < spec.parallel.VirtualChunks(); ++v)
    chunks.push_back(ChunkOf(spec, pp_rank, v));
  return chunks;
}

int StageLayerCount(const SearchSpec& spec, int pp_rank) {
  int n = 0;
  for (int v = 0; v < spec.parallel.VirtualChunks(); ++v) n += ChunkCount(spec, pp_rank, v);
  return n;
}

int MaxChunkLayers(const SearchSpec& spec) {
  int n = 0;
  for (int r = 0; r < Pp(spec); ++r) {
    for (int v = 0; v < spec.parallel.VirtualChunks(); ++v) n = std::max(n, ChunkCount(spec, r, v));
  }
  return n;
}

int WarmupForwards(const SearchSpec& spec, int pp_rank) {
  const int pp = Pp(spec), vpp = spec.parallel.VirtualChunks();
  const int m = spec.NumMicrobatches();
  const int total = m * vpp;
  int warmup = 0;
  if (vpp == 1) {
    warmup = pp - pp_rank - 1;
  } else {
    const int group = pp;  // microbatch_group_size_per_vp_stage's default
    warmup = (pp - pp_rank - 1) * 2 + (vpp - 1) * group;
    // With the MoE all-to-all overlapped, one more forward runs before the 1F1B steps.
    if (spec.model.overlap_moe_expert_parallel_comm) ++warmup;
  }
  return std::clamp(warmup, 0, total);
}

std::vector<PipelineOp> ScheduleOps(const SearchSpec& spec, int pp_rank) {
  const int vpp = spec.parallel.VirtualChunks();
  const int m = spec.NumMicrobatches();
  const int total = m * vpp;
  const std::vector<TableEntry> table = ScheduleTable(m, vpp, vpp > 1 ? Pp(spec) : m);
  auto fwd = [&](int k) { return PipelineOp{true, table[k].microbatch, table[k].chunk}; };
  // Backwards walk the same table with the chunks reversed (the last chunk's backward first).
  auto bwd = [&](int k) {
    return PipelineOp{false, table[k].microbatch, vpp - 1 - table[k].chunk};
  };
  const int warmup = WarmupForwards(spec, pp_rank);
  std::vector<PipelineOp> ops;
  ops.reserve(2 * static_cast<size_t>(total));
  for (int k = 0; k < warmup; ++k) ops.push_back(fwd(k));
  for (int k = 0; k < total - warmup; ++k) {  // steady state: one forward, then one backward
    ops.push_back(fwd(k + warmup));
    ops.push_back(bwd(k));
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(bwd(k));  // cool-down
  return ops;
}

std::vector<InFlightState> InFlightStates(const SearchSpec& spec, int pp_rank) {
  std::vector<InFlightState> states;
  std::vector<int> live(spec.parallel.VirtualChunks(), 0);
  for (const PipelineOp& op : ScheduleOps(spec, pp_rank)) {
    if (op.forward) {
      ++live[op.chunk];
      continue;
    }
    const bool seen = std::any_of(states.begin(), states.end(), [&](const InFlightState& s) {
      return s.backward_chunk == op.chunk && s.live_per_chunk == live;
    });
    if (!seen) states.push_back({op.chunk, live});
    --live[op.chunk];
  }
  return states;
}

int MaxInFlight(const SearchSpec& spec, int pp_rank) {
  int most = 0;
  for (const InFlightState& s : InFlightStates(spec, pp_rank)) {
    int n = 0;
    for (int c : s.live_per_chunk) n += c;
    most = std::max(most, n);
  }
  return most;
}

Status ValidatePipelineLayout(const SearchSpec& spec) {
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateGlobalBatch(spec));
  REMAT_SEARCH_RETURN_IF_ERROR(ValidateInterleaving(spec));
  const ParallelSpec& p = spec.parallel;
  if (p.num_layers_in_first_pipeline_stage || p.num_layers_in_last_pipeline_stage) {
    return ValidateUnevenSplit(spec);
  }
  return ValidateEvenSplit(spec);
}

}  // namespace remat::search
