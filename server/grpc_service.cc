#include "server/grpc_service.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "search/text.h"
#include "server/logging.h"

namespace remat::server {
namespace {

constexpr size_t kMaxStatusMessageBytes = 2048;

// The caller, authenticated; for a user, also admitted by `limiter` (may be null): a user over
// their request rate is RESOURCE_EXHAUSTED (rate_limiter.h).
absl::StatusOr<Principal> Authorize(grpc::CallbackServerContext* ctx, const Authenticator* auth,
                                    Role role, RateLimiter* limiter = nullptr) {
  std::string_view token;
  const auto& md = ctx->client_metadata();
  if (auto it = md.find("authorization"); it != md.end()) {
    token = std::string_view(it->second.data(), it->second.size());
  }
  absl::StatusOr<Principal> who = auth->Check(role, token);
  if (who.ok() && role == Role::kUser && limiter != nullptr) {
    if (absl::Status admitted = limiter->Admit(who->name); !admitted.ok()) return admitted;
  }
  return who;
}

using RpcClock = std::chrono::steady_clock;

void Observe(Metrics* metrics, const char* method, RpcClock::time_point start,
             absl::StatusCode code) {
  if (metrics != nullptr) {
    metrics->ObserveRpc(method, code,
                        std::chrono::duration<double>(RpcClock::now() - start).count());
  }
}

// An operator's call on searches (an admin user: auth.h) leaves one line in the log of
// "rematd.audit": who, what, on which search, and how it ended. `target` is the search id, or ""
// for a call on every user's searches (ListSearches).
void Audit(const Principal& who, const char* method, const std::string& target,
           const absl::Status& status) {
  if (!who.admin) return;
  static const std::shared_ptr<spdlog::logger> log = ComponentLogger("audit");
  log->info("admin {} {} {}: {}", who.name, method,
            target.empty() ? std::string("(every user's searches)") : "search " + target,
            status.ok() ? std::string("OK")
                        : absl::StrCat(absl::StatusCodeToString(status.code()), " (",
                                       status.message(), ")"));
}

// Runs `body` (returning absl::StatusOr<Response>) for an authorized caller and finishes the
// call with its answer. Every call is timed under its final code, refusals included. With
// `audit_target` set, an admin's call is audited (Audit).
template <typename Response, typename Body>
grpc::ServerUnaryReactor* Unary(grpc::CallbackServerContext* ctx, const Authenticator* auth,
                                Metrics* metrics, const char* method, Role role,
                                Response* response, Body body, RateLimiter* limiter = nullptr,
                                const std::string* audit_target = nullptr) {
  const auto start = RpcClock::now();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  auto who = Authorize(ctx, auth, role, limiter);
  if (!who.ok()) {
    reactor->Finish(ToGrpcStatus(who.status()));
    Observe(metrics, method, start, who.status().code());
    return reactor;
  }
  absl::StatusOr<Response> result = body(*who);
  if (result.ok()) *response = std::move(*result);
  // Audited before the answer leaves: once a caller has its reply, the line is in the log.
  if (audit_target != nullptr) Audit(*who, method, *audit_target, result.status());
  reactor->Finish(ToGrpcStatus(result.status()));
  Observe(metrics, method, start, result.status().code());
  return reactor;
}

// A long-poll LeaseTrial. The scheduler calls the completion exactly once; a client that goes
// away ends the wait early (CancelLeaseWait).
class LeaseReactor final : public grpc::ServerUnaryReactor {
 public:
  LeaseReactor(Scheduler* scheduler, std::shared_ptr<std::atomic<uint64_t>> wait_id)
      : scheduler_(scheduler), wait_id_(std::move(wait_id)) {}
  void OnCancel() override {
    if (uint64_t id = wait_id_->load(); id != 0) scheduler_->CancelLeaseWait(id);
  }
  void OnDone() override { delete this; }

 private:
  Scheduler* scheduler_;
  std::shared_ptr<std::atomic<uint64_t>> wait_id_;
};

// A watch stream. Updates are pulled from the scheduler one write at a time; the scheduler's
// wake-up reaches the reactor through `Core`, which outlives the reactor, so a late wake-up
// after the stream ended is harmless.
class WatchReactor final : public grpc::ServerWriteReactor<v1::SearchProgress> {
 public:
  struct Core {
    std::mutex mu;
    WatchReactor* reactor = nullptr;  // null once the stream is done
  };

  WatchReactor(Scheduler* scheduler, std::shared_ptr<Core> core, Metrics* metrics)
      : scheduler_(scheduler), core_(std::move(core)), metrics_(metrics) {
    if (metrics_ != nullptr) metrics_->WatchStreams(1);
  }

  // Starts the stream: registers the watcher (or finishes with the error). Returns whether
  // the watch was admitted.
  absl::Status Begin(const Principal& who, const std::string& id) {
    std::weak_ptr<Core> weak = core_;
    auto handle = scheduler_->Watch(who, id, [weak] {
      if (auto core = weak.lock()) {
        std::lock_guard<std::mutex> lock(core->mu);
        if (core->reactor != nullptr) core->reactor->PumpLocked();
      }
    });
    std::lock_guard<std::mutex> lock(core_->mu);
    if (!handle.ok()) {
      FinishLocked(ToGrpcStatus(handle.status()));
      return handle.status();
    }
    handle_ = *handle;
    PumpLocked();
    return absl::OkStatus();
  }

  // A refused stream (authentication, rate limit): finished before it began.
  void Refuse(const absl::Status& status) {
    std::lock_guard<std::mutex> lock(core_->mu);
    FinishLocked(ToGrpcStatus(status));
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(core_->mu);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "stream broken"));
      return;
    }
    if (final_written_) {
      FinishLocked(grpc::Status::OK);
      return;
    }
    PumpLocked();
  }

  void OnCancel() override {
    std::lock_guard<std::mutex> lock(core_->mu);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watcher went away"));
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(core_->mu);
      core_->reactor = nullptr;
    }
    if (handle_ != 0) scheduler_->Unwatch(handle_);
    if (metrics_ != nullptr) metrics_->WatchStreams(-1);
    Observe(metrics_, "WatchSearch", start_, code_);
    delete this;
  }

 private:
  // Writes the next waiting update, if no write is in flight. Called with core_->mu held;
  // gRPC runs reactions on its own threads, never inline from StartWrite/Finish.
  void PumpLocked() {
    if (handle_ == 0 || writing_ || finished_) return;
    switch (scheduler_->PollWatch(handle_, &update_)) {
      case Scheduler::WatchPoll::kNone:
        return;
      case Scheduler::WatchPoll::kFinal:
        final_written_ = true;
        handle_ = 0;  // the scheduler already forgot it
        [[fallthrough]];
      case Scheduler::WatchPoll::kUpdate:
        writing_ = true;
        StartWrite(&update_);
        return;
      case Scheduler::WatchPoll::kClosed:
        handle_ = 0;
        FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"));
        return;
    }
  }

  void FinishLocked(const grpc::Status& status) {
    if (finished_) return;
    finished_ = true;
    code_ = static_cast<absl::StatusCode>(status.error_code());
    Finish(status);
  }

  Scheduler* scheduler_;
  std::shared_ptr<Core> core_;
  Metrics* metrics_;
  const RpcClock::time_point start_ = RpcClock::now();
  absl::StatusCode code_ = absl::StatusCode::kOk;  // what the stream finished with
  uint64_t handle_ = 0;
  v1::SearchProgress update_;
  bool writing_ = false;
  bool final_written_ = false;
  bool finished_ = false;
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl::StatusCode and grpc::StatusCode share the canonical numbering (0..16).
  const int code = static_cast<int>(status.code());
  const auto grpc_code = code >= 0 && code <= 16 ? static_cast<grpc::StatusCode>(code)
                                                 : grpc::StatusCode::UNKNOWN;
  // A status message travels in the reply's trailers, which gRPC bounds (8 KiB by default): an
  // error that quoted too much would turn into RESOURCE_EXHAUSTED. Every message is cut here,
  // whatever made it.
  return grpc::Status(grpc_code,
                      search::BoundedUtf8(std::string(status.message()), kMaxStatusMessageBytes));
}

// ----------------------------------------------------------------------------- RematService

grpc::ServerUnaryReactor* RematServiceImpl::SubmitSearch(grpc::CallbackServerContext* ctx,
                                                         const v1::SubmitSearchRequest* request,
                                                         v1::SubmitSearchResponse* response) {
  return Unary(ctx, auth_, metrics_, "SubmitSearch", Role::kUser, response,
               [&](const Principal& who) { return scheduler_->SubmitSearch(who, *request); },
               limiter_);
}

grpc::ServerUnaryReactor* RematServiceImpl::GetSearch(grpc::CallbackServerContext* ctx,
                                                      const v1::GetSearchRequest* request,
                                                      v1::Search* response) {
  return Unary(ctx, auth_, metrics_, "GetSearch", Role::kUser, response,
               [&](const Principal& who) { return scheduler_->GetSearch(who, request->id()); },
               limiter_, &request->id());
}

grpc::ServerWriteReactor<v1::SearchProgress>* RematServiceImpl::WatchSearch(
    grpc::CallbackServerContext* ctx, const v1::WatchSearchRequest* request) {
  auto core = std::make_shared<WatchReactor::Core>();
  auto* reactor = new WatchReactor(scheduler_, core, metrics_);
  core->reactor = reactor;
  auto who = Authorize(ctx, auth_, Role::kUser, limiter_);
  if (!who.ok()) {
    reactor->Refuse(who.status());
    return reactor;
  }
  // A copy: once Begin has written a final update the call may end, and `request` with it.
  const std::string id = request->id();
  const absl::Status begun = reactor->Begin(*who, id);
  Audit(*who, "WatchSearch", id, begun);
  return reactor;
}

grpc::ServerUnaryReactor* RematServiceImpl::CancelSearch(grpc::CallbackServerContext* ctx,
                                                         const v1::CancelSearchRequest* request,
                                                         v1::CancelSearchResponse* response) {
  return Unary(ctx, auth_, metrics_, "CancelSearch", Role::kUser, response, [&](const Principal& who) {
    return scheduler_->CancelSearch(who, request->id());
  }, limiter_, &request->id());
}

grpc::ServerUnaryReactor* RematServiceImpl::ListSearches(grpc::CallbackServerContext* ctx,
                                                         const v1::ListSearchesRequest* request,
                                                         v1::ListSearchesResponse* response) {
  static const std::string kEveryUser;
  return Unary(ctx, auth_, metrics_, "ListSearches", Role::kUser, response, [&](const Principal& who) {
    return scheduler_->ListSearches(who, request->limit());
  }, limiter_, &kEveryUser);
}

// ----------------------------------------------------------------------------- WorkerService

grpc::ServerUnaryReactor* WorkerServiceImpl::Register(grpc::CallbackServerContext* ctx,
                                                      const v1::RegisterRequest* request,
                                                      v1::RegisterResponse* response) {
  return Unary(ctx, auth_, metrics_, "Register", Role::kWorker, response,
               [&](const Principal& who) {
                 return scheduler_->Register(*request, who.credential);
               });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::Heartbeat(grpc::CallbackServerContext* ctx,
                                                       const v1::HeartbeatRequest* request,
                                                       v1::HeartbeatResponse* response) {
  return Unary(ctx, auth_, metrics_, "Heartbeat", Role::kWorker, response,
               [&](const Principal& who) {
                 return scheduler_->Heartbeat(*request, who.credential);
               });
}

grpc::ServerUnaryReactor* WorkerServiceImpl::LeaseTrial(grpc::CallbackServerContext* ctx,
                                                        const v1::LeaseTrialRequest* request,
                                                        v1::LeaseTrialResponse* response) {
  const auto start = RpcClock::now();
  auto who = Authorize(ctx, auth_, Role::kWorker);
  if (!who.ok()) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(ToGrpcStatus(who.status()));
    Observe(metrics_, "LeaseTrial", start, who.status().code());
    return reactor;
  }
  auto wait_id = std::make_shared<std::atomic<uint64_t>>(0);
  auto* reactor = new LeaseReactor(scheduler_, wait_id);
  const uint64_t id = scheduler_->LeaseTrial(
      *request, [reactor, response, start, metrics = metrics_](
                    absl::StatusOr<v1::LeaseTrialResponse> result) {
        if (result.ok()) *response = std::move(*result);
        reactor->Finish(ToGrpcStatus(result.status()));
        Observe(metrics, "LeaseTrial", start, result.status().code());
      },
      who->credential);
  wait_id->store(id);
  return reactor;
}

grpc::ServerUnaryReactor* WorkerServiceImpl::ReportTrial(grpc::CallbackServerContext* ctx,
                                                         const v1::ReportTrialRequest* request,
                                                         v1::ReportTrialResponse* response) {
  return Unary(ctx, auth_, metrics_, "ReportTrial", Role::kWorker, response,
               [&](const Principal& who) {
                 return scheduler_->ReportTrial(*request, who.credential);
               });
}

}  // namespace remat::server
