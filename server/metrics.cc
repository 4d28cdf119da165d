#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "common/process_metrics.h"

namespace remat::server {
namespace {

constexpr const char* kRpcMethods[] = {"SubmitSearch", "GetSearch",  "WatchSearch",
                                       "CancelSearch", "ListSearches", "Register",
                                       "Heartbeat",    "LeaseTrial",  "ReportTrial"};

}  // namespace

const char* StateLabel(v1::SearchState state) {
  switch (state) {
    case v1::SEARCH_STATE_QUEUED: return "queued";
    case v1::SEARCH_STATE_RUNNING: return "running";
    case v1::SEARCH_STATE_SUCCEEDED: return "succeeded";
    case v1::SEARCH_STATE_FAILED: return "failed";
    case v1::SEARCH_STATE_CANCELLED: return "cancelled";
    default: return "unspecified";
  }
}

const char* StatusLabel(v1::TrialStatus status) {
  switch (status) {
    case v1::TRIAL_STATUS_OK: return "ok";
    case v1::TRIAL_STATUS_OOM: return "oom";
    case v1::TRIAL_STATUS_FAILED: return "failed";
    case v1::TRIAL_STATUS_TIMEOUT: return "timeout";
    case v1::TRIAL_STATUS_INVALID: return "invalid";
    case v1::TRIAL_STATUS_CANCELLED: return "cancelled";
    case v1::TRIAL_STATUS_PENDING: return "pending";
    case v1::TRIAL_STATUS_RUNNING: return "running";
    default: return "unspecified";
  }
}

Metrics::Metrics(const std::string& version)
    : registry_(std::make_shared<prometheus::Registry>()) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  prometheus::Registry& r = *registry_;

  common::RegisterBuildInfo(r, "remat_build_info", "rematd", version);

  auto& searches = BuildGauge().Name("remat_searches").Help("Searches by state").Register(r);
  for (v1::SearchState s : {v1::SEARCH_STATE_QUEUED, v1::SEARCH_STATE_RUNNING,
                             v1::SEARCH_STATE_SUCCEEDED, v1::SEARCH_STATE_FAILED,
                             v1::SEARCH_STATE_CANCELLED}) {
    searches_[s] = &searches.Add({{"state", StateLabel(s)}});
  }

  auto& trials =
      BuildCounter()
          .Name("remat_trials_total")
          .Help("Trials that ran (not cache hits), by final status")
          .Register(r);
  for (v1::TrialStatus s : {v1::TRIAL_STATUS_OK, v1::TRIAL_STATUS_OOM, v1::TRIAL_STATUS_FAILED,
                            v1::TRIAL_STATUS_TIMEOUT, v1::TRIAL_STATUS_INVALID,
                            v1::TRIAL_STATUS_CANCELLED}) {
    trials_[s] = &trials.Add({{"status", StatusLabel(s)}});
  }
  reused_ = &BuildCounter()
                 .Name("remat_trials_reused_total")
                 .Help("Trials answered from the results cache instead of run")
                 .Register(r)
                 .Add({});
  trial_duration_ = &BuildHistogram()
                         .Name("remat_trial_duration_seconds")
                         .Help("Time from lease to result of trials that ran")
                         .Register(r)
                         .Add({}, prometheus::Histogram::BucketBoundaries{
                                      0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 900, 1800, 3600});
  rpc_family_ = &BuildHistogram()
                    .Name("remat_rpc_duration_seconds")
                    .Help("Time the coordinator took to answer each RPC (long polls included; "
                          "WatchSearch: the stream's life), by method and gRPC status code")
                    .Register(r);
  // The OK series of every method exist from the start (a rate over them reads 0, not
  // nothing); the others appear with their first call.
  for (const char* method : kRpcMethods) ObserveRpcSeries(method, absl::StatusCode::kOk);
  watch_streams_ = &BuildGauge()
                        .Name("remat_watch_streams")
                        .Help("WatchSearch streams open now")
                        .Register(r)
                        .Add({});
  process_ = std::make_unique<common::ProcessMetrics>(r);
  queue_depth_ = &BuildGauge()
                      .Name("remat_queue_depth")
                      .Help("Trials waiting for a worker")
                      .Register(r)
                      .Add({});
  leased_ = &BuildGauge()
                 .Name("remat_trials_leased")
                 .Help("Trials leased to workers now")
                 .Register(r)
                 .Add({});
  workers_ = &BuildGauge()
                  .Name("remat_workers_connected")
                  .Help("Workers heard from within the lease timeout")
                  .Register(r)
                  .Add({});
  auto& gpus = BuildGauge()
                   .Name("remat_gpus")
                   .Help("Slots (GPUs) of connected workers, by state")
                   .Register(r);
  gpus_free_ = &gpus.Add({{"state", "free"}});
  gpus_busy_ = &gpus.Add({{"state", "busy"}});
  frontier_family_ = &BuildGauge()
                          .Name("remat_frontier_points")
                          .Help("Points on the current Pareto frontier of each active search")
                          .Register(r);
}

Metrics::~Metrics() = default;

prometheus::Histogram* Metrics::ObserveRpcSeries(const std::string& method,
                                                 absl::StatusCode code) {
  std::lock_guard<std::mutex> lock(rpc_mu_);
  auto key = std::make_pair(method, code);
  auto it = rpc_duration_.find(key);
  if (it == rpc_duration_.end()) {
    it = rpc_duration_
             .emplace(key, &rpc_family_->Add(
                               {{"method", method},
                                {"code", absl::StatusCodeToString(code)}},
                               prometheus::Histogram::BucketBoundaries{
                                   0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
                                   1, 2.5, 5, 10, 60, 600, 3600}))
             .first;
  }
  return it->second;
}

std::shared_ptr<prometheus::Collectable> Metrics::collectable() {
  if (!collectable_) {
    collectable_ = common::RefreshingCollectable(registry_, [this] { RunCollectHook(); });
  }
  return collectable_;
}

void Metrics::SetCollectHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(hook_mu_);
  hook_ = std::move(hook);
}

void Metrics::RunCollectHook() {
  process_->Update();
  std::lock_guard<std::mutex> lock(hook_mu_);
  if (hook_) hook_();
}

void Metrics::SetSearches(v1::SearchState state, int64_t count) {
  if (auto it = searches_.find(state); it != searches_.end()) {
    it->second->Set(static_cast<double>(count));
  }
}

void Metrics::TrialFinished(v1::TrialStatus status, bool reused, double duration_s) {
  // A cache hit is not a trial that ran: counting it in remat_trials_total would hide the GPU
  // work actually done (and dilute the failure rate the alert rules read).
  if (reused) {
    reused_->Increment();
    return;
  }
  if (auto it = trials_.find(status); it != trials_.end()) it->second->Increment();
  if (duration_s > 0) trial_duration_->Observe(duration_s);
}

void Metrics::SetQueueDepth(int64_t n) { queue_depth_->Set(static_cast<double>(n)); }
void Metrics::SetTrialsLeased(int64_t n) { leased_->Set(static_cast<double>(n)); }
void Metrics::SetWorkersConnected(int64_t n) { workers_->Set(static_cast<double>(n)); }
void Metrics::SetGpus(int64_t free, int64_t busy) {
  gpus_free_->Set(static_cast<double>(free));
  gpus_busy_->Set(static_cast<double>(busy));
}

void Metrics::SetFrontierPoints(const std::string& search_id, int64_t n) {
  std::lock_guard<std::mutex> lock(frontier_mu_);
  auto it = frontier_.find(search_id);
  if (it == frontier_.end()) {
    it = frontier_.emplace(search_id, &frontier_family_->Add({{"search_id", search_id}})).first;
  }
  it->second->Set(static_cast<double>(n));
}

void Metrics::RemoveFrontier(const std::string& search_id) {
  std::lock_guard<std::mutex> lock(frontier_mu_);
  auto it = frontier_.find(search_id);
  if (it == frontier_.end()) return;
  frontier_family_->Remove(it->second);
  frontier_.erase(it);
}

void Metrics::ObserveRpc(const std::string& method, absl::StatusCode code, double seconds) {
  // Bounded labels: the methods of remat.v1 and the canonical codes only.
  bool known = false;
  for (const char* m : kRpcMethods) known = known || method == m;
  const int c = static_cast<int>(code);
  if (!known || c < 0 || c > 16) return;
  ObserveRpcSeries(method, code)->Observe(seconds);
}

void Metrics::WatchStreams(int delta) { watch_streams_->Increment(delta); }

}  // namespace remat::server
