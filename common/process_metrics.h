// The usual process_* Prometheus series of a daemon (rematd, remat-worker), from
// common/process_stats.h: process_resident_memory_bytes, process_virtual_memory_bytes,
// process_open_fds, process_max_fds, process_cpu_seconds_total, process_start_time_seconds.
// Library remat_process_metrics (prometheus-cpp core); the programs' metrics objects own one and
// call Update before each scrape. Also the rest of the preamble both daemons' registries share:
// the build_info gauge and the collectable their /metrics exposer serves.
//
// Thread-safety: Update may be called from any thread (it locks).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace prometheus {
class Collectable;
class Counter;
class Gauge;
class Registry;
}  // namespace prometheus

namespace remat::common {

class ProcessMetrics {
 public:
  // Registers the families in `registry`, which must outlive this object.
  explicit ProcessMetrics(prometheus::Registry& registry);

  // Reads this process's stats and sets the series (left as they were when /proc cannot be
  // read).
  void Update();

 private:
  std::mutex mu_;
  prometheus::Gauge* resident_ = nullptr;
  prometheus::Gauge* virtual_ = nullptr;
  prometheus::Gauge* open_fds_ = nullptr;
  prometheus::Gauge* max_fds_ = nullptr;
  prometheus::Counter* cpu_ = nullptr;
  prometheus::Gauge* start_time_ = nullptr;
  double cpu_reported_ = 0;
};

// Registers the gauge `name` (e.g. remat_build_info), value 1, labelled with the daemon's
// `version`, its help naming `program` (rematd, remat-worker).
void RegisterBuildInfo(prometheus::Registry& registry, const std::string& name,
                       const std::string& program, const std::string& version);

// What a daemon's /metrics serves: each collection first runs `before_collect` (which refreshes
// the gauges of state and the process_* series), then collects `registry`. The exposer holds
// collectables weakly: the caller keeps the returned one alive while it is registered.
std::shared_ptr<prometheus::Collectable> RefreshingCollectable(
    std::shared_ptr<prometheus::Registry> registry, std::function<void()> before_collect);

}  // namespace remat::common
