#include "worker/coordinator_client.h"

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <mutex>
#include <set>

#include "client/channel.h"
#include "remat/v1/remat.grpc.pb.h"

namespace remat::worker {
namespace {

using client::FromGrpc;

class GrpcCoordinatorClient : public CoordinatorClient {
 public:
  explicit GrpcCoordinatorClient(const ConnectionOptions& options) : options_(options) {
    client::ChannelOptions channel;
    channel.target = options.target;
    channel.tls = options.tls;
    channel.ca_pem = options.tls_ca_pem;
    // Reconnect quickly when the coordinator comes back (the daemon does its own backoff).
    channel.initial_backoff_ms = 100;
    channel.max_receive_bytes = 64 << 20;
    channel_ = client::MakeChannel(channel);
    stub_ = v1::WorkerService::NewStub(channel_);
  }

  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override {
    return Call<v1::RegisterResponse>(0, [&](grpc::ClientContext* c, v1::RegisterResponse* r) {
      return stub_->Register(c, request, r);
    });
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request) override {
    return Call<v1::HeartbeatResponse>(0, [&](grpc::ClientContext* c, v1::HeartbeatResponse* r) {
      return stub_->Heartbeat(c, request, r);
    });
  }
  absl::StatusOr<v1::LeaseTrialResponse> LeaseTrial(const v1::LeaseTrialRequest& request) override {
    return Call<v1::LeaseTrialResponse>(request.wait_s(),
                                        [&](grpc::ClientContext* c, v1::LeaseTrialResponse* r) {
                                          return stub_->LeaseTrial(c, request, r);
                                        });
  }
  absl::StatusOr<v1::ReportTrialResponse> ReportTrial(
      const v1::ReportTrialRequest& request) override {
    return Call<v1::ReportTrialResponse>(0,
                                         [&](grpc::ClientContext* c, v1::ReportTrialResponse* r) {
                                           return stub_->ReportTrial(c, request, r);
                                         });
  }

  void Shutdown() override {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_ = true;
    for (grpc::ClientContext* c : in_flight_) c->TryCancel();
  }

 private:
  template <typename Response, typename F>
  absl::StatusOr<Response> Call(double extra_wait_s, F f) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::milliseconds(static_cast<int64_t>(
                             (options_.deadline_s + std::max(0.0, extra_wait_s)) * 1000)));
    if (!options_.token.empty()) context.AddMetadata("authorization", "Bearer " + options_.token);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutdown_) return absl::CancelledError("worker is stopping");
      in_flight_.insert(&context);
    }
    Response response;
    grpc::Status status = f(&context, &response);
    {
      std::lock_guard<std::mutex> lock(mu_);
      in_flight_.erase(&context);
    }
    if (!status.ok()) return FromGrpc(status);
    return response;
  }

  ConnectionOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  std::mutex mu_;
  bool shutdown_ = false;
  std::set<grpc::ClientContext*> in_flight_;
};

}  // namespace

std::unique_ptr<CoordinatorClient> MakeGrpcCoordinatorClient(const ConnectionOptions& options) {
  return std::make_unique<GrpcCoordinatorClient>(options);
}

}  // namespace remat::worker
