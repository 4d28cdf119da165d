#include "cli/client.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "client/channel.h"
#include "common/munge.h"
#include "remat/v1/remat.grpc.pb.h"

namespace remat::cli {
namespace {

using client::FromGrpc;

class GrpcRematClient : public RematClient {
 public:
  explicit GrpcRematClient(const ClientOptions& options) : options_(options) {
    client::ChannelOptions channel;
    channel.target = options.coordinator;
    channel.tls = options.tls;
    channel.ca_pem = options.tls_ca_pem;
    stub_ = v1::RematService::NewStub(client::MakeChannel(channel));
  }

  absl::StatusOr<std::string> Submit(const v1::SubmitSearchRequest& request) override {
    auto response = Unary<v1::SubmitSearchResponse>(
        [&](grpc::ClientContext* c, v1::SubmitSearchResponse* r) {
          return stub_->SubmitSearch(c, request, r);
        });
    if (!response.ok()) return response.status();
    return response->id();
  }

  absl::StatusOr<v1::Search> Get(const std::string& id) override {
    v1::GetSearchRequest request;
    request.set_id(id);
    return Unary<v1::Search>([&](grpc::ClientContext* c, v1::Search* r) {
      return stub_->GetSearch(c, request, r);
    });
  }

  absl::StatusOr<v1::SearchState> Cancel(const std::string& id) override {
    v1::CancelSearchRequest request;
    request.set_id(id);
    auto response = Unary<v1::CancelSearchResponse>(
        [&](grpc::ClientContext* c, v1::CancelSearchResponse* r) {
          return stub_->CancelSearch(c, request, r);
        });
    if (!response.ok()) return response.status();
    return response->state();
  }

  absl::StatusOr<v1::ListSearchesResponse> List(int limit) override {
    v1::ListSearchesRequest request;
    request.set_limit(limit);
    return Unary<v1::ListSearchesResponse>(
        [&](grpc::ClientContext* c, v1::ListSearchesResponse* r) {
          return stub_->ListSearches(c, request, r);
        });
  }

  absl::Status Watch(const std::string& id,
                     const std::function<void(const v1::SearchProgress&)>& on_update,
                     const std::function<bool()>& stop) override {
    // A broken stream (coordinator restarting) is re-opened; the coordinator resumes searches,
    // so the watcher simply picks up the current progress. Give up after a quiet minute.
    auto last_ok = std::chrono::steady_clock::now();
    double backoff_s = 0.2;
    while (true) {
      grpc::ClientContext context;
      if (absl::Status prepared = Prepare(&context, /*deadline=*/false); !prepared.ok()) {
        return prepared;
      }
      v1::WatchSearchRequest request;
      request.set_id(id);
      std::unique_ptr<grpc::ClientReader<v1::SearchProgress>> reader =
          stub_->WatchSearch(&context, request);
      std::atomic<bool> done{false};
      std::thread stopper;
      if (stop) {
        stopper = std::thread([&] {
          while (!done.load()) {
            if (stop()) {
              context.TryCancel();
              return;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
          }
        });
      }
      v1::SearchProgress progress;
      bool final_seen = false;
      while (reader->Read(&progress)) {
        last_ok = std::chrono::steady_clock::now();
        backoff_s = 0.2;
        on_update(progress);
        if (IsFinal(progress.state())) {
          final_seen = true;
          context.TryCancel();
          break;
        }
      }
      grpc::Status s = reader->Finish();
      done = true;
      if (stopper.joinable()) stopper.join();
      if (final_seen) return absl::OkStatus();
      if (stop && stop()) return absl::CancelledError("watch stopped");
      absl::Status status = FromGrpc(s);
      if (s.ok()) status = absl::UnavailableError("the watch stream ended early");
      const bool retryable = status.code() == absl::StatusCode::kUnavailable ||
                             status.code() == absl::StatusCode::kCancelled ||
                             status.code() == absl::StatusCode::kAborted ||
                             status.code() == absl::StatusCode::kInternal;
      const double quiet_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - last_ok).count();
      if (!retryable || quiet_s > std::max(60.0, options_.timeout_s)) return status;
      std::this_thread::sleep_for(std::chrono::duration<double>(backoff_s));
      backoff_s = std::min(backoff_s * 2, 5.0);
    }
  }

 private:
  // One unary call `call(context, &response)` with the token and the per-call deadline: the
  // response, or the call's status.
  template <typename Response, typename Call>
  absl::StatusOr<Response> Unary(const Call& call) {
    grpc::ClientContext context;
    if (absl::Status prepared = Prepare(&context, /*deadline=*/true); !prepared.ok()) {
      return prepared;
    }
    Response response;
    grpc::Status s = call(&context, &response);
    if (!s.ok()) return FromGrpc(s);
    return response;
  }

  // The deadline and the caller's credentials; FailedPrecondition when no MUNGE credential can
  // be made (a credential decodes once, so each call gets its own).
  absl::Status Prepare(grpc::ClientContext* context, bool deadline) {
    if (deadline) {
      context->set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::milliseconds(static_cast<int64_t>(options_.timeout_s * 1000)));
    }
    if (options_.munge) {
      common::MungeOptions munge;
      munge.socket = options_.munge_socket;
      std::string error;
      const std::string credential = common::MungeEncode(munge, &error);
      if (credential.empty()) {
        return absl::FailedPreconditionError("--munge: no credential: " + error);
      }
      context->AddMetadata("authorization", "Munge " + credential);
    } else if (!options_.token.empty()) {
      context->AddMetadata("authorization", "Bearer " + options_.token);
    }
    return absl::OkStatus();
  }

  ClientOptions options_;
  std::unique_ptr<v1::RematService::Stub> stub_;
};

}  // namespace

std::unique_ptr<RematClient> RematClient::Connect(const ClientOptions& options) {
  return std::make_unique<GrpcRematClient>(options);
}

bool IsFinal(v1::SearchState state) {
  return state == v1::SEARCH_STATE_SUCCEEDED || state == v1::SEARCH_STATE_FAILED ||
         state == v1::SEARCH_STATE_CANCELLED;
}

std::string DescribeError(const absl::Status& status, const ClientOptions& options) {
  const std::string msg(status.message());
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      return "cannot reach coordinator at " + options.coordinator + ": " + msg;
    case absl::StatusCode::kDeadlineExceeded:
      return "cannot reach coordinator at " + options.coordinator + ": no answer within " +
             std::to_string(static_cast<int>(options.timeout_s)) + " s (--timeout)";
    case absl::StatusCode::kUnauthenticated:
      return "coordinator at " + options.coordinator +
             " refused the request: unauthenticated: " + msg +
             " (give a user token with --token-file or REMAT_TOKEN)";
    case absl::StatusCode::kPermissionDenied:
      return "coordinator at " + options.coordinator +
             " refused the request: permission denied: " + msg;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
    case absl::StatusCode::kFailedPrecondition:
      return msg;
    default:
      return "coordinator at " + options.coordinator + ": " + status.ToString();
  }
}

int ExitCode(const absl::Status& status) {
  if (status.ok()) return 0;
  return status.code() == absl::StatusCode::kInvalidArgument ||
                 status.code() == absl::StatusCode::kNotFound
             ? 2
             : 1;
}

}  // namespace remat::cli
