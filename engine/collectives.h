// Collectives: the seam between the trial engine and whatever moves tensors between ranks.
//
// One Collectives object per rank process. Ranks first meet through files in a rendezvous folder
// (engine/README.md, "Rendezvous"), then run collectives on groups of ranks. Two implementations:
//   - TCP over loopback with rank 0 as the hub (CPU tensors; what CI runs), tcp_collectives.cc;
//   - NCCL (CUDA tensors), nccl_collectives.cc, built only with REMAT_WITH_CUDA.
//   - stand-ins for one rank run alone (layout proxies), stand_in_collectives.cc.
// Buffers are raw pointers (host memory for TCP, device memory for NCCL) so this header stays free
// of Torch. Every call takes a deadline (Options::timeout_s): a collective that does not complete
// in time is aborted, never waited on forever.
//
// Errors: methods throw CollectiveError (a std::runtime_error) on a timeout, a lost peer or a
// transport failure, because they run deep inside autograd where a thrown exception is the only
// way out; the trial runner catches it and reports the trial as failed. After an error the
// object is unusable. Thread-safety: one thread calls the methods of one object at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "search/layout_proxy.h"  // CommRecord

namespace remat::engine {

class CollectiveError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class DataType { kFloat32, kBFloat16, kFloat64, kInt64 };
enum class ReduceOp { kSum, kMax };
size_t DataTypeSize(DataType t);

// A handle to a group of ranks, returned by Collectives::CreateGroup. Group 0 is the world.
struct Group {
  int id = 0;
  std::vector<int> ranks;  // global ranks, ascending; this rank is one of them
  int rank = 0;            // this rank's index in `ranks`
  int size() const { return static_cast<int>(ranks.size()); }
};

// One transfer of a point-to-point exchange (Collectives::SendRecv).
struct PeerTransfer {
  bool send = true;  // false: receive into `data`
  int peer = 0;      // the other member's index in the group
  // Transfers from one member to another are matched in posting order per tag (TCP). NCCL has no
  // tags: it matches every transfer between two members in posting order, so callers must post
  // the transfers of different tags between one pair in the same order on both sides. The TCP
  // collectives can take NCCL's semantics instead (CollectivesOptions::nccl_point_to_point).
  int tag = 0;
  void* data = nullptr;  // const for a send
  size_t count = 0;      // elements; a receive's count must equal the matching send's
  DataType type = DataType::kFloat32;
};

class Collectives {
 public:
  virtual ~Collectives() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  Group World() const;

  // Splits the world into disjoint groups. Every rank calls it with the same `partition` (a list
  // of groups covering every rank exactly once, in the same order on every rank); returns the
  // group holding this rank.
  virtual Group CreateGroup(const std::vector<std::vector<int>>& partition) = 0;

  // In place: every member ends with the reduction of all members' `data` (`count` elements).
  virtual void AllReduce(const Group& g, void* data, size_t count, DataType type, ReduceOp op) = 0;
  // `out` (count_per_rank * group size elements) receives every member's `in`, in group order.
  virtual void AllGather(const Group& g, const void* in, void* out, size_t count_per_rank,
                         DataType type) = 0;
  // `in` holds count_per_rank * group size elements; member i receives the sum of chunk i.
  virtual void ReduceScatter(const Group& g, const void* in, void* out, size_t count_per_rank,
                             DataType type) = 0;
  // Personalised exchange with per-peer counts (elements): member i sends send_counts[j] elements
  // of `in` (packed in member order) to member j and receives recv_counts[j] elements from member
  // j into `out` (packed in member order). Both vectors hold group-size entries; member i's
  // send_counts[j] must equal member j's recv_counts[i]. Counts may be zero.
  virtual void AllToAll(const Group& g, const void* in, const std::vector<size_t>& send_counts,
                        void* out, const std::vector<size_t>& recv_counts, DataType type) = 0;
  virtual void Barrier(const Group& g) = 0;

  // The MoE dispatchers' exchange of routing over the expert grid: an all-gather of kInt64 with
  // AllGather's contract, where `in` holds this rank's tokens per expert (kCountsPerExpert,
  // count_per_rank = num_experts) or its top-k expert indices (kExpertIndices), `num_experts`
  // experts of which each expert-parallel rank holds `experts_per_rank`. Real collectives gather;
  // the stand-ins answer with this rank's routing shifted (StandInCollectives).
  enum class Routing { kCountsPerExpert, kExpertIndices };
  virtual void AllGatherRouting(const Group& g, const int64_t* in, int64_t* out,
                                size_t count_per_rank, Routing what, int64_t num_experts,
                                int64_t experts_per_rank) {
    (void)what, (void)num_experts, (void)experts_per_rank;
    AllGather(g, in, out, count_per_rank, DataType::kInt64);
  }

  // Point-to-point (Megatron's batch_isend_irecv): posts every transfer together (NCCL: one group
  // of ncclSend/ncclRecv) and returns once they are complete (NCCL: enqueued, as the other calls).
  // A send may complete before its receiver posts the receive (TCP: the hub holds the data; NCCL
  // within the group), a receive waits for its send. Deadlock-free as long as the members' posting
  // orders are, as in Megatron's pipeline schedules.
  virtual void SendRecv(const Group& g, const std::vector<PeerTransfer>& transfers) = 0;

  // Waits until every collective issued so far has completed (NCCL enqueues asynchronously) and
  // throws if one failed or timed out.
  virtual void Synchronize() = 0;
};

struct CollectivesOptions {
  int rank = 0;
  int world_size = 1;
  std::string rendezvous_dir;  // must exist and be private to this trial
  double timeout_s = 300;      // rendezvous and each collective
  // TCP only: point-to-point with NCCL's semantics (tags ignored: transfers between two ranks
  // match in posting order; an exchange returns only once its sends were received), so CPU runs
  // show whether a schedule would deadlock or mismatch over NCCL.
  bool nccl_point_to_point = false;
};

// A world of one rank: every collective is a copy or a no-op. Never fails.
std::unique_ptr<Collectives> NewSingleRankCollectives();

// TCP over loopback (tcp_collectives.cc). Blocks until every rank has joined or the deadline has
// passed (then throws CollectiveError naming the ranks that did not show up).
std::unique_ptr<Collectives> NewTcpCollectives(const CollectivesOptions& options);

// One rank of a world of `world_size` run alone, as a layout proxy (search/layout_proxy.h): no
// peer exists, but every call allocates nothing more and fills its output buffers as the real
// collective would fill them in shape, so the rank holds what it would hold in the real job
// (PyTorch's fake process group has the same idea). CreateGroup returns the real membership;
// AllReduce keeps this rank's data; AllGather copies `in` into every chunk; ReduceScatter writes
// this member's chunk of `in`; AllToAll of kInt64 (an exchange of counts) answers "every peer
// sends what I send myself" (out[src * per + i] = in[my_index * per + i]); AllToAll of data
// fills `out` with `in` cycled; AllGatherRouting gives the member k places after this one
// this rank's routing with every expert index moved k * experts_per_rank on (mod num_experts):
// peers route as many tokens as this rank does, and each expert-parallel rank's experts get an
// even share of them, as the real ranks' routing gives on average (copies of this rank's routing
// would load its own experts with its own routing noise once per peer); SendRecv drops sends and
// fills receives with N(0, 1) values of their type (zeros would route every MoE token to the same
// experts); Barrier and Synchronize do nothing. Every call on a group of more than one rank is
// recorded (search::CommRecord) under the group's name, set by NameGroup. Never throws
// CollectiveError.
class StandInCollectives : public Collectives {
 public:
  // Names the group `g` ("tp", "dp", "pp", "ep", "expert_dp", "embedding"; the world is "world")
  // in the records; a group left unnamed is recorded as "group <id>".
  virtual void NameGroup(const Group& g, const std::string& name) = 0;
  // The calls since the last ResetRecords (or construction), one record per group and kind.
  virtual std::vector<search::CommRecord> Records() const = 0;
  virtual void ResetRecords() = 0;
};

// `cuda_device`: the CUDA device whose buffers the calls fill, or -1 for host memory. `seed`
// seeds the values received by SendRecv (their own generator: the rank's RNG streams are not
// touched).
std::unique_ptr<StandInCollectives> NewStandInCollectives(int rank, int world_size,
                                                          int cuda_device, uint64_t seed);

#ifdef REMAT_WITH_CUDA
// NCCL on the current CUDA device and stream (nccl_collectives.cc). The unique id travels through
// a file in the rendezvous folder. Throws CollectiveError on a timeout.
std::unique_ptr<Collectives> NewNcclCollectives(const CollectivesOptions& options);
#endif

}  // namespace remat::engine
