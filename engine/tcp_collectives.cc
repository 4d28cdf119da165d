// CPU collectives over loopback TCP with rank 0 as the hub.
//
// Rank 0 listens on 127.0.0.1 (an ephemeral port), publishes "PORT WORLD" in <rendezvous>/hub
// (written to a temporary name and renamed, so readers never see half a file) and runs a hub
// thread. Every rank, rank 0 included, connects to the hub and says hello (its rank and the world
// size). A collective is one request per member (op, group, sequence number, members, payload);
// when the hub holds the requests of every member it computes the result in member order (so
// results are deterministic) and answers each member. Each wait is bounded by the timeout; a rank
// that never joins or disconnects without saying goodbye makes the hub send an error to everyone.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <tuple>

#include "engine/collectives.h"

namespace remat::engine {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kMagic = 0x52454d54;  // "REMT"

enum Op : uint32_t {
  kHello = 1,
  kAllReduce = 2,
  kAllGather = 3,
  kReduceScatter = 4,
  kBarrier = 5,
  kBye = 6,
  kReply = 7,
  kError = 8,
  kAllToAll = 9,
  kSend = 10,  // point-to-point: members = {destination}, reduce = tag, payload = the data
  kRecv = 11,  // members = {source}, reduce = tag, seq = expected bytes; answered with the data
  kSendDone = 12,  // to a sender that asked (pad = 1): its send was received (sender = receiver)
};

const char* OpName(uint32_t op) {
  switch (op) {
    case kAllReduce: return "all-reduce";
    case kAllGather: return "all-gather";
    case kReduceScatter: return "reduce-scatter";
    case kBarrier: return "barrier";
    case kAllToAll: return "all-to-all";
    case kSend: return "send";
    case kRecv: return "receive";
    default: return "collective";
  }
}

// Fixed-size message header; integers in host byte order (both ends are on this host).
struct Header {
  uint32_t magic = kMagic;
  uint32_t op = 0;
  uint32_t group = 0;
  uint32_t dtype = 0;
  uint32_t reduce = 0;
  uint32_t sender = 0;
  uint32_t num_members = 0;  // followed by num_members uint32 ranks
  uint32_t pad = 0;
  uint64_t seq = 0;
  uint64_t payload_bytes = 0;  // follows the member list
};

double SecondsLeft(Clock::time_point deadline) {
  return std::chrono::duration<double>(deadline - Clock::now()).count();
}

// Reads or writes exactly n bytes before the deadline. Returns "" or what went wrong.
std::string ReadFull(int fd, void* buf, size_t n, Clock::time_point deadline) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    double left = SecondsLeft(deadline);
    if (left <= 0) return "timeout";
    pollfd pfd{fd, POLLIN, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return std::string("poll: ") + std::strerror(errno);
    }
    if (r == 0) continue;
    ssize_t got = ::recv(fd, p, n, 0);
    if (got == 0) return "connection closed";
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return std::string("recv: ") + std::strerror(errno);
    }
    p += got;
    n -= static_cast<size_t>(got);
  }
  return "";
}

std::string WriteFull(int fd, const void* buf, size_t n, Clock::time_point deadline) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    double left = SecondsLeft(deadline);
    if (left <= 0) return "timeout";
    pollfd pfd{fd, POLLOUT, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(std::min(left * 1000.0, 1000.0)) + 1);
    if (r < 0) {
      if (errno == EINTR) continue;
      return std::string("poll: ") + std::strerror(errno);
    }
    if (r == 0) continue;
    ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL);
    if (sent < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return std::string("send: ") + std::strerror(errno);
    }
    p += sent;
    n -= static_cast<size_t>(sent);
  }
  return "";
}

std::string SendMessage(int fd, Header h, const std::vector<uint32_t>& members, const void* payload,
                        Clock::time_point deadline) {
  h.num_members = static_cast<uint32_t>(members.size());
  std::string err = WriteFull(fd, &h, sizeof(h), deadline);
  if (err.empty() && !members.empty()) {
    err = WriteFull(fd, members.data(), members.size() * sizeof(uint32_t), deadline);
  }
  if (err.empty() && h.payload_bytes > 0) err = WriteFull(fd, payload, h.payload_bytes, deadline);
  return err;
}

struct Message {
  Header header;
  std::vector<uint32_t> members;
  std::vector<char> payload;
};

std::string ReceiveMessage(int fd, Message* m, Clock::time_point deadline) {
  std::string err = ReadFull(fd, &m->header, sizeof(Header), deadline);
  if (!err.empty()) return err;
  if (m->header.magic != kMagic) return "bad message (not a remat collective peer)";
  if (m->header.num_members > (1u << 16)) return "bad message (member count)";
  m->members.resize(m->header.num_members);
  if (!m->members.empty()) {
    err = ReadFull(fd, m->members.data(), m->members.size() * sizeof(uint32_t), deadline);
    if (!err.empty()) return err;
  }
  m->payload.resize(m->header.payload_bytes);
  if (!m->payload.empty()) err = ReadFull(fd, m->payload.data(), m->payload.size(), deadline);
  return err;
}

float Bf16ToFloat(uint16_t v) {
  uint32_t bits = static_cast<uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

uint16_t FloatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  if (std::isnan(f)) return 0x7fc0;
  uint32_t rounding = 0x7fff + ((bits >> 16) & 1);  // round to nearest even, like c10::BFloat16
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// acc[i] = op(acc[i], in[i]); the first member's buffer is copied into acc beforehand.
void Accumulate(DataType t, ReduceOp op, char* acc, const char* in, size_t count) {
  auto combine = [op](auto a, auto b) { return op == ReduceOp::kSum ? a + b : std::max(a, b); };
  switch (t) {
    case DataType::kFloat32: {
      auto* a = reinterpret_cast<float*>(acc);
      auto* b = reinterpret_cast<const float*>(in);
      for (size_t i = 0; i < count; ++i) a[i] = combine(a[i], b[i]);
      break;
    }
    case DataType::kFloat64: {
      auto* a = reinterpret_cast<double*>(acc);
      auto* b = reinterpret_cast<const double*>(in);
      for (size_t i = 0; i < count; ++i) a[i] = combine(a[i], b[i]);
      break;
    }
    case DataType::kInt64: {
      auto* a = reinterpret_cast<int64_t*>(acc);
      auto* b = reinterpret_cast<const int64_t*>(in);
      for (size_t i = 0; i < count; ++i) a[i] = combine(a[i], b[i]);
      break;
    }
    case DataType::kBFloat16: {
      auto* a = reinterpret_cast<uint16_t*>(acc);
      auto* b = reinterpret_cast<const uint16_t*>(in);
      for (size_t i = 0; i < count; ++i) {
        a[i] = FloatToBf16(combine(Bf16ToFloat(a[i]), Bf16ToFloat(b[i])));
      }
      break;
    }
  }
}

// ------------------------------------------------------------------------------------------------
// The hub: runs on its own thread in rank 0.

class Hub {
 public:
  Hub(int listen_fd, int world_size, double timeout_s)
      : listen_fd_(listen_fd), world_size_(world_size), timeout_s_(timeout_s),
        fds_(world_size, -1), said_bye_(world_size, false) {}
  ~Hub() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
    ::close(listen_fd_);
  }

  void Start() { thread_ = std::thread([this] { Run(); }); }
  // Asks the hub to finish once every rank has said goodbye (or after the grace period).
  void RequestStop() { stop_ = true; }
  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Pending {
    std::map<uint32_t, Message> by_rank;
  };

  void Run() {
    const auto join_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(timeout_s_));
    if (!AcceptAll(join_deadline)) return;
    Serve();
  }

  bool AcceptAll(Clock::time_point deadline) {
    int joined = 0;
    while (joined < world_size_) {
      double left = SecondsLeft(deadline);
      if (left <= 0 || stop_) {
        std::string missing;
        for (int r = 0; r < world_size_; ++r) {
          if (fds_[r] < 0) missing += (missing.empty() ? "" : ",") + std::to_string(r);
        }
        BroadcastError("rendezvous timed out after " + std::to_string(static_cast<int>(timeout_s_)) +
                       " s: rank(s) " + missing + " did not join");
        return false;
      }
      pollfd pfd{listen_fd_, POLLIN, 0};
      int r = ::poll(&pfd, 1, static_cast<int>(std::min(left * 1000.0, 200.0)) + 1);
      if (r <= 0) continue;
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      Message hello;
      std::string err = ReceiveMessage(fd, &hello, Clock::now() + std::chrono::seconds(10));
      const int rank = static_cast<int>(hello.header.sender);
      if (!err.empty() || hello.header.op != kHello || rank < 0 || rank >= world_size_ ||
          static_cast<int>(hello.header.group) != world_size_ || fds_[rank] >= 0) {
        ::close(fd);  // a stranger, a duplicate rank or a world-size mismatch
        continue;
      }
      fds_[rank] = fd;
      ++joined;
    }
    return true;
  }

  void Serve() {
    std::map<std::pair<uint32_t, uint64_t>, Pending> pending;
    std::vector<pollfd> pfds(world_size_);
    // After RequestStop the hub lingers until everyone said goodbye, at most the timeout.
    Clock::time_point stop_deadline = Clock::time_point::max();
    while (true) {
      int open = 0;
      for (int r = 0; r < world_size_; ++r) {
        pfds[r] = pollfd{fds_[r], POLLIN, 0};
        if (fds_[r] >= 0) ++open;
      }
      if (open == 0) return;
      if (stop_ && stop_deadline == Clock::time_point::max()) {
        stop_deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s_));
      }
      if (Clock::now() > stop_deadline) return;
      int n = ::poll(pfds.data(), pfds.size(), 100);
      if (n <= 0) continue;
      for (int r = 0; r < world_size_; ++r) {
        if (fds_[r] < 0 || !(pfds[r].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Message m;
        const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                 std::chrono::duration<double>(timeout_s_));
        std::string err = ReceiveMessage(fds_[r], &m, deadline);
        if (!err.empty() || m.header.op == kBye) {
          const bool clean = err.empty();
          ::close(fds_[r]);
          fds_[r] = -1;
          if (!clean && !said_bye_[r]) {
            BroadcastError("rank " + std::to_string(r) + " left the trial (" + err + ")");
            return;
          }
          said_bye_[r] = true;
          // Receives waiting for the departed rank's data can never complete either.
          for (auto& [key, waiters] : waiting_) {
            if (std::get<1>(key) != static_cast<uint32_t>(r)) continue;
            for (const Header& w : waiters) ReplyError(w.sender, Departed(r));
            waiters.clear();
          }
          // Collectives that wait for the departed rank can never complete: fail them now.
          for (auto it = pending.begin(); it != pending.end();) {
            const auto& members = it->second.by_rank.begin()->second.members;
            if (std::find(members.begin(), members.end(), static_cast<uint32_t>(r)) !=
                members.end()) {
              for (auto& [rank, msg] : it->second.by_rank) ReplyError(rank, Departed(r));
              it = pending.erase(it);
            } else {
              ++it;
            }
          }
          continue;
        }
        if (m.header.op == kSend || m.header.op == kRecv) {
          PointToPoint(std::move(m));
          continue;
        }
        int departed = -1;
        for (uint32_t member : m.members) {
          if (member < said_bye_.size() && said_bye_[member]) departed = static_cast<int>(member);
        }
        if (departed >= 0) {
          ReplyError(r, Departed(departed));
          continue;
        }
        auto key = std::make_pair(m.header.group, m.header.seq);
        Pending& p = pending[key];
        const size_t members = m.members.size();
        p.by_rank[m.header.sender] = std::move(m);
        if (p.by_rank.size() == members) {
          Complete(p);
          pending.erase(key);
        }
      }
    }
  }

  void Complete(Pending& p) {
    const Message& first = p.by_rank.begin()->second;
    const Header& h = first.header;
    const std::vector<uint32_t>& members = first.members;
    const auto type = static_cast<DataType>(h.dtype);
    const size_t elem = DataTypeSize(type);
    std::vector<char> result;
    if (h.op == kAllReduce || h.op == kReduceScatter) {
      result = p.by_rank.at(members[0]).payload;
      for (size_t i = 1; i < members.size(); ++i) {
        const auto& in = p.by_rank.at(members[i]).payload;
        if (in.size() != result.size()) {
          BroadcastError("collective size mismatch between ranks");
          return;
        }
        Accumulate(type, static_cast<ReduceOp>(h.reduce), result.data(), in.data(),
                   result.size() / elem);
      }
    } else if (h.op == kAllGather) {
      for (uint32_t rank : members) {
        const auto& in = p.by_rank.at(rank).payload;
        result.insert(result.end(), in.begin(), in.end());
      }
    } else if (h.op == kAllToAll) {
      CompleteAllToAll(p, members);
      return;
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s_));
    for (size_t i = 0; i < members.size(); ++i) {
      Header reply = h;
      reply.op = kReply;
      const char* data = result.data();
      size_t bytes = result.size();
      if (h.op == kReduceScatter) {
        bytes = result.size() / members.size();
        data = result.data() + i * bytes;
      } else if (h.op == kBarrier) {
        bytes = 0;
      }
      reply.payload_bytes = bytes;
      const int fd = fds_[members[i]];
      if (fd >= 0) SendMessage(fd, reply, {}, data, deadline);
    }
  }

  // All-to-all: each member's payload is its send counts in bytes (one uint64 per member), then
  // the data packed in member order; member i receives every member's chunk for i, in order.
  void CompleteAllToAll(Pending& p, const std::vector<uint32_t>& members) {
    const size_t n = members.size();
    std::vector<std::vector<uint64_t>> offsets(n, std::vector<uint64_t>(n + 1, 0));
    for (size_t j = 0; j < n; ++j) {
      const auto& in = p.by_rank.at(members[j]).payload;
      if (in.size() < n * sizeof(uint64_t)) {
        BroadcastError("all-to-all: malformed request");
        return;
      }
      uint64_t off = n * sizeof(uint64_t);
      for (size_t i = 0; i < n; ++i) {
        uint64_t bytes;
        std::memcpy(&bytes, in.data() + i * sizeof(uint64_t), sizeof(bytes));
        offsets[j][i] = off;
        off += bytes;
      }
      offsets[j][n] = off;
      if (off != in.size()) {
        BroadcastError("all-to-all: send counts do not match the payload");
        return;
      }
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s_));
    for (size_t i = 0; i < n; ++i) {
      std::vector<char> out;
      for (size_t j = 0; j < n; ++j) {
        const auto& in = p.by_rank.at(members[j]).payload;
        out.insert(out.end(), in.begin() + static_cast<std::ptrdiff_t>(offsets[j][i]),
                   in.begin() + static_cast<std::ptrdiff_t>(offsets[j][i + 1]));
      }
      Header reply = p.by_rank.at(members[i]).header;
      reply.op = kReply;
      reply.payload_bytes = out.size();
      const int fd = fds_[members[i]];
      if (fd >= 0) SendMessage(fd, reply, {}, out.data(), deadline);
    }
  }

  // Point-to-point: a send's data waits in the mailbox of its (group, source, destination, tag)
  // until the destination asks for it; receives are answered in the order they were posted.
  using P2PKey = std::tuple<uint32_t, uint32_t, uint32_t, uint32_t>;  // group, src, dst, tag
  struct Sent {
    std::vector<char> payload;
    bool ack = false;  // the sender waits for kSendDone
  };

  void PointToPoint(Message m) {
    if (m.members.size() != 1 || m.members[0] >= fds_.size()) {
      ReplyError(m.header.sender, "point-to-point: bad peer");
      return;
    }
    const uint32_t peer = m.members[0];
    if (m.header.op == kSend) {
      if (said_bye_[peer]) return;  // nobody will ask for it
      P2PKey key{m.header.group, m.header.sender, peer, m.header.reduce};
      mailbox_[key].push_back(Sent{std::move(m.payload), m.header.pad == 1});
      Deliver(key);
      return;
    }
    P2PKey key{m.header.group, peer, m.header.sender, m.header.reduce};
    waiting_[key].push_back(m.header);
    Deliver(key);
    if (!waiting_[key].empty() && said_bye_[peer] && mailbox_[key].empty()) {
      for (const Header& w : waiting_[key]) ReplyError(w.sender, Departed(static_cast<int>(peer)));
      waiting_[key].clear();
    }
  }

  void Deliver(const P2PKey& key) {
    auto& data = mailbox_[key];
    auto& waiters = waiting_[key];
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s_));
    while (!data.empty() && !waiters.empty()) {
      const Header w = waiters.front();
      Sent sent = std::move(data.front());
      const std::vector<char>& payload = sent.payload;
      waiters.pop_front();
      data.pop_front();
      if (sent.ack && fds_[std::get<1>(key)] >= 0) {
        Header done;
        done.op = kSendDone;
        done.sender = w.sender;
        SendMessage(fds_[std::get<1>(key)], done, {}, nullptr, deadline);
      }
      if (payload.size() != w.seq) {
        ReplyError(w.sender, "point-to-point: receive of " + std::to_string(w.seq) +
                                 " bytes matched a send of " + std::to_string(payload.size()));
        continue;
      }
      Header reply = w;
      reply.op = kReply;
      reply.sender = std::get<1>(key);  // the source, so the receiver can match it
      reply.payload_bytes = payload.size();
      const int fd = fds_[w.sender];
      if (fd >= 0) SendMessage(fd, reply, {}, payload.data(), deadline);
    }
  }

  static std::string Departed(int rank) {
    return "rank " + std::to_string(rank) + " left the trial before this collective";
  }

  void ReplyError(uint32_t rank, const std::string& text) {
    if (rank >= fds_.size() || fds_[rank] < 0) return;
    Header h;
    h.op = kError;
    h.payload_bytes = text.size();
    SendMessage(fds_[rank], h, {}, text.data(), Clock::now() + std::chrono::seconds(2));
  }

  void BroadcastError(const std::string& text) {
    Header h;
    h.op = kError;
    h.payload_bytes = text.size();
    const auto deadline = Clock::now() + std::chrono::seconds(2);
    for (int& fd : fds_) {
      if (fd < 0) continue;
      SendMessage(fd, h, {}, text.data(), deadline);
      ::shutdown(fd, SHUT_WR);
    }
  }

  int listen_fd_;
  int world_size_;
  double timeout_s_;
  std::vector<int> fds_;
  std::vector<bool> said_bye_;
  std::map<P2PKey, std::deque<Sent>> mailbox_;
  std::map<P2PKey, std::deque<Header>> waiting_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

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
    hub_ = std::make_unique<Hub>(fd, options_.world_size, options_.timeout_s);
    hub_->Start();
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
