// What remat-worker shows an operator: Prometheus metrics (--metrics-listen) and the standard
// gRPC health service (--health-listen), for a node's monitoring and Kubernetes probes.
//
//   remat_worker_build_info{version}              gauge, 1
//   remat_worker_registered                       gauge: 1 while registered with the coordinator
//   remat_worker_slots{state="busy|free"}         gauge: this worker's slots
//   remat_worker_trials_running                   gauge: trials running now
//   remat_worker_trials_total{status}             counter: trials run to a result, by status
//                                                 (ok, oom, failed, timeout, invalid, cancelled)
//   remat_worker_trials_failed_total              counter: of those, failed or timed out (the
//                                                 failures an operator acts on; oom and invalid
//                                                 are answers)
//   remat_worker_lease_duration_seconds{outcome}  histogram: LeaseTrial calls (long poll
//                                                 included), outcome trials|empty|error
//   remat_worker_reports_spooled                  gauge: results waiting to be delivered
//   remat_worker_trial_memory_bytes               gauge: resident memory of the trial processes
//                                                 (every process below the worker; a Slurm
//                                                 executor's trials run under slurmd: 0)
//   remat_worker_trial_processes                  gauge: how many processes that sums
//   process_*                                     the worker's own (common/process_metrics.h)
//
// Health (grpc.health.v1): service "" is SERVING while the daemon runs (liveness: it does not
// depend on the coordinator, so a coordinator restart never restarts workers and their
// trials); service "remat.v1.WorkerService" is SERVING while the worker is registered with the
// coordinator (readiness). Both turn NOT_SERVING when it stops.
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "search/trial.h"

namespace prometheus {
class Collectable;
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace remat::common {
class ProcessMetrics;
}  // namespace remat::common

namespace remat::worker {

struct WorkerStats;

// The worker's metric families, built once. The daemon reports events (TrialFinished,
// ObserveLease); the gauges of state are read from `stats` at scrape time.
class WorkerMetrics {
 public:
  explicit WorkerMetrics(const std::string& version);
  ~WorkerMetrics();

  // Where the state gauges come from (the daemon's stats()); set before serving.
  void SetStatsSource(std::function<WorkerStats()> stats);

  void TrialFinished(search::TrialStatus status);
  enum class LeaseOutcome { kTrials, kEmpty, kError };
  void ObserveLease(LeaseOutcome outcome, double seconds);

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // Refreshes the state gauges (what a scrape does first).
  void Refresh();

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<common::ProcessMetrics> process_;
  std::mutex mu_;
  std::function<WorkerStats()> stats_;
  prometheus::Gauge* registered_ = nullptr;
  prometheus::Gauge* slots_busy_ = nullptr;
  prometheus::Gauge* slots_free_ = nullptr;
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* spooled_ = nullptr;
  prometheus::Gauge* trial_memory_ = nullptr;
  prometheus::Gauge* trial_processes_ = nullptr;
  prometheus::Counter* failed_ = nullptr;
  std::map<search::TrialStatus, prometheus::Counter*> trials_;
  std::map<LeaseOutcome, prometheus::Histogram*> lease_;
};

struct WorkerEndpointsOptions {
  std::string metrics_listen;  // HOST:PORT for /metrics; "" none; port 0 a free one
  std::string health_listen;   // HOST:PORT for plaintext gRPC health; "" none; port 0 a free one
};

// Serves `metrics` over HTTP and the health service over gRPC, with the states read from
// `stats` (refreshed twice a second for health, at each scrape for metrics).
class WorkerEndpoints {
 public:
  // InvalidArgument naming the flag for a malformed address; Unavailable naming it when the
  // address cannot be bound.
  static absl::StatusOr<std::unique_ptr<WorkerEndpoints>> Start(
      const WorkerEndpointsOptions& options, WorkerMetrics* metrics,
      std::function<WorkerStats()> stats);
  ~WorkerEndpoints();  // Stop()

  int metrics_port() const { return metrics_port_; }
  int health_port() const { return health_port_; }

  // Both health services turn NOT_SERVING; then the servers stop. Idempotent.
  void Stop();

  class Health;

 private:
  WorkerEndpoints() = default;
  void HealthLoop();

  std::function<WorkerStats()> stats_;
  std::shared_ptr<prometheus::Collectable> collectable_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<Health> health_;
  int metrics_port_ = 0;
  int health_port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::thread refresher_;
};

}  // namespace remat::worker
