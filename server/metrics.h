// The coordinator's Prometheus metrics: one object builds every family once and caches the
// series it updates (prometheus-cpp's Add is slow on hot paths).
//
//   remat_build_info{version}                 gauge, 1
//   remat_searches{state}                     gauge: searches in each state (all five states)
//   remat_trials_total{status}                counter: trials finished, by final status
//   remat_trials_reused_total                 counter: trials answered from the results cache
//   remat_trial_duration_seconds              histogram: lease to result of run (not reused) trials
//   remat_queue_depth                         gauge: trials waiting for a worker
//   remat_trials_leased                       gauge: trials leased to workers now
//   remat_workers_connected                   gauge: workers heard from within the lease timeout
//   remat_gpus{state="free|busy"}             gauge: slots of connected workers
//   remat_frontier_points{search_id}          gauge: frontier size of each active search only;
//                                             the series is removed when the search ends
//   remat_rpc_duration_seconds{method,code}   histogram: time to answer each RPC (LeaseTrial
//                                             long polls included: a call answered at once
//                                             measures dispatch; WatchSearch: the stream's whole
//                                             life); method = the RPC's name, code = the gRPC
//                                             status it ended with ("OK", "UNAUTHENTICATED",
//                                             "RESOURCE_EXHAUSTED", ...), refusals included
//   remat_watch_streams                       gauge: WatchSearch streams open now
//   process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds,
//   process_max_fds, process_cpu_seconds_total, process_start_time_seconds
//                                             the usual process metrics (common/process_stats.h),
//                                             read at scrape time
//
// Thread-safety: every method may be called from any thread.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "remat/v1/remat.pb.h"

namespace prometheus {
class Collectable;
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace remat::common {
class ProcessMetrics;
}  // namespace remat::common

namespace remat::server {

class Metrics {
 public:
  explicit Metrics(const std::string& version);
  ~Metrics();

  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }
  // What the /metrics endpoint serves: runs the collect hook (which refreshes the gauges), then
  // collects the registry. Gauges of state (queue depth, workers, GPUs, searches) are computed
  // at scrape time rather than on every call.
  std::shared_ptr<prometheus::Collectable> collectable();
  // Set (or clear, with nullptr) the hook run before each collection.
  void SetCollectHook(std::function<void()> hook);
  void RunCollectHook();

  void SetSearches(v1::SearchState state, int64_t count);
  void TrialFinished(v1::TrialStatus status, bool reused, double duration_s);
  void SetQueueDepth(int64_t n);
  void SetTrialsLeased(int64_t n);
  void SetWorkersConnected(int64_t n);
  void SetGpus(int64_t free, int64_t busy);
  void SetFrontierPoints(const std::string& search_id, int64_t n);
  void RemoveFrontier(const std::string& search_id);
  // `method` is one of the RPC names of remat.v1 ("LeaseTrial", "WatchSearch", ...); others
  // are ignored. `code` is the status the call ended with.
  void ObserveRpc(const std::string& method, absl::StatusCode code, double seconds);
  // A watch stream opened (+1) or ended (-1).
  void WatchStreams(int delta);

 private:
  prometheus::Histogram* ObserveRpcSeries(const std::string& method, absl::StatusCode code);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<prometheus::Collectable> collectable_;
  std::mutex hook_mu_;
  std::function<void()> hook_;
  std::map<v1::SearchState, prometheus::Gauge*> searches_;
  std::map<v1::TrialStatus, prometheus::Counter*> trials_;
  prometheus::Counter* reused_ = nullptr;
  prometheus::Histogram* trial_duration_ = nullptr;
  prometheus::Family<prometheus::Histogram>* rpc_family_ = nullptr;
  std::mutex rpc_mu_;
  std::map<std::pair<std::string, absl::StatusCode>, prometheus::Histogram*> rpc_duration_;
  prometheus::Gauge* watch_streams_ = nullptr;
  std::unique_ptr<common::ProcessMetrics> process_;
  prometheus::Gauge* queue_depth_ = nullptr;
  prometheus::Gauge* leased_ = nullptr;
  prometheus::Gauge* workers_ = nullptr;
  prometheus::Gauge* gpus_free_ = nullptr;
  prometheus::Gauge* gpus_busy_ = nullptr;
  prometheus::Family<prometheus::Gauge>* frontier_family_ = nullptr;
  std::mutex frontier_mu_;
  std::map<std::string, prometheus::Gauge*> frontier_;
};

// Lower-case names as used in labels: "queued", "ok", ...
const char* StateLabel(v1::SearchState state);
const char* StatusLabel(v1::TrialStatus status);

}  // namespace remat::server
