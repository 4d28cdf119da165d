// The per-user request-rate limit: a burst, then the sustained rate, per user.
#include "server/rate_limiter.h"

#include <gtest/gtest.h>

namespace remat::server {
namespace {

TEST(RateLimiterTest, BurstThenSustainedRatePerUser) {
  int64_t now = 1'000'000;
  RateLimiter limiter({/*per_second=*/2, /*burst=*/3}, [&] { return now; });
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("alice").ok()) << i;
  absl::Status over = limiter.Admit("alice");
  EXPECT_EQ(over.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(over.message(),
            "user alice is over 2 requests/s (burst 3); retry in 0.50 s (rematd --user-rate-limit)");
  // Another user has a bucket of their own; anonymous callers share one.
  EXPECT_TRUE(limiter.Admit("bob").ok());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("").ok());
  EXPECT_EQ(limiter.Admit("").message().rfind("anonymous callers are over 2 requests/s", 0), 0u);
  // Half a second buys alice one more request, not two.
  now += 500;
  EXPECT_TRUE(limiter.Admit("alice").ok());
  EXPECT_FALSE(limiter.Admit("alice").ok());
  // A long pause refills to the burst, no further.
  now += 60'000;
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(limiter.Admit("alice").ok()) << i;
  EXPECT_FALSE(limiter.Admit("alice").ok());
}

TEST(RateLimiterTest, ZeroRateIsNoLimit) {
  RateLimiter limiter({/*per_second=*/0, /*burst=*/1}, [] { return int64_t{0}; });
  EXPECT_FALSE(limiter.enabled());
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(limiter.Admit("alice").ok());
}

}  // namespace
}  // namespace remat::server
