#include "server/coordinator.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/exposer.h>
#include <prometheus/registry.h>

#include <unistd.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/main_util.h"
#include "common/read_file.h"
#include "search/limits.h"
#include "server/auth.h"
#include "server/grpc_service.h"
#include "server/job_store.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/scheduler.h"
#include "server/status_util.h"

namespace remat::server {
namespace {

constexpr int kMaxMessageBytes = search::limits::kMaxGrpcMessageBytes;

absl::Status CheckHostPort(const std::string& flag, const std::string& value) {
  const std::string problem = common::HostPortProblem(flag, value);
  return problem.empty() ? absl::OkStatus() : absl::InvalidArgumentError(problem);
}

absl::StatusOr<std::string> ReadFile(const std::string& flag, const std::string& path) {
  auto text = common::ReadFile(path);
  if (!text) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  return *text;
}

}  // namespace

class Coordinator::Impl {
 public:
  explicit Impl(CoordinatorOptions options) : options_(std::move(options)) {}

  CoordinatorOptions options_;
  std::shared_ptr<spdlog::logger> log_ = ComponentLogger("coordinator");
  Authenticator auth_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<Metrics> metrics_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<RateLimiter> limiter_;  // before the service that uses it
  std::unique_ptr<RematServiceImpl> remat_service_;
  std::unique_ptr<WorkerServiceImpl> worker_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_server_;  // plaintext, health service only
  int port_ = 0;
  int health_port_ = 0;
  int metrics_port_ = 0;

  std::thread timer_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool stopping_ = false;
  bool stopped_ = false;

  void TimerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stopping_) {
      const int64_t wait_ms = std::max<int64_t>(1, scheduler_->MsUntilNextTick());
      cv_.wait_for(lock, std::chrono::milliseconds(wait_ms), [this] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      scheduler_->Tick();
      lock.lock();
    }
  }
};

Coordinator::Coordinator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Coordinator::~Coordinator() { Shutdown(std::chrono::milliseconds(0)); }

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(CoordinatorOptions options) {
  REMAT_RETURN_IF_ERROR(CheckHostPort("listen", options.listen));
  if (!options.metrics_listen.empty()) {
    REMAT_RETURN_IF_ERROR(CheckHostPort("metrics-listen", options.metrics_listen));
  }
  if (!options.health_listen.empty()) {
    REMAT_RETURN_IF_ERROR(CheckHostPort("health-listen", options.health_listen));
  }
  if (options.db_path.empty()) return absl::InvalidArgumentError("db: a database path is required");
  if (!(options.heartbeat_interval_s > 0)) {
    return absl::InvalidArgumentError("heartbeat-interval: must be > 0 seconds");
  }
  if (!(options.lease_timeout_s > options.heartbeat_interval_s)) {
    return absl::InvalidArgumentError(
        "lease-timeout: must be longer than the heartbeat interval");
  }
  if (options.max_trial_attempts < 1) {
    return absl::InvalidArgumentError("max-attempts: must be at least 1");
  }
  if (options.max_searches_per_user < 0 || options.max_trials_per_user < 0) {
    return absl::InvalidArgumentError(
        "max-searches-per-user/max-trials-per-user: must be 0 (no limit) or more");
  }
  if (!(options.user_rate_limit >= 0)) {
    return absl::InvalidArgumentError("user-rate-limit: must be 0 (no limit) or more");
  }
  if (!(options.user_rate_burst >= 1)) {
    return absl::InvalidArgumentError("user-rate-burst: must be at least 1");
  }
  if (!(options.unserved_search_timeout_s >= 0)) {
    return absl::InvalidArgumentError("unserved-search-timeout: must be 0 (wait for ever) or more");
  }
  if (options.tls_cert_file.empty() != options.tls_key_file.empty()) {
    return absl::InvalidArgumentError("tls-cert/tls-key: give both or neither");
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  REMAT_ASSIGN_OR_RETURN(impl->auth_, Authenticator::Load(impl->options_.user_tokens_file,
                                                          impl->options_.worker_tokens_file));
  if (!impl->options_.munge_socket.empty()) {
    if (access(impl->options_.munge_socket.c_str(), F_OK) != 0) {
      return absl::InvalidArgumentError("munge-socket: " + impl->options_.munge_socket +
                                        " does not exist (is munged running?)");
    }
    common::MungeOptions munge;
    munge.socket = impl->options_.munge_socket;
    impl->auth_.SetMunge(munge);
  }
  REMAT_ASSIGN_OR_RETURN(impl->store_, OpenSqliteStore(impl->options_.db_path));
  impl->metrics_ = std::make_unique<Metrics>(impl->options_.version);
  return std::unique_ptr<Coordinator>(new Coordinator(std::move(impl)));
}

absl::Status Coordinator::Start() {
  Impl& im = *impl_;
  const CoordinatorOptions& o = im.options_;
  if (im.started_) return absl::FailedPreconditionError("coordinator already started");
  im.started_ = true;

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!o.tls_cert_file.empty()) {
    REMAT_ASSIGN_OR_RETURN(std::string cert, ReadFile("tls-cert", o.tls_cert_file));
    REMAT_ASSIGN_OR_RETURN(std::string key, ReadFile("tls-key", o.tls_key_file));
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({key, cert});
    creds = grpc::SslServerCredentials(ssl);
  }

  if (!o.metrics_listen.empty()) {
    try {
      im.exposer_ = std::make_unique<prometheus::Exposer>(o.metrics_listen, 2);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("metrics-listen: cannot listen on ", o.metrics_listen, ": ", e.what()));
    }
    im.exposer_->RegisterCollectable(im.metrics_->collectable());
    auto ports = im.exposer_->GetListeningPorts();
    im.metrics_port_ = ports.empty() ? 0 : ports.front();
  }

  SchedulerOptions so;
  so.heartbeat_interval_s = o.heartbeat_interval_s;
  so.lease_timeout_s = o.lease_timeout_s;
  so.max_trial_attempts = o.max_trial_attempts;
  so.max_lease_wait_s = o.max_lease_wait_s;
  so.max_searches_per_user = o.max_searches_per_user;
  so.max_trials_per_user = o.max_trials_per_user;
  so.unserved_search_timeout_s = o.unserved_search_timeout_s;
  so.max_frontier_series = o.max_frontier_series;
  if (o.clock_ms) {
    so.monotonic_ms = o.clock_ms;
    so.unix_ms = o.clock_ms;
  }
  // Listening comes first, resuming after (every call answers UNAVAILABLE until it is done, and
  // the health service says NOT_SERVING): re-planning the searches of a large queue must not
  // keep the port closed.
  im.scheduler_ = std::make_unique<Scheduler>(so, im.store_.get(), im.metrics_.get());

  im.limiter_ = std::make_unique<RateLimiter>(
      RateLimitOptions{o.user_rate_limit, o.user_rate_burst}, o.clock_ms);
  im.remat_service_ = std::make_unique<RematServiceImpl>(im.scheduler_.get(), &im.auth_,
                                                         im.metrics_.get(), im.limiter_.get());
  im.worker_service_ =
      std::make_unique<WorkerServiceImpl>(im.scheduler_.get(), &im.auth_, im.metrics_.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, creds, &im.port_);
  builder.RegisterService(im.remat_service_.get());
  builder.RegisterService(im.worker_service_.get());
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // Workers and watchers may ping every 10 s to keep idle connections through NATs alive.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Without this, a second rematd on the same port would silently share it (SO_REUSEPORT).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  im.server_ = builder.BuildAndStart();
  if (im.server_ == nullptr || im.port_ == 0) {
    im.server_.reset();
    return absl::UnavailableError(absl::StrCat("listen: cannot listen on ", o.listen,
                                               " (address in use or not available?)"));
  }
  im.server_->GetHealthCheckService()->SetServingStatus(false);
  if (!o.health_listen.empty()) {
    // Built after the main server: EnableDefaultHealthCheckService above gives it the standard
    // health service, and it registers nothing else.
    grpc::ServerBuilder health;
    health.AddListeningPort(o.health_listen, grpc::InsecureServerCredentials(), &im.health_port_);
    health.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    im.health_server_ = health.BuildAndStart();
    if (im.health_server_ == nullptr || im.health_port_ == 0) {
      im.health_server_.reset();
      im.server_->Shutdown();
      im.server_.reset();
      return absl::UnavailableError(absl::StrCat("health-listen: cannot listen on ",
                                                 o.health_listen,
                                                 " (address in use or not available?)"));
    }
    im.health_server_->GetHealthCheckService()->SetServingStatus(false);
  }
  if (o.on_listening) o.on_listening(address());
  const auto resume_start = std::chrono::steady_clock::now();
  if (absl::Status resumed = im.scheduler_->Resume(); !resumed.ok()) {
    if (im.health_server_) im.health_server_->Shutdown();
    im.server_->Shutdown();
    im.health_server_.reset();
    im.server_.reset();
    return resumed;
  }
  im.log_->info(
      "resumed the unfinished searches in {:.2f} s",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - resume_start).count());
  im.server_->GetHealthCheckService()->SetServingStatus(true);
  if (im.health_server_) im.health_server_->GetHealthCheckService()->SetServingStatus(true);
  if (!o.clock_ms) im.timer_ = std::thread([&im] { im.TimerLoop(); });
  // The address as bound (0.0.0.0 stays 0.0.0.0 here; address() is what a local client dials).
  const std::string host = o.listen.substr(0, o.listen.rfind(':'));
  im.log_->info("listening on {}:{} (gRPC{}{}{}), database {}, metrics {}", host, im.port_,
                o.tls_cert_file.empty() ? "" : ", TLS",
                im.auth_.users_enabled()
                    ? (im.auth_.munge_enabled() ? ", user tokens or MUNGE" : ", user tokens")
                    : "",
                im.auth_.workers_enabled() ? ", worker tokens" : "", o.db_path,
                im.metrics_port_ ? absl::StrCat("on port ", im.metrics_port_) : "off");
  if (im.health_port_) im.log_->info("plaintext health service on port {}", im.health_port_);
  return absl::OkStatus();
}

int Coordinator::port() const { return impl_->port_; }

std::string Coordinator::address() const {
  const std::string& listen = impl_->options_.listen;
  std::string host = listen.substr(0, listen.rfind(':'));
  if (host == "0.0.0.0" || host == "[::]" || host == "*" || host.empty()) host = "127.0.0.1";
  return absl::StrCat(host, ":", impl_->port_);
}

int Coordinator::metrics_port() const { return impl_->metrics_port_; }

int Coordinator::health_port() const { return impl_->health_port_; }

void Coordinator::Shutdown(std::chrono::milliseconds drain) {
  Impl& im = *impl_;
  {
    std::lock_guard<std::mutex> lock(im.mu_);
    if (im.stopping_) return;
    im.stopping_ = true;
  }
  im.cv_.notify_all();
  if (im.server_ != nullptr) {
    im.log_->info("shutting down: draining calls for up to {} ms", drain.count());
    im.server_->GetHealthCheckService()->SetServingStatus(false);
  }
  if (im.health_server_ != nullptr) {
    im.health_server_->GetHealthCheckService()->SetServingStatus(false);
  }
  // Long polls answer empty and watch streams end, so the drain is not held up by them.
  if (im.scheduler_ != nullptr) im.scheduler_->Shutdown();
  if (im.server_ != nullptr) {
    im.server_->Shutdown(std::chrono::system_clock::now() + drain);
    im.server_->Wait();
  }
  if (im.health_server_ != nullptr) {
    im.health_server_->Shutdown(std::chrono::system_clock::now());
    im.health_server_->Wait();
  }
  if (im.timer_.joinable()) im.timer_.join();
  im.exposer_.reset();
  {
    std::lock_guard<std::mutex> lock(im.mu_);
    im.stopped_ = true;
  }
  im.cv_.notify_all();
  if (im.server_ != nullptr) im.log_->info("stopped");
}

void Coordinator::Wait() {
  Impl& im = *impl_;
  std::unique_lock<std::mutex> lock(im.mu_);
  im.cv_.wait(lock, [&im] { return im.stopped_; });
}

absl::Status Coordinator::ReloadTokens() {
  Impl& im = *impl_;
  if (!im.auth_.users_enabled() && !im.auth_.workers_enabled()) {
    im.log_->info("reload: no token files to read (rematd runs without --user-tokens and "
                  "--worker-tokens)");
    return absl::OkStatus();
  }
  absl::Status reloaded = im.auth_.Reload();
  if (!reloaded.ok()) {
    im.log_->error("reload: {}; keeping the {} user and {} worker tokens in use",
                   std::string(reloaded.message()), im.auth_.user_token_count(),
                   im.auth_.worker_token_count());
    return reloaded;
  }
  im.log_->info("reload: token files read again: {} user and {} worker tokens",
                im.auth_.user_token_count(), im.auth_.worker_token_count());
  return absl::OkStatus();
}

void Coordinator::RunExpiryForTest() {
  if (impl_->scheduler_ != nullptr) impl_->scheduler_->Tick();
}

}  // namespace remat::server
