#include "server/rate_limiter.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace remat::server {

RateLimiter::RateLimiter(RateLimitOptions options, std::function<int64_t()> clock_ms)
    : options_(options), clock_ms_(std::move(clock_ms)) {
  if (!clock_ms_) {
    clock_ms_ = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
  options_.burst = std::max(1.0, options_.burst);
}

absl::Status RateLimiter::Admit(const std::string& user) {
  if (!enabled()) return absl::OkStatus();
  const int64_t now = clock_ms_();
  std::lock_guard<std::mutex> lock(mu_);
  auto [it, fresh] = buckets_.try_emplace(user);
  Bucket& b = it->second;
  if (fresh) {
    b.tokens = options_.burst;  // a new user starts with a full bucket
  } else {
    const double elapsed_s = std::max<int64_t>(0, now - b.updated_ms) / 1000.0;
    b.tokens = std::min(options_.burst, b.tokens + elapsed_s * options_.per_second);
  }
  b.updated_ms = now;
  if (b.tokens >= 1) {
    b.tokens -= 1;
    return absl::OkStatus();
  }
  const double retry_s = (1 - b.tokens) / options_.per_second;
  return absl::ResourceExhaustedError(absl::StrCat(
      user.empty() ? "anonymous callers are" : "user " + user + " is", " over ",
      absl::StrFormat("%g requests/s (burst %g)", options_.per_second, options_.burst),
      "; retry in ", absl::StrFormat("%.2f s", retry_s), " (rematd --user-rate-limit)"));
}

}  // namespace remat::server
