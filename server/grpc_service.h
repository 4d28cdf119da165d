// The RPC layer: RematService and WorkerService on gRPC's callback API, wrapping Scheduler
// method for method. It authenticates each call (auth.h), maps absl::Status to grpc::Status
// (ToGrpcStatus, the one place that does), and serves long-poll leases and watch streams
// without a thread per waiting call. Internal to server/ (gRPC types are fine here).
// Thread-safety: the services are called by gRPC from its threads; they hold no state of their
// own beyond pointers to the (thread-safe) Scheduler and Authenticator.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "remat/v1/remat.grpc.pb.h"
#include "server/auth.h"
#include "server/metrics.h"
#include "server/rate_limiter.h"
#include "server/scheduler.h"

namespace remat::server {

// absl::Status -> grpc::Status, code for code (both use the canonical codes).
grpc::Status ToGrpcStatus(const absl::Status& status);

class RematServiceImpl final : public v1::RematService::CallbackService {
 public:
  // `metrics` and `limiter` may be null (no metrics, no rate limit). Every call of an
  // authenticated user is first admitted by `limiter` (RESOURCE_EXHAUSTED over the user's rate).
  RematServiceImpl(Scheduler* scheduler, const Authenticator* auth, Metrics* metrics,
                   RateLimiter* limiter = nullptr)
      : scheduler_(scheduler), auth_(auth), metrics_(metrics), limiter_(limiter) {}

  grpc::ServerUnaryReactor* SubmitSearch(grpc::CallbackServerContext* ctx,
                                         const v1::SubmitSearchRequest* request,
                                         v1::SubmitSearchResponse* response) override;
  grpc::ServerUnaryReactor* GetSearch(grpc::CallbackServerContext* ctx,
                                      const v1::GetSearchRequest* request,
                                      v1::Search* response) override;
  grpc::ServerWriteReactor<v1::SearchProgress>* WatchSearch(
      grpc::CallbackServerContext* ctx, const v1::WatchSearchRequest* request) override;
  grpc::ServerUnaryReactor* CancelSearch(grpc::CallbackServerContext* ctx,
                                         const v1::CancelSearchRequest* request,
                                         v1::CancelSearchResponse* response) override;
  grpc::ServerUnaryReactor* ListSearches(grpc::CallbackServerContext* ctx,
                                         const v1::ListSearchesRequest* request,
                                         v1::ListSearchesResponse* response) override;

 private:
  Scheduler* scheduler_;
  const Authenticator* auth_;
  Metrics* metrics_;
  RateLimiter* limiter_;
};

class WorkerServiceImpl final : public v1::WorkerService::CallbackService {
 public:
  WorkerServiceImpl(Scheduler* scheduler, const Authenticator* auth, Metrics* metrics)
      : scheduler_(scheduler), auth_(auth), metrics_(metrics) {}

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* ctx,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* LeaseTrial(grpc::CallbackServerContext* ctx,
                                       const v1::LeaseTrialRequest* request,
                                       v1::LeaseTrialResponse* response) override;
  grpc::ServerUnaryReactor* ReportTrial(grpc::CallbackServerContext* ctx,
                                        const v1::ReportTrialRequest* request,
                                        v1::ReportTrialResponse* response) override;

 private:
  Scheduler* scheduler_;
  const Authenticator* auth_;
  Metrics* metrics_;
};

}  // namespace remat::server
