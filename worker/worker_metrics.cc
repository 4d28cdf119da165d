#include "worker/worker_metrics.h"

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/main_util.h"
#include "common/process_metrics.h"
#include "common/process_stats.h"
#include "worker/worker_daemon.h"

namespace remat::worker {
namespace {

constexpr char kReadinessService[] = "remat.v1.WorkerService";

absl::Status CheckHostPort(const std::string& flag, const std::string& value) {
  const std::string problem = common::HostPortProblem(flag, value);
  return problem.empty() ? absl::OkStatus() : absl::InvalidArgumentError(problem);
}

}  // namespace

WorkerMetrics::WorkerMetrics(const std::string& version)
    : registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  prometheus::Registry& r = *registry_;
  common::RegisterBuildInfo(r, "remat_worker_build_info", "remat-worker", version);
  registered_ = &BuildGauge()
                     .Name("remat_worker_registered")
                     .Help("1 while the worker is registered with the coordinator")
                     .Register(r)
                     .Add({});
  auto& slots = BuildGauge().Name("remat_worker_slots").Help("Slots by state").Register(r);
  slots_busy_ = &slots.Add({{"state", "busy"}});
  slots_free_ = &slots.Add({{"state", "free"}});
  running_ = &BuildGauge()
                  .Name("remat_worker_trials_running")
                  .Help("Trials running now")
                  .Register(r)
                  .Add({});
  auto& trials = BuildCounter()
                     .Name("remat_worker_trials_total")
                     .Help("Trials run to a result, by status")
                     .Register(r);
  for (search::TrialStatus s :
       {search::TrialStatus::kOk, search::TrialStatus::kOom, search::TrialStatus::kFailed,
        search::TrialStatus::kTimeout, search::TrialStatus::kInvalid,
        search::TrialStatus::kCancelled}) {
    trials_[s] = &trials.Add({{"status", search::Name(s)}});
  }
  failed_ = &BuildCounter()
                 .Name("remat_worker_trials_failed_total")
                 .Help("Trials that failed or timed out")
                 .Register(r)
                 .Add({});
  auto& lease = BuildHistogram()
                    .Name("remat_worker_lease_duration_seconds")
                    .Help("LeaseTrial calls, long poll included, by outcome")
                    .Register(r);
  const prometheus::Histogram::BucketBoundaries buckets{0.001, 0.005, 0.01, 0.05, 0.1, 0.25,
                                                        0.5,   1,     2,    5,    10,  30};
  lease_[LeaseOutcome::kTrials] = &lease.Add({{"outcome", "trials"}}, buckets);
  lease_[LeaseOutcome::kEmpty] = &lease.Add({{"outcome", "empty"}}, buckets);
  lease_[LeaseOutcome::kError] = &lease.Add({{"outcome", "error"}}, buckets);
  spooled_ = &BuildGauge()
                  .Name("remat_worker_reports_spooled")
                  .Help("Trial results waiting to be delivered to the coordinator")
                  .Register(r)
                  .Add({});
  trial_memory_ = &BuildGauge()
                       .Name("remat_worker_trial_memory_bytes")
                       .Help("Resident memory of the trial processes (every process below the "
                             "worker)")
                       .Register(r)
                       .Add({});
  trial_processes_ = &BuildGauge()
                          .Name("remat_worker_trial_processes")
                          .Help("Processes below the worker")
                          .Register(r)
                          .Add({});
  process_ = std::make_unique<common::ProcessMetrics>(r);
}

WorkerMetrics::~WorkerMetrics() = default;

void WorkerMetrics::SetStatsSource(std::function<WorkerStats()> stats) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = std::move(stats);
}

void WorkerMetrics::TrialFinished(search::TrialStatus status) {
  if (auto it = trials_.find(status); it != trials_.end()) it->second->Increment();
  if (status == search::TrialStatus::kFailed || status == search::TrialStatus::kTimeout) {
    failed_->Increment();
  }
}

void WorkerMetrics::ObserveLease(LeaseOutcome outcome, double seconds) {
  lease_.at(outcome)->Observe(seconds);
}

void WorkerMetrics::Refresh() {
  process_->Update();
  const common::DescendantsMemory trials = common::ReadDescendantsMemory(getpid());
  trial_memory_->Set(static_cast<double>(trials.resident_bytes));
  trial_processes_->Set(trials.processes);
  std::function<WorkerStats()> stats;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats = stats_;
  }
  if (!stats) return;
  const WorkerStats s = stats();
  registered_->Set(s.registered ? 1 : 0);
  slots_free_->Set(s.free_slots);
  slots_busy_->Set(s.total_slots - s.free_slots);
  running_->Set(s.running_trials);
  spooled_->Set(s.spooled);
}

// ------------------------------------------------------------------------------- endpoints

class WorkerEndpoints::Health {
 public:
  // Answers every method but the health service's with UNIMPLEMENTED. Registered because gRPC
  // refuses to start a server whose only service is the (synchronous) default health service
  // without a polled completion queue; a callback service makes it run on gRPC's own threads.
  grpc::CallbackGenericService unimplemented;
  std::unique_ptr<grpc::Server> server;
};

absl::StatusOr<std::unique_ptr<WorkerEndpoints>> WorkerEndpoints::Start(
    const WorkerEndpointsOptions& options, WorkerMetrics* metrics,
    std::function<WorkerStats()> stats) {
  if (!options.metrics_listen.empty()) {
    if (absl::Status st = CheckHostPort("--metrics-listen", options.metrics_listen); !st.ok()) {
      return st;
    }
  }
  if (!options.health_listen.empty()) {
    if (absl::Status st = CheckHostPort("--health-listen", options.health_listen); !st.ok()) {
      return st;
    }
  }
  std::unique_ptr<WorkerEndpoints> e(new WorkerEndpoints());
  e->stats_ = stats;
  metrics->SetStatsSource(stats);
  if (!options.metrics_listen.empty()) {
    try {
      e->exposer_ = std::make_unique<prometheus::Exposer>(options.metrics_listen, 1);
    } catch (const std::exception& ex) {
      return absl::UnavailableError(absl::StrCat("--metrics-listen: cannot listen on ",
                                                 options.metrics_listen, ": ", ex.what()));
    }
    // The exposer holds collectables weakly: this object keeps it alive.
    e->collectable_ =
        common::RefreshingCollectable(metrics->registry(), [metrics] { metrics->Refresh(); });
    e->exposer_->RegisterCollectable(e->collectable_);
    auto ports = e->exposer_->GetListeningPorts();
    e->metrics_port_ = ports.empty() ? 0 : ports.front();
  }
  if (!options.health_listen.empty()) {
    grpc::EnableDefaultHealthCheckService(true);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(options.health_listen, grpc::InsecureServerCredentials(),
                             &e->health_port_);
    builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
    e->health_ = std::make_unique<Health>();
    builder.RegisterCallbackGenericService(&e->health_->unimplemented);
    e->health_->server = builder.BuildAndStart();
    if (e->health_->server == nullptr || e->health_port_ == 0) {
      e->health_.reset();
      return absl::UnavailableError(absl::StrCat("--health-listen: cannot listen on ",
                                                 options.health_listen,
                                                 " (address in use or not available?)"));
    }
    auto* service = e->health_->server->GetHealthCheckService();
    service->SetServingStatus(true);  // "" : the daemon runs
    service->SetServingStatus(kReadinessService, false);
    e->refresher_ = std::thread([raw = e.get()] { raw->HealthLoop(); });
  }
  return e;
}

void WorkerEndpoints::HealthLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  bool last = false;
  while (!stopping_) {
    lock.unlock();
    const bool registered = stats_().registered;
    lock.lock();
    if (stopping_) break;
    if (registered != last) {
      health_->server->GetHealthCheckService()->SetServingStatus(kReadinessService, registered);
      last = registered;
    }
    cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stopping_; });
  }
}

void WorkerEndpoints::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
  if (health_ != nullptr) {
    health_->server->GetHealthCheckService()->SetServingStatus(false);
    health_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    health_->server->Wait();
  }
  exposer_.reset();
}

WorkerEndpoints::~WorkerEndpoints() { Stop(); }

}  // namespace remat::worker
