// Stand-in collectives for one rank run alone (engine/collectives.h, StandInCollectives).
//
// Buffers are wrapped as tensors (at::from_blob, no copy) so that one code path fills host and
// device memory alike, on the current stream; nothing here allocates beyond a few scalars.

#include <ATen/ATen.h>

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/collectives.h"

namespace remat::engine {
namespace {

at::ScalarType ScalarTypeOf(DataType t) {
  switch (t) {
    case DataType::kFloat32: return at::kFloat;
    case DataType::kBFloat16: return at::kBFloat16;
    case DataType::kFloat64: return at::kDouble;
    case DataType::kInt64: return at::kLong;
  }
  throw std::invalid_argument("stand-in collectives: unknown data type");
}

class StandIns final : public StandInCollectives {
 public:
  StandIns(int rank, int world_size, int cuda_device, uint64_t seed)
      : rank_(rank),
        world_size_(world_size),
        device_(cuda_device >= 0 ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(cuda_device))
                                 : at::Device(at::kCPU)) {
    // A generator of the device's kind, separate from the default one, so that received values
    // leave the rank's own RNG streams (dropout, initialisation) where they would be.
    rng_ = at::globalContext().defaultGenerator(device_).clone();
    rng_.set_current_seed(seed);
    names_[0] = "world";
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  Group CreateGroup(const std::vector<std::vector<int>>& partition) override {
    for (const std::vector<int>& members : partition) {
      if (std::find(members.begin(), members.end(), rank_) == members.end()) continue;
      Group g;
      g.id = next_id_++;
      g.ranks = members;
      std::sort(g.ranks.begin(), g.ranks.end());
      g.rank = static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), rank_) - g.ranks.begin());
      return g;
    }
    throw CollectiveError("stand-in collectives: rank " + std::to_string(rank_) +
                          " is in no group of the partition");
  }

  void NameGroup(const Group& g, const std::string& name) override { names_[g.id] = name; }

  void AllReduce(const Group& g, void*, size_t count, DataType type, ReduceOp) override {
    Record(g, search::CollectiveKind::kAllReduce, count * DataTypeSize(type));
  }

  void AllGather(const Group& g, const void* in, void* out, size_t count_per_rank,
                 DataType type) override {
    const size_t elem = DataTypeSize(type);
    Record(g, search::CollectiveKind::kAllGather, count_per_rank * elem * g.size());
    if (count_per_rank == 0) return;
    at::Tensor src = Wrap(const_cast<void*>(in), count_per_rank, type);
    for (int i = 0; i < g.size(); ++i) {
      char* chunk = static_cast<char*>(out) + i * count_per_rank * elem;
      if (chunk == in) continue;  // in place: this member's chunk already holds `in`
      Wrap(chunk, count_per_rank, type).copy_(src);
    }
  }

  void AllGatherRouting(const Group& g, const int64_t* in, int64_t* out, size_t count_per_rank,
                        Routing what, int64_t num_experts, int64_t experts_per_rank) override {
    AllGather(g, in, out, count_per_rank, DataType::kInt64);
    if (count_per_rank == 0 || num_experts <= 0) return;
    const int n = g.size();
    for (int i = 0; i < n; ++i) {
      const int64_t shift = ((i - g.rank + n) % n) * experts_per_rank % num_experts;
      if (shift == 0) continue;
      at::Tensor chunk = Wrap(out + i * count_per_rank, count_per_rank, DataType::kInt64);
      if (what == Routing::kCountsPerExpert) {
        // Peer's count for expert e = this rank's for expert e - shift.
        chunk.copy_(chunk.roll(shift));
      } else {
        chunk.add_(shift).remainder_(num_experts);
      }
    }
  }

  void ReduceScatter(const Group& g, const void* in, void* out, size_t count_per_rank,
                     DataType type) override {
    const size_t elem = DataTypeSize(type);
    Record(g, search::CollectiveKind::kReduceScatter, count_per_rank * elem * g.size());
    const char* mine = static_cast<const char*>(in) + g.rank * count_per_rank * elem;
    if (count_per_rank == 0 || mine == out) return;
    Wrap(out, count_per_rank, type).copy_(Wrap(const_cast<char*>(mine), count_per_rank, type));
  }

  void AllToAll(const Group& g, const void* in, const std::vector<size_t>& send_counts, void* out,
                const std::vector<size_t>& recv_counts, DataType type) override {
    const size_t n = static_cast<size_t>(g.size());
    if (send_counts.size() != n || recv_counts.size() != n) {
      throw CollectiveError("all-to-all: counts must have one entry per group member");
    }
    size_t sent = 0, received = 0;
    for (size_t c : send_counts) sent += c;
    for (size_t c : recv_counts) received += c;
    Record(g, search::CollectiveKind::kAllToAll, sent * DataTypeSize(type));
    if (received == 0) return;
    at::Tensor dst = Wrap(out, received, type);
    if (type == DataType::kInt64) {
      // An exchange of counts: every peer sends what this rank sends to itself.
      if (send_counts[g.rank] != recv_counts[0] || sent != received) {
        throw CollectiveError("stand-in all-to-all of counts: expected equal counts per member");
      }
      const size_t per = recv_counts[0];
      at::Tensor mine = Wrap(static_cast<char*>(const_cast<void*>(in)) + g.rank * per * 8, per, type);
      dst.view({static_cast<int64_t>(n), static_cast<int64_t>(per)}).copy_(mine.unsqueeze(0));
      return;
    }
    if (sent == 0) {
      dst.zero_();
      return;
    }
    // Data: `in` repeated until `out` is full (the shapes are what matter; values stay those of
    // real activations).
    at::Tensor src = Wrap(const_cast<void*>(in), sent, type);
    for (size_t off = 0; off < received; off += sent) {
      const size_t len = std::min(sent, received - off);
      dst.narrow(0, static_cast<int64_t>(off), static_cast<int64_t>(len))
          .copy_(src.narrow(0, 0, static_cast<int64_t>(len)));
    }
  }

  void Barrier(const Group&) override {}

  void SendRecv(const Group& g, const std::vector<PeerTransfer>& transfers) override {
    for (const PeerTransfer& t : transfers) {
      if (t.send) {
        Record(g, search::CollectiveKind::kSendRecv, t.count * DataTypeSize(t.type));
        continue;
      }
      if (t.count == 0) continue;
      at::Tensor buf = Wrap(t.data, t.count, t.type);
      if (t.type == DataType::kInt64) {
        buf.zero_();
      } else {
        buf.normal_(0.0, 1.0, rng_);
      }
    }
  }

  void Synchronize() override {}

  std::vector<search::CommRecord> Records() const override {
    std::vector<search::CommRecord> out;
    for (const auto& [key, rec] : records_) out.push_back(rec);
    return out;
  }

  void ResetRecords() override { records_.clear(); }

 private:
  at::Tensor Wrap(void* data, size_t count, DataType type) const {
    return at::from_blob(data, {static_cast<int64_t>(count)},
                         at::TensorOptions().dtype(ScalarTypeOf(type)).device(device_));
  }

  // A group of one moves nothing (the real collectives return at once): not recorded.
  void Record(const Group& g, search::CollectiveKind kind, size_t bytes) {
    if (g.size() <= 1) return;
    search::CommRecord& r = records_[{g.id, static_cast<int>(kind)}];
    if (r.calls == 0) {
      auto name = names_.find(g.id);
      r.group = name != names_.end() ? name->second : "group " + std::to_string(g.id);
      r.kind = kind;
      r.ranks = g.ranks;
    }
    r.bytes += static_cast<double>(bytes);
    r.calls += 1;
  }

  int rank_, world_size_;
  at::Device device_;
  at::Generator rng_;
  int next_id_ = 1;  // 0 is the world
  std::map<int, std::string> names_;
  std::map<std::pair<int, int>, search::CommRecord> records_;  // (group id, kind)
};

}  // namespace

std::unique_ptr<StandInCollectives> NewStandInCollectives(int rank, int world_size,
                                                          int cuda_device, uint64_t seed) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    throw std::invalid_argument("stand-in collectives: rank " + std::to_string(rank) +
                                " outside a world of " + std::to_string(world_size));
  }
  return std::make_unique<StandIns>(rank, world_size, cuda_device, seed);
}

}  // namespace remat::engine
