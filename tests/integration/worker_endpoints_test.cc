// remat-worker's own endpoints as an operator scrapes and probes them, on real processes:
// --metrics-listen serves remat_worker_* (registered, slots, trials by status, lease latency,
// trial memory) and process_*, accepted by promtool; --health-listen answers the standard gRPC
// health service: "" (liveness) SERVING while the daemon runs, "remat.v1.WorkerService"
// (readiness) SERVING only while the worker is registered, so losing the coordinator makes the
// worker unready but never restarts it. Also --version, and bad addresses exit 2.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <thread>

#include "tests/integration/harness.h"

namespace remat::integration {
namespace {

using nlohmann::json;

// grpc.health.v1.Health/Check of `service`: 1 SERVING, 2 NOT_SERVING, -1 the call failed
// (NOT_FOUND for an unknown service included).
int HealthStatus(int port, const std::string& service) {
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  std::string encoded;  // HealthCheckRequest{service = 1}
  if (!service.empty()) {
    encoded = std::string("\x0a", 1) + static_cast<char>(service.size()) + service;
  }
  grpc::Slice slice(encoded);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) { done.set_value(s); });
  if (!done.get_future().get().ok()) return -1;
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return -1;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes.size() == 2 && bytes[0] == '\x08' ? bytes[1] : 0;
}

bool WaitUntil(const std::function<bool()>& pred, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return true;
}

// The value of the sample `series` (name and labels as printed) on a Prometheus page; -1 absent.
double Sample(const std::string& page, const std::string& series) {
  const auto at = page.find("\n" + series + " ");
  return at == std::string::npos ? -1 : std::stod(page.substr(at + series.size() + 2));
}

class WorkerEndpointsTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_.LogTails();
  }
  Cluster cluster_;
};

TEST_F(WorkerEndpointsTest, MetricsAndHealthOfAWorkerThatRanASearch) {
  Daemon* rematd = cluster_.StartCoordinator();
  const int metrics_port = FreePort();
  const int health_port = FreePort();
  cluster_.StartWorker(2, {"--metrics-listen", "127.0.0.1:" + std::to_string(metrics_port),
                           "--health-listen", "127.0.0.1:" + std::to_string(health_port)});
  ASSERT_TRUE(WaitUntil([&] { return HealthStatus(health_port, "remat.v1.WorkerService") == 1; },
                        20))
      << "never ready";
  EXPECT_EQ(HealthStatus(health_port, ""), 1);

  json table = MakeReplayTable(/*seed=*/7, /*wall_s=*/0.05);
  const std::string id = cluster_.Submit(cluster_.WriteReplaySpec("endpoints", table));
  json result = cluster_.WaitFinal(id, 60);
  ASSERT_EQ(result["state"], "succeeded") << result.dump();
  std::map<std::string, int> by_status;
  for (const auto& t : result["trials"]) ++by_status[t["status"].get<std::string>()];

  const std::string page = HttpGet(metrics_port, "/metrics");
  ASSERT_NE(page.find("remat_worker_"), std::string::npos) << page;
  EXPECT_EQ(Sample(page, "remat_worker_registered"), 1) << page;
  EXPECT_EQ(Sample(page, "remat_worker_slots{state=\"free\"}"), 2) << page;
  EXPECT_EQ(Sample(page, "remat_worker_slots{state=\"busy\"}"), 0) << page;
  EXPECT_EQ(Sample(page, "remat_worker_trials_running"), 0) << page;
  for (const std::string status : {"ok", "oom", "failed"}) {
    EXPECT_EQ(Sample(page, "remat_worker_trials_total{status=\"" + status + "\"}"),
              by_status[status])
        << status << "\n" << page;
  }
  EXPECT_EQ(Sample(page, "remat_worker_trials_failed_total"), by_status["failed"]) << page;
  EXPECT_GE(Sample(page, "remat_worker_lease_duration_seconds_count{outcome=\"trials\"}"), 1)
      << page;
  EXPECT_GE(Sample(page, "remat_worker_trial_memory_bytes"), 0) << page;
  EXPECT_GT(Sample(page, "process_resident_memory_bytes"), 1 << 20) << page;
  EXPECT_GT(Sample(page, "process_open_fds"), 3) << page;
  EXPECT_NE(page.find("remat_worker_build_info{version=\""), std::string::npos) << page;

  if (access("/usr/bin/promtool", X_OK) == 0 || access("/usr/local/bin/promtool", X_OK) == 0) {
    const std::string path = cluster_.dir() + "/worker-metrics.txt";
    std::ofstream(path) << page;
    CommandResult check = cluster_.Run({"/bin/sh", "-c", "promtool check metrics < '" + path + "'"});
    EXPECT_EQ(check.exit_code, 0) << check.out << check.err;
  }

  // The coordinator goes away: the worker turns unready but stays alive.
  rematd->Kill(SIGKILL);
  rematd->Wait(10);
  EXPECT_TRUE(WaitUntil([&] { return HealthStatus(health_port, "remat.v1.WorkerService") == 2; },
                        30))
      << "still ready without a coordinator";
  EXPECT_EQ(HealthStatus(health_port, ""), 1);
  EXPECT_EQ(Sample(HttpGet(metrics_port, "/metrics"), "remat_worker_registered"), 0);
}

TEST_F(WorkerEndpointsTest, VersionAndBadAddresses) {
  CommandResult version = cluster_.Run({REMAT_WORKER_BIN, "--version"});
  EXPECT_EQ(version.exit_code, 0) << version.err;
  EXPECT_FALSE(version.out.empty());
  for (const std::string flag : {"--metrics-listen", "--health-listen"}) {
    CommandResult bad = cluster_.Run({REMAT_WORKER_BIN, "--coordinator", "127.0.0.1:1",
                                      "--plain-slots", "1", "--work-dir", cluster_.dir() + "/w",
                                      flag, "nowhere"});
    EXPECT_EQ(bad.exit_code, 2) << flag << bad.err;
    // The last line (a warning may come first: no remat-trial beside a test build's worker).
    std::string last = bad.err.substr(0, bad.err.find_last_not_of('\n') + 1);
    last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
    EXPECT_EQ(last.rfind("error: " + flag + ": expected HOST:PORT", 0), 0u) << bad.err;
  }
}

}  // namespace
}  // namespace remat::integration
