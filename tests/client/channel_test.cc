// The client channel factory and status conversion (client/channel.h).
#include "client/channel.h"

#include <gtest/gtest.h>

namespace remat::client {
namespace {

TEST(Channel, GrpcStatusesKeepTheirCodeAndMessage) {
  EXPECT_TRUE(FromGrpc(grpc::Status::OK).ok());
  absl::Status s = FromGrpc(grpc::Status(grpc::StatusCode::NOT_FOUND, "search s-9: not found"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "search s-9: not found");
  s = FromGrpc(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "bad token"));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
}

TEST(Channel, MakesPlainAndTlsChannelsWithoutConnecting) {
  ChannelOptions options;
  options.target = "127.0.0.1:1";  // nothing listens: a channel is lazy, it connects on use
  auto plain = MakeChannel(options);
  ASSERT_NE(plain, nullptr);
  EXPECT_EQ(plain->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_IDLE);
  options.tls = true;
  auto tls = MakeChannel(options);
  ASSERT_NE(tls, nullptr);
  EXPECT_EQ(tls->GetState(/*try_to_connect=*/false), GRPC_CHANNEL_IDLE);
}

}  // namespace
}  // namespace remat::client
