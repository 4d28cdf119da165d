#include "search/pipeline.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "search/pipeline_layout.h"

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

// The spec's explicit layout when it has one that matches its PP and VPP (ValidateSpec refuses
// the others), else nullptr.
std::shared_ptr<const PipelineLayout> MatchingLayout(const SearchSpec& spec) {
  std::shared_ptr<const PipelineLayout> layout = LayoutOf(spec);
  if (layout && layout->pp == Pp(spec) && layout->vpp == spec.parallel.VirtualChunks()) {
    return layout;
  }
  return nullptr;
}

// Layers of (pp_rank, chunk) alone, without the offset.
int ChunkCount(const SearchSpec& spec, int pp_rank, int chunk) {
  const ParallelSpec& p = spec.parallel;
  const int pp = Pp(spec), vpp = p.VirtualChunks();
  if (const auto layout = MatchingLayout(spec)) return layout->At(pp_rank, chunk).decoder;
  int n = RankShare(spec, pp_rank) / vpp;
  const bool uneven = p.num_layers_in_first_pipeline_stage || p.num_layers_in_last_pipeline_stage;
  if (!uneven) {
    if (p.account_for_embedding_in_pipeline_split && pp_rank == 0 && chunk == 0) --n;
    if (p.account_for_loss_in_pipeline_split && pp_rank == pp - 1 && chunk == vpp - 1) --n;
  }
  return std::max(0, n);
}

// Layers of chunk `chunk` over ranks 0 .. n-1 (n <= PP), in O(1): only the first and the last
// rank's differ, every rank between holds the same.
long long RanksLayers(const SearchSpec& spec, int chunk, int n) {
  if (n <= 0) return 0;
  const int pp = Pp(spec);
  long long sum = ChunkCount(spec, 0, chunk);
  const int middle = std::min(n, pp - 1) - 1;  // ranks 1 .. min(n, PP - 1) - 1
  if (middle > 0) sum += 1LL * middle * ChunkCount(spec, 1, chunk);
  if (n >= pp && pp > 1) sum += ChunkCount(spec, pp - 1, chunk);
  return sum;
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
  c.has_embedding = pp_rank == 0 && chunk == 0;
  c.has_loss = pp_rank == pp - 1 && chunk == vpp - 1;
  if (const auto layout = MatchingLayout(spec)) {
    c.first_layer = layout->FirstLayer(pp_rank, chunk);
    c.mtp_layers = layout->At(pp_rank, chunk).mtp;
    return c;
  }
  c.mtp_layers = c.has_loss ? MtpLayerCount(spec) : 0;
  // Chunks sit on the model chunk-major: every rank's chunk 0, then every rank's chunk 1, ...
  // Chunks 1 .. VPP-2 hold the same layers (only the first and last chunk differ).
  long long before = RanksLayers(spec, chunk, pp_rank);
  if (chunk >= 1) before += RanksLayers(spec, 0, pp);
  if (chunk >= 2) before += (chunk - 1LL) * RanksLayers(spec, 1, pp);
  c.first_layer = static_cast<int>(before);
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

namespace {

// Megatron's warm-up forwards on `pp_rank` before the clamp to the step's M x VPP.
long long UnclampedWarmup(const SearchSpec& spec, int pp_rank) {
  const long long pp = Pp(spec), vpp = spec.parallel.VirtualChunks();
  if (vpp == 1) return pp - pp_rank - 1;
  const long long group = pp;  // microbatch_group_size_per_vp_stage's default
  long long warmup = (pp - pp_rank - 1) * 2 + (vpp - 1) * group;
  // With the MoE all-to-all overlapped, one more forward runs before the 1F1B steps.
  if (spec.model.overlap_moe_expert_parallel_comm) ++warmup;
  return warmup;
}

int WarmupOf(const SearchSpec& spec, int pp_rank, int m) {
  const long long total = 1LL * m * spec.parallel.VirtualChunks();
  return static_cast<int>(std::clamp(UnclampedWarmup(spec, pp_rank), 0LL, total));
}

std::vector<PipelineOp> ScheduleOpsOf(const SearchSpec& spec, int pp_rank, int m) {
  const int vpp = spec.parallel.VirtualChunks();
  const int total = m * vpp;
  const std::vector<TableEntry> table = ScheduleTable(m, vpp, vpp > 1 ? Pp(spec) : m);
  auto fwd = [&](int k) { return PipelineOp{true, table[k].microbatch, table[k].chunk}; };
  // Backwards walk the same table with the chunks reversed (the last chunk's backward first).
  auto bwd = [&](int k) {
    return PipelineOp{false, table[k].microbatch, vpp - 1 - table[k].chunk};
  };
  const int warmup = WarmupOf(spec, pp_rank, m);
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

// The fewest micro-batches whose schedule on `pp_rank` passes through the same in-flight states
// as the step's M, in the same order of first occurrence, so that planning costs what the
// layout costs, not what the global batch does (M may be 2^24).
//
// Why it holds: the forward order is periodic with period P = PP x VPP chunk-forwards under
// interleaving (groups of PP micro-batches per chunk, M a multiple of PP) and P = 1 without. In
// the steady state the k-th backward has k + W + 1 forwards behind it (W the warm-up), so what
// is in flight depends on k mod P alone: the first P steady-state backwards show every
// steady-state state. In the cool-down every forward has run, and what is in flight depends on
// how many backwards remain alone. So any M' (a multiple of PP under interleaving) with the same
// warm-up and at least P steady-state backwards has the same states in the same order.
int StateMicrobatches(const SearchSpec& spec, int pp_rank) {
  const int m = spec.NumMicrobatches();
  const long long vpp = spec.parallel.VirtualChunks();
  const long long period = vpp > 1 ? Pp(spec) * vpp : 1;
  const long long step = vpp > 1 ? Pp(spec) : 1;  // M' stays whole groups
  const long long need = std::max(0LL, UnclampedWarmup(spec, pp_rank)) + period;  // M' x VPP
  if (1LL * m * vpp <= need) return m;
  const long long groups = (need + step * vpp - 1) / (step * vpp);
  return static_cast<int>(std::min<long long>(m, groups * step));
}

// The distinct in-flight states of `pp_rank` under interleaving, walking `m` micro-batches
// (StateMicrobatches) of the schedule.
std::vector<InFlightState> WalkInterleaved(const SearchSpec& spec, int pp_rank, int m) {
  const int vpp = spec.parallel.VirtualChunks();
  // Interleaved: walk the bounded schedule (forward k runs chunk (k mod PP x VPP) / PP: whole
  // groups of PP micro-batches per chunk; backward k the chunk mirrored), keeping each distinct
  // state once. Repeats, the common case, are found through a hash of the counts kept up to
  // date step by step, in an open-addressed table (compared in full on a match, so a collision
  // costs time, never a state).
  const int pp = Pp(spec);
  const int total = m * vpp;
  const int warmup = WarmupOf(spec, pp_rank, m);
  const int period = pp * vpp;
  auto forward_chunk = [&](int k) { return (k % period) / pp; };
  std::vector<uint64_t> weight(vpp);
  for (int c = 0; c < vpp; ++c) {  // splitmix64 of the chunk: a fixed odd weight per chunk
    uint64_t z = 0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(c + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    weight[c] = (z ^ (z >> 31)) | 1;
  }
  int slot_bits = 4;
  while ((size_t{1} << slot_bits) < 2 * static_cast<size_t>(total)) ++slot_bits;
  const size_t slots = size_t{1} << slot_bits;
  // Slots hold a state's index + 1 (0: empty), small enough to stay off fresh pages per call.
  std::vector<uint32_t> table(slots, 0);
  std::vector<uint64_t> keys;  // per state
  std::vector<InFlightState> states;
  std::vector<int> live(vpp, 0);
  uint64_t hash = 0;
  auto forward = [&](int k) {
    const int c = forward_chunk(k);
    ++live[c];
    hash += weight[c];
  };
  auto backward = [&](int k) {
    const int chunk = vpp - 1 - forward_chunk(k);
    const uint64_t key = hash * 0x100000001b3ULL + static_cast<uint64_t>(chunk);
    // The key's top bits (Fibonacci hashing): its low bits follow the parity of the counts.
    for (size_t at = (key * 0x9e3779b97f4a7c15ULL) >> (64 - slot_bits);;
         at = (at + 1) & (slots - 1)) {
      if (table[at] == 0) {
        table[at] = static_cast<uint32_t>(states.size() + 1);
        keys.push_back(key);
        states.push_back({chunk, live});
        break;
      }
      const size_t index = table[at] - 1;
      if (keys[index] == key && states[index].backward_chunk == chunk &&
          states[index].live_per_chunk == live) {
        break;
      }
    }
    --live[chunk];
    hash -= weight[chunk];
  };
  for (int k = 0; k < warmup; ++k) forward(k);
  for (int k = 0; k < total - warmup; ++k) {  // steady state: one forward, then one backward
    forward(k + warmup);
    backward(k);
  }
  for (int k = total - warmup; k < total; ++k) backward(k);  // cool-down
  return states;
}

// The states depend on PP, VPP, the shortened M, the MoE overlap flag and the rank alone, and the
// memory model asks for the same ones once per policy: they are kept, about 16 MiB of counts at
// most (then the cache starts over; lists handed out keep their states alive).
struct StatesKey {
  int pp, vpp, m, rank;
  bool overlap;
  bool operator<(const StatesKey& o) const {
    return std::tie(pp, vpp, m, rank, overlap) < std::tie(o.pp, o.vpp, o.m, o.rank, o.overlap);
  }
};
constexpr size_t kMaxCachedCounts = size_t{4} << 20;
std::mutex g_states_mu;
using SharedStates = std::shared_ptr<const std::vector<InFlightState>>;
std::map<StatesKey, SharedStates>* g_states = nullptr;  // guarded by the mutex
size_t g_cached_counts = 0;

}  // namespace

int WarmupForwards(const SearchSpec& spec, int pp_rank) {
  return WarmupOf(spec, pp_rank, spec.NumMicrobatches());
}

int InFlightMicrobatches(const SearchSpec& spec, int pp_rank) {
  return StateMicrobatches(spec, pp_rank);
}

std::vector<PipelineOp> ScheduleOps(const SearchSpec& spec, int pp_rank) {
  return ScheduleOpsOf(spec, pp_rank, spec.NumMicrobatches());
}

InFlightStateList InFlightStates(const SearchSpec& spec, int pp_rank) {
  const int vpp = spec.parallel.VirtualChunks();
  const int m = StateMicrobatches(spec, pp_rank);
  if (vpp == 1) {
    // Plain 1F1B: the first backward holds the most (warm-up + 1, or all M when the warm-up
    // takes every forward); each later one holds as many or fewer.
    const int warmup = WarmupOf(spec, pp_rank, m);
    return InFlightStateList(std::make_shared<const std::vector<InFlightState>>(
        std::vector<InFlightState>{InFlightState{0, {warmup < m ? warmup + 1 : m}}}));
  }
  const StatesKey key{Pp(spec), vpp, m, pp_rank, spec.model.overlap_moe_expert_parallel_comm};
  {
    std::lock_guard<std::mutex> lock(g_states_mu);
    if (g_states != nullptr) {
      if (auto it = g_states->find(key); it != g_states->end()) {
        return InFlightStateList(it->second);
      }
    }
  }
  auto states =
      std::make_shared<const std::vector<InFlightState>>(WalkInterleaved(spec, pp_rank, m));
  const size_t counts = states->size() * static_cast<size_t>(vpp);
  std::lock_guard<std::mutex> lock(g_states_mu);
  if (g_states == nullptr) g_states = new std::map<StatesKey, SharedStates>();
  if (g_cached_counts + counts > kMaxCachedCounts) {
    g_states->clear();
    g_cached_counts = 0;
  }
  if (counts <= kMaxCachedCounts && g_states->emplace(key, states).second) {
    g_cached_counts += counts;
  }
  return InFlightStateList(std::move(states));
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
  if (spec.model.mtp_num_layers && *spec.model.mtp_num_layers < 0) {
    return InvalidArgument("model.mtp_num_layers: must be 0 or more");
  }
  if (!p.pipeline_model_parallel_layout.empty()) return ValidateLayoutField(spec);
  if (p.num_layers_in_first_pipeline_stage || p.num_layers_in_last_pipeline_stage) {
    return ValidateUnevenSplit(spec);
  }
  return ValidateEvenSplit(spec);
}

}  // namespace remat::search
