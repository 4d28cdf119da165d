// CPU collectives over loopback TCP with rank 0 as the hub (engine/tcp_hub.h).
//
// Rank 0 listens on 127.0.0.1 (an ephemeral port), publishes "PORT WORLD" in <rendezvous>/hub
// (written to a temporary name and renamed, so readers never see half a file) and starts the hub.
// Every rank, rank 0 included, connects to the hub and says hello; a collective is one request
// per member (op, group, sequence number, members, payload) answered by the hub (engine/tcp_wire.h
// for the format). Each wait is bounded by the timeout.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "engine/collectives.h"
#include "engine/tcp_hub.h"
#include "engine/tcp_wire.h"

namespace remat::engine {
namespace {

using namespace tcp;  // NOLINT: this file is the wire format's client

// ------------------------------------------------------------------------------------------------

class TcpCollectives final : public Collectives {
 public:
  explicit TcpCollectives(const CollectivesOptions& o)
      : options_(o), nccl_p2p_(o.nccl_point_to_point) {}

  ~TcpCollectives() override {
    if (fd_ >= 0) {
      if (!failed_) {
        Header bye;
        bye.op = kBye;
        bye.sender = static_cast<uint32_t>(options_.rank);
        SendMessage(fd_, bye, {}, nullptr, Clock::now() + std::chrono::seconds(2));
      }
      ::close(fd_);
    }
    if (hub_) {
      hub_->RequestStop();
      hub_->Join();
    }
  }

  void Connect() {
    const auto deadline = Deadline();
    const std::string hub_file = options_.rendezvous_dir + "/hub";
    if (options_.rank == 0) StartHub(hub_file);
    while (true) {
      if (SecondsLeft(deadline) <= 0) {
        Fail("rank " + std::to_string(options_.rank) + " found no hub at " + hub_file + " within " +
             std::to_string(static_cast<int>(options_.timeout_s)) + " s (rank 0 did not start)");
      }
      int port = 0, world = 0;
      std::ifstream in(hub_file);
      if (in >> port >> world) {
        if (world != options_.world_size) {
          Fail("rendezvous " + hub_file + " is for world size " + std::to_string(world) +
               ", this rank expects " + std::to_string(options_.world_size));
        }
        int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(port));
        addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
          int one = 1;
          ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          fd_ = fd;
          break;
        }
        ::close(fd);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    Header hello;
    hello.op = kHello;
    hello.sender = static_cast<uint32_t>(options_.rank);
    hello.group = static_cast<uint32_t>(options_.world_size);
    std::string err = SendMessage(fd_, hello, {}, nullptr, deadline);
    if (!err.empty()) Fail("rendezvous hello to rank 0 failed: " + err);
    Barrier(World());  // everyone is here, or a clear error
  }

  int rank() const override { return options_.rank; }
  int world_size() const override { return options_.world_size; }

  Group CreateGroup(const std::vector<std::vector<int>>& partition) override {
    Group g;
    for (size_t i = 0; i < partition.size(); ++i) {
      auto it = std::find(partition[i].begin(), partition[i].end(), options_.rank);
      if (it == partition[i].end()) continue;
      g.id = next_group_id_ + static_cast<int>(i);
      g.ranks = partition[i];
      std::sort(g.ranks.begin(), g.ranks.end());
      g.rank = static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), options_.rank) -
                                g.ranks.begin());
    }
    next_group_id_ += static_cast<int>(partition.size());
    if (g.ranks.empty()) throw CollectiveError("CreateGroup: this rank is in no group");
    return g;
  }

  void AllReduce(const Group& g, void* data, size_t count, DataType type, ReduceOp op) override {
    if (g.size() == 1) return;
    const size_t bytes = count * DataTypeSize(type);
    Message reply = Exchange(kAllReduce, g, data, bytes, type, op);
    Expect(reply, bytes);
    std::memcpy(data, reply.payload.data(), bytes);
  }

  void AllGather(const Group& g, const void* in, void* out, size_t count_per_rank,
                 DataType type) override {
    const size_t bytes = count_per_rank * DataTypeSize(type);
    if (g.size() == 1) {
      std::memmove(out, in, bytes);
      return;
    }
    Message reply = Exchange(kAllGather, g, in, bytes, type, ReduceOp::kSum);
    Expect(reply, bytes * g.size());
    std::memcpy(out, reply.payload.data(), reply.payload.size());
  }

  void ReduceScatter(const Group& g, const void* in, void* out, size_t count_per_rank,
                     DataType type) override {
    const size_t bytes = count_per_rank * DataTypeSize(type);
    if (g.size() == 1) {
      std::memmove(out, in, bytes);
      return;
    }
    Message reply = Exchange(kReduceScatter, g, in, bytes * g.size(), type, ReduceOp::kSum);
    Expect(reply, bytes);
    std::memcpy(out, reply.payload.data(), bytes);
  }

  void AllToAll(const Group& g, const void* in, const std::vector<size_t>& send_counts, void* out,
                const std::vector<size_t>& recv_counts, DataType type) override {
    const size_t n = static_cast<size_t>(g.size());
    if (send_counts.size() != n || recv_counts.size() != n) {
      Fail("all-to-all: counts must have one entry per group member");
    }
    const size_t elem = DataTypeSize(type);
    size_t send_total = 0, recv_total = 0;
    for (size_t c : send_counts) send_total += c;
    for (size_t c : recv_counts) recv_total += c;
    if (n == 1) {
      if (send_total != recv_total) Fail("all-to-all: send and receive counts differ");
      if (in != out && send_total > 0) std::memmove(out, in, send_total * elem);
      return;
    }
    std::vector<char> payload(n * sizeof(uint64_t) + send_total * elem);
    for (size_t i = 0; i < n; ++i) {
      const uint64_t bytes = send_counts[i] * elem;
      std::memcpy(payload.data() + i * sizeof(uint64_t), &bytes, sizeof(bytes));
    }
    if (send_total > 0) std::memcpy(payload.data() + n * sizeof(uint64_t), in, send_total * elem);
    Message reply = Exchange(kAllToAll, g, payload.data(), payload.size(), type, ReduceOp::kSum);
    Expect(reply, recv_total * elem);
    if (recv_total > 0) std::memcpy(out, reply.payload.data(), recv_total * elem);
  }

  void Barrier(const Group& g) override {
    if (g.size() == 1) return;
    Exchange(kBarrier, g, nullptr, 0, DataType::kFloat32, ReduceOp::kSum);
  }

  void SendRecv(const Group& g, const std::vector<PeerTransfer>& transfers) override {
    if (failed_) throw CollectiveError(failure_);
    const auto deadline = Deadline();
    std::vector<const PeerTransfer*> receives;
    int unreceived_sends = 0;
    for (const PeerTransfer& t : transfers) {
      if (t.peer < 0 || t.peer >= g.size() || t.peer == g.rank) {
        Fail("point-to-point: peer " + std::to_string(t.peer) + " is not another group member");
      }
      Header h;
      h.op = t.send ? kSend : kRecv;
      h.group = static_cast<uint32_t>(g.id);
      h.dtype = static_cast<uint32_t>(t.type);
      h.reduce = nccl_p2p_ ? 0 : static_cast<uint32_t>(t.tag);
      h.pad = nccl_p2p_ && t.send ? 1 : 0;
      h.sender = static_cast<uint32_t>(options_.rank);
      const size_t bytes = t.count * DataTypeSize(t.type);
      h.payload_bytes = t.send ? bytes : 0;
      h.seq = t.send ? 0 : bytes;
      std::string err = SendMessage(fd_, h, {static_cast<uint32_t>(g.ranks[t.peer])}, t.data,
                                    deadline);
      if (!err.empty()) Fail(std::string(t.send ? "send" : "receive") + " failed: " + err);
      if (!t.send) receives.push_back(&t);
      if (t.send && nccl_p2p_) ++unreceived_sends;
    }
    // Replies come in the order the sends arrive at the hub: match each to the first open
    // receive from its source with its tag (NCCL semantics: with any tag).
    while (!receives.empty() || unreceived_sends > 0) {
      Message reply;
      std::string err = ReceiveMessage(fd_, &reply, deadline);
      if (err == "timeout") {
        Fail((receives.empty() ? std::string("a send was not received")
                               : "receive from rank " +
                                     std::to_string(g.ranks[receives.front()->peer])) +
             " within " + std::to_string(static_cast<int>(options_.timeout_s)) +
             " s: timed out (a rank is missing or hung)");
      }
      if (!err.empty()) Fail("receive failed: " + err);
      if (reply.header.op == kError) Fail(std::string(reply.payload.begin(), reply.payload.end()));
      if (reply.header.op == kSendDone) {
        --unreceived_sends;
        continue;
      }
      auto it = std::find_if(receives.begin(), receives.end(), [&](const PeerTransfer* t) {
        return static_cast<uint32_t>(g.ranks[t->peer]) == reply.header.sender &&
               (nccl_p2p_ || static_cast<uint32_t>(t->tag) == reply.header.reduce);
      });
      if (it == receives.end()) Fail("point-to-point: unexpected reply");
      Expect(reply, (*it)->count * DataTypeSize((*it)->type));
      std::memcpy((*it)->data, reply.payload.data(), reply.payload.size());
      receives.erase(it);
    }
  }

  void Synchronize() override {
    if (failed_) throw CollectiveError(failure_);
  }

 private:
  Clock::time_point Deadline() const {
    return Clock::now() + std::chrono::duration_cast<Clock::duration>(
                              std::chrono::duration<double>(options_.timeout_s));
  }

  [[noreturn]] void Fail(const std::string& why) {
    failed_ = true;
    failure_ = why;
    throw CollectiveError(why);
  }

  void StartHub(const std::string& hub_file) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) Fail(std::string("socket: ") + std::strerror(errno));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = 0;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        ::listen(fd, 128) != 0) {
      ::close(fd);
      Fail(std::string("hub bind/listen: ") + std::strerror(errno));
    }
    socklen_t len = sizeof(addr);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    hub_ = tcp::StartHub(fd, options_.world_size, options_.timeout_s);
    const std::string tmp = hub_file + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << ntohs(addr.sin_port) << " " << options_.world_size << "\n";
      if (!out) Fail("cannot write the rendezvous file " + tmp);
    }
    if (std::rename(tmp.c_str(), hub_file.c_str()) != 0) {
      Fail("cannot publish the rendezvous file " + hub_file + ": " + std::strerror(errno));
    }
  }

  Message Exchange(uint32_t op, const Group& g, const void* payload, size_t bytes, DataType type,
                   ReduceOp reduce) {
    if (failed_) throw CollectiveError(failure_);
    Header h;
    h.op = op;
    h.group = static_cast<uint32_t>(g.id);
    h.dtype = static_cast<uint32_t>(type);
    h.reduce = static_cast<uint32_t>(reduce);
    h.sender = static_cast<uint32_t>(options_.rank);
    h.seq = seq_[g.id]++;
    h.payload_bytes = bytes;
    std::vector<uint32_t> members(g.ranks.begin(), g.ranks.end());
    const auto deadline = Deadline();
    std::string err = SendMessage(fd_, h, members, payload, deadline);
    Message reply;
    if (err.empty()) err = ReceiveMessage(fd_, &reply, deadline);
    if (err == "timeout") {
      std::ostringstream msg;
      msg << OpName(op) << " over ranks [";
      for (size_t i = 0; i < g.ranks.size(); ++i) msg << (i ? "," : "") << g.ranks[i];
      msg << "] timed out after " << options_.timeout_s << " s (a rank is missing or hung)";
      Fail(msg.str());
    }
    if (!err.empty()) Fail(std::string(OpName(op)) + " failed: " + err);
    if (reply.header.op == kError) {
      Fail(std::string(reply.payload.begin(), reply.payload.end()));
    }
    return reply;
  }

  void Expect(const Message& reply, size_t bytes) {
    if (reply.payload.size() != bytes) Fail("collective reply of the wrong size");
  }

  CollectivesOptions options_;
  bool nccl_p2p_ = false;  // CollectivesOptions::nccl_point_to_point
  int fd_ = -1;
  std::unique_ptr<Hub> hub_;
  std::map<int, uint64_t> seq_;
  int next_group_id_ = 1;
  bool failed_ = false;
  std::string failure_;
};

class SingleRankCollectives final : public Collectives {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  Group CreateGroup(const std::vector<std::vector<int>>&) override { return World(); }
  void AllReduce(const Group&, void*, size_t, DataType, ReduceOp) override {}
  void AllGather(const Group&, const void* in, void* out, size_t count, DataType t) override {
    if (in != out) std::memmove(out, in, count * DataTypeSize(t));
  }
  void ReduceScatter(const Group&, const void* in, void* out, size_t count, DataType t) override {
    if (in != out) std::memmove(out, in, count * DataTypeSize(t));
  }
  void AllToAll(const Group&, const void* in, const std::vector<size_t>& send_counts, void* out,
                const std::vector<size_t>& recv_counts, DataType t) override {
    size_t sent = 0, received = 0;
    for (size_t c : send_counts) sent += c;
    for (size_t c : recv_counts) received += c;
    if (sent != received) throw CollectiveError("all-to-all: send and receive counts differ");
    if (in != out && sent > 0) std::memmove(out, in, sent * DataTypeSize(t));
  }
  void Barrier(const Group&) override {}
  void SendRecv(const Group&, const std::vector<PeerTransfer>& transfers) override {
    if (!transfers.empty()) throw CollectiveError("point-to-point: a world of one has no peers");
  }
  void Synchronize() override {}
};

}  // namespace

size_t DataTypeSize(DataType t) {
  switch (t) {
    case DataType::kFloat32: return 4;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat64: return 8;
    case DataType::kInt64: return 8;
  }
  return 1;
}

Group Collectives::World() const {
  Group g;
  g.id = 0;
  for (int r = 0; r < world_size(); ++r) g.ranks.push_back(r);
  g.rank = rank();
  return g;
}

std::unique_ptr<Collectives> NewSingleRankCollectives() {
  return std::make_unique<SingleRankCollectives>();
}

std::unique_ptr<Collectives> NewTcpCollectives(const CollectivesOptions& options) {
  auto c = std::make_unique<TcpCollectives>(options);
  c->Connect();
  return c;
}

}  // namespace remat::engine
