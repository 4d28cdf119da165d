#include "common/process_metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>

#include "common/process_stats.h"

namespace remat::common {
namespace {

class Refreshing : public prometheus::Collectable {
 public:
  Refreshing(std::shared_ptr<prometheus::Registry> registry, std::function<void()> before_collect)
      : registry_(std::move(registry)), before_collect_(std::move(before_collect)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    before_collect_();
    return registry_->Collect();
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::function<void()> before_collect_;
};

}  // namespace

void RegisterBuildInfo(prometheus::Registry& registry, const std::string& name,
                       const std::string& program, const std::string& version) {
  prometheus::BuildGauge()
      .Name(name)
      .Help("Build information of " + program + "; value 1")
      .Register(registry)
      .Add({{"version", version}})
      .Set(1);
}

std::shared_ptr<prometheus::Collectable> RefreshingCollectable(
    std::shared_ptr<prometheus::Registry> registry, std::function<void()> before_collect) {
  return std::make_shared<Refreshing>(std::move(registry), std::move(before_collect));
}

ProcessMetrics::ProcessMetrics(prometheus::Registry& r) {
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  resident_ = &BuildGauge()
                   .Name("process_resident_memory_bytes")
                   .Help("Resident memory size in bytes")
                   .Register(r)
                   .Add({});
  virtual_ = &BuildGauge()
                  .Name("process_virtual_memory_bytes")
                  .Help("Virtual memory size in bytes")
                  .Register(r)
                  .Add({});
  open_fds_ =
      &BuildGauge().Name("process_open_fds").Help("Open file descriptors").Register(r).Add({});
  max_fds_ = &BuildGauge()
                  .Name("process_max_fds")
                  .Help("Maximum number of open file descriptors (soft limit)")
                  .Register(r)
                  .Add({});
  cpu_ = &BuildCounter()
              .Name("process_cpu_seconds_total")
              .Help("User and system CPU time spent in seconds")
              .Register(r)
              .Add({});
  start_time_ = &BuildGauge()
                     .Name("process_start_time_seconds")
                     .Help("Start time of the process since the Unix epoch in seconds")
                     .Register(r)
                     .Add({});
}

void ProcessMetrics::Update() {
  std::optional<ProcessStats> stats = ReadProcessStats();
  if (!stats) return;
  std::lock_guard<std::mutex> lock(mu_);
  resident_->Set(static_cast<double>(stats->resident_bytes));
  virtual_->Set(static_cast<double>(stats->virtual_bytes));
  if (stats->open_fds >= 0) open_fds_->Set(static_cast<double>(stats->open_fds));
  if (stats->max_fds >= 0) max_fds_->Set(static_cast<double>(stats->max_fds));
  // A counter only grows: add what the process used since the last scrape.
  if (stats->cpu_seconds > cpu_reported_) {
    cpu_->Increment(stats->cpu_seconds - cpu_reported_);
    cpu_reported_ = stats->cpu_seconds;
  }
  start_time_->Set(stats->start_time_seconds);
}

}  // namespace remat::common
