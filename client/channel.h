// Client channels to a coordinator, shared by the CLI (cli/client.h) and the worker daemon
// (worker/coordinator_client.h): one place that knows how remat connects (TLS or plain, reconnect
// backoff, message size) and how a gRPC status becomes an absl::Status. The client side only:
// it needs gRPC, not the generated services, and the coordinator does not link it.
// Thread-safety: pure functions; a channel is thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace remat::client {

struct ChannelOptions {
  std::string target;            // HOST:PORT
  bool tls = false;              // TLS (system roots unless ca_pem is set)
  std::string ca_pem;            // PEM of the CA that signed the coordinator's certificate
  int initial_backoff_ms = 200;  // gRPC's own reconnect backoff (callers may add their own)
  int max_backoff_ms = 2000;
  int max_receive_bytes = 256 << 20;
};

std::shared_ptr<grpc::Channel> MakeChannel(const ChannelOptions& options);

// The gRPC status as an absl::Status with the same code and message.
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace remat::client
