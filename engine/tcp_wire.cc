#include "engine/tcp_wire.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

namespace remat::engine::tcp {

const char* OpName(uint32_t op) {
  switch (op) {
    case kAllReduce:
      return "all-reduce";
    case kAllGather:
      return "all-gather";
    case kReduceScatter:
      return "reduce-scatter";
    case kBarrier:
      return "barrier";
    case kAllToAll:
      return "all-to-all";
    case kSend:
      return "send";
    case kRecv:
      return "receive";
    default:
      return "collective";
  }
}

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

namespace {

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

}  // namespace

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

}  // namespace remat::engine::tcp
