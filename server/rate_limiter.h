// RateLimiter: a token bucket per user, so one user's client cannot take the coordinator's
// request capacity from the others. Each user may make `burst` requests at once and
// `per_second` on average after that; a request over it is refused with RESOURCE_EXHAUSTED and a
// one-line reason saying when to retry. The RPC layer (grpc_service.h) asks it for every
// RematService call of an authenticated user, after authentication, so the number of buckets is
// bounded by the users in the token file (all anonymous callers share one bucket, as they share
// one quota). Workers are not limited here: a pool often shares one worker token, and their calls
// are paced by the protocol (heartbeat interval, long polls).
//
// Thread-safety: Admit may be called from any thread (one mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "absl/status/status.h"

namespace remat::server {

struct RateLimitOptions {
  double per_second = 20;  // sustained requests per second per user; 0: no limit
  double burst = 100;      // requests a user may make at once (the bucket's size), >= 1
};

class RateLimiter {
 public:
  // `clock_ms`: monotonic milliseconds (unset: the steady clock).
  explicit RateLimiter(RateLimitOptions options, std::function<int64_t()> clock_ms = nullptr);

  // OK, taking one request from `user`'s bucket; or RESOURCE_EXHAUSTED naming the user, the
  // limit and when the next request would be admitted.
  absl::Status Admit(const std::string& user);

  bool enabled() const { return options_.per_second > 0; }

 private:
  struct Bucket {
    double tokens = 0;
    int64_t updated_ms = 0;
  };

  RateLimitOptions options_;
  std::function<int64_t()> clock_ms_;
  std::mutex mu_;
  std::unordered_map<std::string, Bucket> buckets_;
};

}  // namespace remat::server
