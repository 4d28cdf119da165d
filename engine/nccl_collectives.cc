// NCCL collectives (built only with REMAT_WITH_CUDA), in the manner of nccl-tests: every NCCL and
// CUDA call is checked, communicators are non-blocking, and nothing is waited on forever. Each
// collective is enqueued on the current CUDA stream and followed by an event; a watchdog thread
// polls the events and the communicators' async errors, and when a collective outlives the timeout
// it aborts every communicator (ncclCommAbort), which makes the stuck kernels return. The compute
// thread learns of it at its next call or at Synchronize(), which throws CollectiveError.
//
// Rendezvous: rank 0 writes the ncclUniqueId (128 bytes) to <rendezvous>/nccl-id (a temporary
// name, then a rename); the other ranks poll for the file until the timeout.

#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "engine/collectives.h"

namespace remat::engine {
namespace {

using Clock = std::chrono::steady_clock;

Clock::duration Duration(double seconds) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

ncclDataType_t NcclType(DataType t) {
  switch (t) {
    case DataType::kFloat32: return ncclFloat32;
    case DataType::kBFloat16: return ncclBfloat16;
    case DataType::kFloat64: return ncclFloat64;
    case DataType::kInt64: return ncclInt64;
  }
  return ncclFloat32;
}

void CheckCuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw CollectiveError(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

class NcclCollectives final : public Collectives {
 public:
  explicit NcclCollectives(const CollectivesOptions& o)
      : options_(o), trace_(std::getenv("REMAT_TRACE_COLLECTIVES") != nullptr) {}

  ~NcclCollectives() override {
    // Destroyed while an exception unwinds the trial (an OOM, a failed collective): tell the
    // other ranks, which may wait for this one in a collective, to give up now.
    const bool abandoning = std::uncaught_exceptions() > 0;
    bool graceful = false;
    if (abandoning) {
      std::ofstream(options_.rendezvous_dir + "/left-" + std::to_string(options_.rank)) << "failed\n";
    } else {
      try {
        // Everyone is done with every collective before any communicator goes away.
        Barrier(World());
        Synchronize();
        graceful = true;
      } catch (const CollectiveError&) {
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (graceful) {
      FinalizeAll();
    } else {
      AbortAll();  // never blocks
    }
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    for (auto& p : pending_) cudaEventDestroy(p.event);
    if (scratch_ != nullptr) cudaFree(scratch_);
  }

  void Init() {
    const auto deadline = Clock::now() + Duration(options_.timeout_s);
    comms_[0] = InitComm("nccl-id", options_.world_size, options_.rank, deadline,
                         "NCCL communicator initialisation (are all ranks running?)");
    CheckCuda(cudaGetDevice(&device_), "cudaGetDevice");
    CheckCuda(cudaMalloc(&scratch_, sizeof(float)), "cudaMalloc");
    watchdog_ = std::thread([this] { Watch(); });
    Barrier(World());
    Synchronize();
  }

  // A non-blocking communicator of `nranks` ranks; the unique id travels through the file
  // `name` in the rendezvous folder, written by the group's rank 0. (Each group gets its own
  // communicator this way rather than by ncclCommSplit, which NCCL 2.28 refused on a
  // non-blocking parent here: "Attempt to use communicator before the previous operation
  // returned ncclSuccess".)
  ncclComm_t InitComm(const std::string& name, int nranks, int rank, Clock::time_point deadline,
                      const char* what) {
    ncclUniqueId id;
    const std::string path = options_.rendezvous_dir + "/" + name;
    if (rank == 0) {
      CheckNccl(ncclGetUniqueId(&id), nullptr, "ncclGetUniqueId");
      const std::string tmp = path + ".tmp";
      {
        std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(&id), sizeof(id));
        if (!out) throw CollectiveError("cannot write " + tmp);
      }
      if (std::rename(tmp.c_str(), path.c_str()) != 0) {
        throw CollectiveError("cannot publish " + path);
      }
    } else {
      while (true) {
        std::ifstream in(path, std::ios::binary);
        if (in.read(reinterpret_cast<char*>(&id), sizeof(id))) break;
        if (Clock::now() > deadline) {
          throw CollectiveError("rank " + std::to_string(options_.rank) + " found no NCCL id at " +
                                path + " within " + std::to_string(options_.timeout_s) +
                                " s (its group's first rank did not start)");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, id, rank, &config);
    try {
      WaitReady(comm, r, deadline, what);
    } catch (...) {
      if (comm != nullptr) ncclCommAbort(comm);  // a half-made communicator must not linger
      throw;
    }
    return comm;
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  Group CreateGroup(const std::vector<std::vector<int>>& partition) override {
    Group g;
    int color = -1;
    for (size_t i = 0; i < partition.size(); ++i) {
      if (std::find(partition[i].begin(), partition[i].end(), options_.rank) == partition[i].end()) {
        continue;
      }
      color = static_cast<int>(i);
      g.id = next_group_id_ + color;
      g.ranks = partition[i];
      std::sort(g.ranks.begin(), g.ranks.end());
      g.rank = static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), options_.rank) -
                                g.ranks.begin());
    }
    next_group_id_ += static_cast<int>(partition.size());
    if (color < 0) throw CollectiveError("CreateGroup: this rank is in no group");
    ThrowIfFailed();
    ncclComm_t comm = InitComm("nccl-id-g" + std::to_string(g.id), static_cast<int>(g.ranks.size()),
                               g.rank, Clock::now() + Duration(options_.timeout_s),
                               "NCCL group communicator initialisation");
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      comms_[g.id] = comm;
    }
    return g;
  }

  void AllReduce(const Group& g, void* data, size_t count, DataType type, ReduceOp op) override {
    if (g.size() == 1) return;
    ncclComm_t comm = Comm(g);
    Enqueue(comm, "all-reduce", count, [&](cudaStream_t s) {
      return ncclAllReduce(data, data, count, NcclType(type), op == ReduceOp::kSum ? ncclSum : ncclMax,
                           comm, s);
    });
  }

  void AllGather(const Group& g, const void* in, void* out, size_t count_per_rank,
                 DataType type) override {
    if (g.size() == 1) {
      if (in != out) CopyDevice(out, in, count_per_rank * DataTypeSize(type));
      return;
    }
    ncclComm_t comm = Comm(g);
    Enqueue(comm, "all-gather", count_per_rank, [&](cudaStream_t s) {
      return ncclAllGather(in, out, count_per_rank, NcclType(type), comm, s);
    });
  }

  void ReduceScatter(const Group& g, const void* in, void* out, size_t count_per_rank,
                     DataType type) override {
    if (g.size() == 1) {
      if (in != out) CopyDevice(out, in, count_per_rank * DataTypeSize(type));
      return;
    }
    ncclComm_t comm = Comm(g);
    Enqueue(comm, "reduce-scatter", count_per_rank, [&](cudaStream_t s) {
      return ncclReduceScatter(in, out, count_per_rank, NcclType(type), ncclSum, comm, s);
    });
  }

  // Grouped point-to-point calls (ncclSend/ncclRecv to every peer, zero counts skipped), as
  // nccl-tests' alltoall. On a non-blocking communicator ncclGroupEnd may return ncclInProgress;
  // Enqueue waits for it as for the other calls.
  void AllToAll(const Group& g, const void* in, const std::vector<size_t>& send_counts, void* out,
                const std::vector<size_t>& recv_counts, DataType type) override {
    const size_t n = static_cast<size_t>(g.size());
    if (send_counts.size() != n || recv_counts.size() != n) {
      throw CollectiveError("all-to-all: counts must have one entry per group member");
    }
    const size_t elem = DataTypeSize(type);
    if (n == 1) {
      if (send_counts[0] != recv_counts[0]) {
        throw CollectiveError("all-to-all: send and receive counts differ");
      }
      if (in != out && send_counts[0] > 0) CopyDevice(out, in, send_counts[0] * elem);
      return;
    }
    ncclComm_t comm = Comm(g);
    Enqueue(comm, "all-to-all", send_counts.size(), [&](cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      const char* send = static_cast<const char*>(in);
      char* recv = static_cast<char*>(out);
      size_t send_off = 0, recv_off = 0;
      for (size_t peer = 0; peer < n && (r == ncclSuccess || r == ncclInProgress); ++peer) {
        if (send_counts[peer] > 0) {
          r = ncclSend(send + send_off * elem, send_counts[peer], NcclType(type),
                       static_cast<int>(peer), comm, s);
        }
        if ((r == ncclSuccess || r == ncclInProgress) && recv_counts[peer] > 0) {
          r = ncclRecv(recv + recv_off * elem, recv_counts[peer], NcclType(type),
                       static_cast<int>(peer), comm, s);
        }
        send_off += send_counts[peer];
        recv_off += recv_counts[peer];
      }
      const ncclResult_t end = ncclGroupEnd();
      return (r == ncclSuccess || r == ncclInProgress) ? end : r;
    });
  }

  void SendRecv(const Group& g, const std::vector<PeerTransfer>& transfers) override {
    if (transfers.empty()) return;
    for (const PeerTransfer& t : transfers) {
      if (t.peer < 0 || t.peer >= g.size() || t.peer == g.rank) {
        throw CollectiveError("point-to-point: peer " + std::to_string(t.peer) +
                              " is not another group member");
      }
    }
    ncclComm_t comm = Comm(g);
    Enqueue(comm, "send/receive", transfers.size(), [&](cudaStream_t s) {
      ncclResult_t r = ncclGroupStart();
      if (r != ncclSuccess) return r;
      for (const PeerTransfer& t : transfers) {
        if (!(r == ncclSuccess || r == ncclInProgress)) break;
        r = t.send ? ncclSend(t.data, t.count, NcclType(t.type), t.peer, comm, s)
                   : ncclRecv(t.data, t.count, NcclType(t.type), t.peer, comm, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return (r == ncclSuccess || r == ncclInProgress) ? end : r;
    });
  }

  void Barrier(const Group& g) override {
    if (g.size() == 1) return;
    ncclComm_t comm = Comm(g);
    Enqueue(comm, "barrier", 1, [&](cudaStream_t s) {
      return ncclAllReduce(scratch_, scratch_, 1, ncclFloat32, ncclSum, comm, s);
    });
  }

  void Synchronize() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return pending_.empty() || failed_; });
    if (failed_) throw CollectiveError(failure_);
  }

 private:
  struct PendingOp {
    cudaEvent_t event;
    ncclComm_t comm;
    Clock::time_point deadline;
    const char* what;
  };

  ncclComm_t Comm(const Group& g) {
    ThrowIfFailed();
    auto it = comms_.find(g.id);
    if (it == comms_.end()) throw CollectiveError("unknown collective group");
    return it->second;
  }

  void ThrowIfFailed() {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed_) throw CollectiveError(failure_);
  }

  void CheckNccl(ncclResult_t r, ncclComm_t comm, const std::string& what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    std::string text = what + ": " + ncclGetErrorString(r);
    if (comm != nullptr) {
      const char* last = ncclGetLastError(comm);
      if (last != nullptr && *last) text += std::string(" (") + last + ")";
    }
    Fail(text);
    throw CollectiveError(text);
  }

  // Polls a non-blocking communicator until its pending call has finished or the deadline passes.
  void WaitReady(ncclComm_t comm, ncclResult_t r, Clock::time_point deadline, const char* what) {
    CheckNccl(r, comm, what);
    ncclResult_t state = r;
    int polls = 0;
    // A call can stay in progress while NCCL connects to the peers (runtime connection, at the
    // first collective of a kind): a peer that left the trial (its marker) ends the wait now.
    Clock::time_point next_marker_check = Clock::now() + std::chrono::milliseconds(100);
    while (state == ncclInProgress) {
      std::string problem;
      if (Clock::now() > deadline) {
        problem = std::string(what) + " timed out after " + std::to_string(options_.timeout_s) + " s";
      } else if (Clock::now() > next_marker_check) {
        next_marker_check = Clock::now() + std::chrono::milliseconds(100);
        const std::string departed = DepartedPeer();
        if (!departed.empty()) problem = std::string(what) + " abandoned: " + departed;
      }
      if (!problem.empty()) {
        Fail(problem);
        AbortAll();
        throw CollectiveError(problem);
      }
      // Spin briefly (an enqueue finishes in microseconds), then back off (initialisation).
      if (++polls < 1000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
      if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
    }
    CheckNccl(state, comm, what);
  }

  template <typename F>
  void Enqueue(ncclComm_t comm, const char* what, size_t count, F&& call) {
    // NCCL calls on one communicator from two threads at once are undefined behaviour (and the
    // ranks would disagree on the order): refuse them with a clear error rather than corrupt.
    struct Entered {
      std::atomic<int>& n;
      ~Entered() { n.fetch_sub(1); }
    } entered{callers_};
    if (callers_.fetch_add(1) != 0) {
      const std::string text = std::string(what) + ": collectives called from two threads at once";
      Fail(text);
      throw CollectiveError(text);
    }
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    if (trace_) {
      // REMAT_TRACE_COLLECTIVES=1: one line per collective, to compare the ranks' sequences.
      std::fprintf(stderr, "collective %lld rank %d %s count %zu comm %p thread %ld stream %p\n",
                   static_cast<long long>(traced_++), options_.rank, what, count,
                   static_cast<void*>(comm), static_cast<long>(::gettid()),
                   static_cast<void*>(stream));
    }
    ncclResult_t r = call(stream);
    WaitReady(comm, r, Clock::now() + Duration(options_.timeout_s), what);
    cudaEvent_t event;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_events_.empty()) {
        CheckCuda(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
      } else {
        event = free_events_.back();
        free_events_.pop_back();
      }
    }
    CheckCuda(cudaEventRecord(event, stream), "cudaEventRecord");
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_.push_back(PendingOp{event, comm, Clock::now() + Duration(options_.timeout_s), what});
    }
    cv_.notify_all();
  }

  void CopyDevice(void* out, const void* in, size_t bytes) {
    cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
    CheckCuda(cudaMemcpyAsync(out, in, bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
  }

  // The watchdog: retires completed collectives; aborts everything when one is late or failed.
  void Watch() {
    cudaSetDevice(DeviceOfThisRank());
    std::unique_lock<std::mutex> lock(mu_);
    Clock::time_point next_marker_check = Clock::now();
    while (!stop_) {
      if (pending_.empty() || failed_) {
        cv_.wait_for(lock, std::chrono::milliseconds(50));
        continue;
      }
      PendingOp op = pending_.front();
      lock.unlock();
      const cudaError_t q = cudaEventQuery(op.event);
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(op.comm, &async);
      lock.lock();
      if (q == cudaSuccess) {
        pending_.pop_front();
        free_events_.push_back(op.event);
        cv_.notify_all();
        continue;
      }
      std::string problem;
      if (async != ncclSuccess && async != ncclInProgress) {
        problem = std::string(op.what) + " failed: " + ncclGetErrorString(async);
      } else if (q != cudaErrorNotReady) {
        problem = std::string(op.what) + " failed: " + cudaGetErrorString(q);
      } else if (Clock::now() > op.deadline) {
        problem = std::string(op.what) + " timed out after " + std::to_string(options_.timeout_s) +
                  " s (a rank is missing or hung); NCCL communicators aborted";
      } else if (Clock::now() > next_marker_check) {
        next_marker_check = Clock::now() + std::chrono::milliseconds(100);
        lock.unlock();
        std::string departed = DepartedPeer();
        lock.lock();
        if (!departed.empty()) problem = std::string(op.what) + " abandoned: " + departed;
      }
      if (!problem.empty()) {
        failed_ = true;
        failure_ = problem;
        lock.unlock();
        AbortAll();
        lock.lock();
        cv_.notify_all();
        continue;
      }
      lock.unlock();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      lock.lock();
    }
  }

  int DeviceOfThisRank() const {
    int device = 0;
    cudaGetDevice(&device);
    return device_ >= 0 ? device_ : device;
  }

  void Fail(const std::string& text) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) {
      failed_ = true;
      failure_ = text;
    }
    cv_.notify_all();
  }

  // ncclCommFinalize + ncclCommDestroy; what is not finalized within one shared deadline (at most
  // 30 s for all communicators, well inside the worker's 60 s lingering-peer grace) is aborted.
  void FinalizeAll() {
    std::lock_guard<std::mutex> lock(abort_mu_);
    const auto deadline = Clock::now() + Duration(std::min(options_.timeout_s, 30.0));
    for (auto& [id, comm] : comms_) {
      if (comm == nullptr) continue;
      ncclResult_t state = ncclCommFinalize(comm);
      while (state == ncclInProgress && Clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess) break;
      }
      if (state == ncclSuccess) {
        ncclCommDestroy(comm);
      } else {
        ncclCommAbort(comm);
      }
      comm = nullptr;
    }
  }

  // A rank whose trial failed leaves a marker in the rendezvous folder (see the destructor).
  std::string DepartedPeer() const {
    for (int r = 0; r < options_.world_size; ++r) {
      if (r == options_.rank) continue;
      std::ifstream marker(options_.rendezvous_dir + "/left-" + std::to_string(r));
      if (marker) return "rank " + std::to_string(r) + " left the trial (its trial failed)";
    }
    return "";
  }

  void AbortAll() {
    std::lock_guard<std::mutex> lock(abort_mu_);
    for (auto& [id, comm] : comms_) {
      if (comm != nullptr) ncclCommAbort(comm);
      comm = nullptr;
    }
  }

  CollectivesOptions options_;
  const bool trace_;
  std::atomic<long long> traced_{0};
  std::atomic<int> callers_{0};  // threads inside Enqueue
  std::map<int, ncclComm_t> comms_;  // group id -> communicator; 0 is the world
  int next_group_id_ = 1;
  int device_ = -1;
  void* scratch_ = nullptr;

  std::mutex mu_;
  std::mutex abort_mu_;
  std::condition_variable cv_;
  std::deque<PendingOp> pending_;
  std::vector<cudaEvent_t> free_events_;
  bool failed_ = false;
  bool stop_ = false;
  std::string failure_;
  std::thread watchdog_;
};

}  // namespace

std::unique_ptr<Collectives> NewNcclCollectives(const CollectivesOptions& options) {
  auto c = std::make_unique<NcclCollectives>(options);
  c->Init();
  return c;
}

}  // namespace remat::engine
