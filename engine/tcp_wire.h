// The TCP collectives' wire format and socket I/O, shared by the hub (engine/tcp_hub.h) and each
// rank's client (engine/tcp_collectives.cc). Internal to remat_engine_collectives.
//
// A message is a fixed-size Header, then header.num_members uint32 ranks, then
// header.payload_bytes of payload. Integers are in host byte order: both ends are on this host.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/collectives.h"

namespace remat::engine::tcp {

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
  kSend = 10,      // point-to-point: members = {destination}, reduce = tag, payload = the data
  kRecv = 11,      // members = {source}, reduce = tag, seq = expected bytes; answered with the data
  kSendDone = 12,  // to a sender that asked (pad = 1): its send was received (sender = receiver)
};

// What a request is, for error messages ("all-reduce", "send", ...).
const char* OpName(uint32_t op);

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

struct Message {
  Header header;
  std::vector<uint32_t> members;
  std::vector<char> payload;
};

// Seconds until `deadline` (negative once it has passed).
double SecondsLeft(Clock::time_point deadline);

// Reads or writes exactly n bytes before the deadline. Returns "" or what went wrong ("timeout",
// "connection closed", the system call's error).
std::string ReadFull(int fd, void* buf, size_t n, Clock::time_point deadline);
std::string WriteFull(int fd, const void* buf, size_t n, Clock::time_point deadline);

// One message (h.num_members is set from `members`). Returns "" or what went wrong.
std::string SendMessage(int fd, Header h, const std::vector<uint32_t>& members, const void* payload,
                        Clock::time_point deadline);
// One message, checked (magic, member count). Returns "" or what went wrong.
std::string ReceiveMessage(int fd, Message* m, Clock::time_point deadline);

// acc[i] = op(acc[i], in[i]) for `count` elements of type t; bf16 is combined in fp32 and rounded
// to nearest even, as c10::BFloat16 does. The hub copies the first member's buffer into acc first.
void Accumulate(DataType t, ReduceOp op, char* acc, const char* in, size_t count);

}  // namespace remat::engine::tcp
