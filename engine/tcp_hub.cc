#include "engine/tcp_hub.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/tcp_wire.h"

namespace remat::engine::tcp {
namespace {

class HubThread final : public Hub {
 public:
  HubThread(int listen_fd, int world_size, double timeout_s)
      : listen_fd_(listen_fd),
        world_size_(world_size),
        timeout_s_(timeout_s),
        fds_(world_size, -1),
        said_bye_(world_size, false) {}
  ~HubThread() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
    ::close(listen_fd_);
  }

  void Start() {
    thread_ = std::thread([this] { Run(); });
  }
  // Asks the hub to finish once every rank has said goodbye (or after the grace period).
  void RequestStop() override { stop_ = true; }
  void Join() override {
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
        BroadcastError("rendezvous timed out after " +
                       std::to_string(static_cast<int>(timeout_s_)) + " s: rank(s) " + missing +
                       " did not join");
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

}  // namespace

std::unique_ptr<Hub> StartHub(int listen_fd, int world_size, double timeout_s) {
  auto hub = std::make_unique<HubThread>(listen_fd, world_size, timeout_s);
  hub->Start();
  return hub;
}

}  // namespace remat::engine::tcp
