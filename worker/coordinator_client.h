// The worker's side of remat.v1.WorkerService, behind an interface so tests can put a fake
// coordinator (one that drops calls, refuses, or records reports) in front of the daemon.
//
// Every call has a deadline (ConnectionOptions::deadline_s; LeaseTrial adds the long-poll wait).
// Errors come back as absl::Status with gRPC's code (UNAVAILABLE when the coordinator is away,
// UNAUTHENTICATED for a bad token, ...). Thread-safety: all methods may be called concurrently.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "remat/v1/remat.pb.h"

namespace remat::worker {

namespace v1 = ::remat::v1;

struct ConnectionOptions {
  std::string target;      // HOST:PORT of the coordinator
  std::string token;       // worker bearer token, sent as "authorization: Bearer <token>"; "" none
  bool tls = false;        // TLS; tls_ca_pem "" means the system's roots
  std::string tls_ca_pem;  // PEM roots to verify the coordinator with
  double deadline_s = 10;  // per call
};

class CoordinatorClient {
 public:
  virtual ~CoordinatorClient() = default;
  virtual absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) = 0;
  virtual absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) = 0;
  virtual absl::StatusOr<v1::LeaseTrialResponse> LeaseTrial(
      const v1::LeaseTrialRequest& request) = 0;
  virtual absl::StatusOr<v1::ReportTrialResponse> ReportTrial(
      const v1::ReportTrialRequest& request) = 0;
  // Aborts calls in flight and makes later calls fail with CANCELLED (used by Stop).
  virtual void Shutdown() = 0;
};

std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(const ConnectionOptions& options);

}  // namespace remat::worker
