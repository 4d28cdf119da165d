// The daemon against an in-memory fake coordinator: leasing, reporting, cancel, reconnect,
// spooling and redelivery, stopping.
#include "worker/worker_daemon.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "tests/worker/test_util.h"
#include "worker/process_runner.h"
#include "worker/result_spool.h"

namespace remat::worker {
namespace {

using testing::TempDir;
using testing::WaitUntil;
using testing::WriteText;

// A coordinator in memory. `up` false answers every call with UNAVAILABLE.
class FakeCoordinator {
 public:
  std::mutex mu;
  bool up = true;
  bool reports_down = false;  // ReportTrial alone answers UNAVAILABLE
  bool refuse_credentials = false;
  // A report it answers with an error (not UNAVAILABLE) is refused and not recorded.
  std::function<absl::Status(const v1::ReportTrialRequest&)> refuse;
  std::vector<v1::ReportTrialRequest> refused;
  int registrations = 0;
  std::string last_registered_id;
  v1::RegisterRequest last_register;
  std::deque<v1::TrialAssignment> queue;
  std::vector<v1::ReportTrialRequest> reports;
  std::vector<std::string> cancel_ids;
  std::vector<int> lease_free_slots;

  void Push(v1::TrialAssignment a) {
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(std::move(a));
  }
  size_t NumReports() {
    std::lock_guard<std::mutex> lock(mu);
    return reports.size();
  }
  void SetUp(bool value) {
    std::lock_guard<std::mutex> lock(mu);
    up = value;
  }
  void SetReportsDown(bool value) {
    std::lock_guard<std::mutex> lock(mu);
    reports_down = value;
  }
};

class FakeClient : public CoordinatorClient {
 public:
  explicit FakeClient(FakeCoordinator* c) : c_(c) {}
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request) override {
    std::lock_guard<std::mutex> lock(c_->mu);
    if (c_->refuse_credentials) return absl::UnauthenticatedError("bad worker token");
    if (!c_->up) return absl::UnavailableError("connection refused");
    ++c_->registrations;
    c_->last_registered_id = request.worker_id();
    c_->last_register = request;
    v1::RegisterResponse r;
    r.set_worker_id("w-1");
    r.set_heartbeat_interval_s(0.05);
    return r;
  }
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest&) override {
    std::lock_guard<std::mutex> lock(c_->mu);
    if (!c_->up) return absl::UnavailableError("connection refused");
    v1::HeartbeatResponse r;
    for (const auto& id : c_->cancel_ids) r.add_cancel_trial_ids(id);
    return r;
  }
  absl::StatusOr<v1::LeaseTrialResponse> LeaseTrial(const v1::LeaseTrialRequest& req) override {
    {
      std::lock_guard<std::mutex> lock(c_->mu);
      if (!c_->up) return absl::UnavailableError("connection refused");
      c_->lease_free_slots.push_back(req.free_slots());
      v1::LeaseTrialResponse r;
      int free = req.free_slots();
      while (!c_->queue.empty() && c_->queue.front().world_size() <= free) {
        free -= c_->queue.front().world_size();
        *r.add_trials() = c_->queue.front();
        c_->queue.pop_front();
      }
      if (r.trials_size() > 0) return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a short long-poll
    return v1::LeaseTrialResponse();
  }
  absl::StatusOr<v1::ReportTrialResponse> ReportTrial(const v1::ReportTrialRequest& req) override {
    std::lock_guard<std::mutex> lock(c_->mu);
    if (!c_->up || c_->reports_down) return absl::UnavailableError("connection refused");
    if (c_->refuse) {
      if (absl::Status no = c_->refuse(req); !no.ok()) {
        c_->refused.push_back(req);
        return no;
      }
    }
    c_->reports.push_back(req);
    v1::ReportTrialResponse r;
    r.set_accepted(true);
    return r;
  }
  void Shutdown() override {}

 private:
  FakeCoordinator* c_;
};

v1::TrialAssignment Replay(const std::string& id, double wall_s, int world = 1) {
  v1::TrialAssignment a;
  a.set_trial_id(id);
  a.set_search_id("s-1");
  a.set_attempt(1);
  a.set_world_size(world);
  a.mutable_policy()->set_canonical("selective:[]");
  a.mutable_spec()->mutable_model()->set_seq_length(100);
  a.mutable_spec()->mutable_search()->set_backend("replay");
  a.set_replay_found(true);
  a.mutable_replay()->set_wall_s(wall_s);
  a.mutable_replay()->mutable_result()->set_status(v1::TRIAL_STATUS_OK);
  a.mutable_replay()->mutable_result()->set_step_time_s(1.0);
  return a;
}

class DaemonTest : public ::testing::Test {
 protected:
  void Start(int slots = 2, const std::string& megatron_driver = "") {
    WorkerDaemonOptions options;
    options.megatron_driver = megatron_driver;
    options.megatron_python = "/usr/bin/python3";
    options.slots = PlainSlots(slots);
    options.work_dir = dir_.path();
    options.lease_wait_s = 0.01;
    options.backoff_initial_s = 0.01;
    options.backoff_max_s = 0.05;
    options.versions = {{"remat", "test"}};
    WorkerDaemonSeams seams;
    seams.client = std::make_unique<FakeClient>(&coordinator_);
    auto daemon = WorkerDaemon::Create(options, std::move(seams));
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
    thread_ = std::thread([this] { run_status_ = daemon_->Run(); });
  }
  void StopDaemon() {
    if (!daemon_) return;
    daemon_->Stop();
    thread_.join();
    daemon_.reset();
  }
  void TearDown() override { StopDaemon(); }

  TempDir dir_;
  FakeCoordinator coordinator_;
  std::unique_ptr<WorkerDaemon> daemon_;
  std::thread thread_;
  absl::Status run_status_;
};

TEST_F(DaemonTest, RegistersLeasesRunsAndReports) {
  Start(2);
  ASSERT_TRUE(WaitUntil([&] { return daemon_->stats().registered; }));
  {
    std::lock_guard<std::mutex> lock(coordinator_.mu);
    EXPECT_EQ(coordinator_.last_register.gpus_size(), 2);
    EXPECT_EQ(coordinator_.last_register.gpus(1).name(), "cpu-slot");
    EXPECT_EQ(coordinator_.last_register.versions().at("remat"), "test");
    std::vector<std::string> backends(coordinator_.last_register.backends().begin(),
                                      coordinator_.last_register.backends().end());
    EXPECT_EQ(backends, std::vector<std::string>({"replay"}));  // no trial binary, no templates
  }
  coordinator_.Push(Replay("t-1", 0.05));
  coordinator_.Push(Replay("t-2", 0.05));
  ASSERT_TRUE(WaitUntil([&] { return coordinator_.NumReports() == 2; }));
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  for (const auto& r : coordinator_.reports) {
    EXPECT_EQ(r.worker_id(), "w-1");
    EXPECT_EQ(r.result().status(), v1::TRIAL_STATUS_OK);
    EXPECT_GE(r.result().wall_s(), 0.05);
    EXPECT_DOUBLE_EQ(r.result().tokens_per_s(), 100);
    EXPECT_EQ(r.result().policy().canonical(), "selective:[]");  // stamped by MakeReport
  }
}

// A report the coordinator refuses for what it says cannot be delivered as it is; the worker
// reports the trial failed with the refusal instead, so the search learns why at once.
TEST_F(DaemonTest, ARefusedReportBecomesAFailedReportWithTheReason) {
  coordinator_.refuse = [](const v1::ReportTrialRequest& r) {
    if (r.result().status() == v1::TRIAL_STATUS_FAILED) return absl::OkStatus();
    return absl::InvalidArgumentError("result.ranks[1].rank: rank 0 has a result already");
  };
  coordinator_.Push(Replay("t-1", 0));
  Start();
  ASSERT_TRUE(WaitUntil([&] { return coordinator_.NumReports() == 1; }));
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  ASSERT_EQ(coordinator_.refused.size(), 1u);
  const v1::ReportTrialRequest& sent = coordinator_.reports[0];
  EXPECT_EQ(sent.trial_id(), "t-1");
  EXPECT_EQ(sent.attempt(), 1);
  EXPECT_EQ(sent.result().status(), v1::TRIAL_STATUS_FAILED);
  EXPECT_EQ(sent.result().policy().canonical(), "selective:[]");
  EXPECT_EQ(sent.result().message(),
            "the coordinator refused this trial's report: result.ranks[1].rank: rank 0 has a "
            "result already");
}

TEST_F(DaemonTest, LeasesOnlyWhatFitsItsFreeSlots) {
  Start(2);
  coordinator_.Push(Replay("t-1", 600, /*world=*/2));
  ASSERT_TRUE(WaitUntil([&] { return daemon_->stats().running_trials == 1; }));
  EXPECT_EQ(daemon_->stats().free_slots, 0);
  {
    std::lock_guard<std::mutex> lock(coordinator_.mu);
    coordinator_.lease_free_slots.clear();
    coordinator_.cancel_ids.push_back("t-1");
  }
  ASSERT_TRUE(WaitUntil([&] { return coordinator_.NumReports() == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return daemon_->stats().free_slots == 2; }));
  // Leasing resumes once slots are free, and never asks with none free.
  ASSERT_TRUE(WaitUntil([&] {
    std::lock_guard<std::mutex> lock(coordinator_.mu);
    return !coordinator_.lease_free_slots.empty();
  }));
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  for (int free : coordinator_.lease_free_slots) EXPECT_GT(free, 0);
}

TEST_F(DaemonTest, UnknownBackendIsAFailedResultNotACrash) {
  Start(1);
  v1::TrialAssignment a = Replay("t-1", 0);
  a.mutable_spec()->mutable_search()->set_backend("builtin");  // no trial binary configured
  coordinator_.Push(a);
  ASSERT_TRUE(WaitUntil([&] { return coordinator_.NumReports() == 1; }));
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  EXPECT_EQ(coordinator_.reports[0].result().status(), v1::TRIAL_STATUS_FAILED);
  EXPECT_EQ(coordinator_.reports[0].result().message(), "this worker has no builtin backend");
}

TEST_F(DaemonTest, OffersAndRunsTheMegatronBackendWhenADriverIsConfigured) {
  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "python3 not installed";
  setenv("REMAT_SOURCE_DIR", REMAT_SOURCE_DIR, 1);
  Start(1, std::string(REMAT_SOURCE_DIR) + "/tests/worker/fake_megatron_driver.py");
  ASSERT_TRUE(WaitUntil([&] { return daemon_->stats().registered; }));
  {
    std::lock_guard<std::mutex> lock(coordinator_.mu);
    std::vector<std::string> backends(coordinator_.last_register.backends().begin(),
                                      coordinator_.last_register.backends().end());
    EXPECT_EQ(backends, std::vector<std::string>({"megatron", "replay"}));
  }
  v1::TrialAssignment a = Replay("t-9", 0);
  a.mutable_policy()->set_canonical("full:uniform:1");
  a.clear_replay();
  a.set_replay_found(false);
  v1::SearchSpec* spec = a.mutable_spec();
  spec->set_name("ok");  // the fake driver's mode
  spec->mutable_model()->set_num_layers(2);
  spec->mutable_model()->set_hidden_size(64);
  spec->mutable_model()->set_num_attention_heads(4);
  spec->mutable_model()->set_vocab_size(1000);
  spec->mutable_search()->set_backend("megatron");
  coordinator_.Push(a);
  ASSERT_TRUE(WaitUntil([&] { return coordinator_.NumReports() == 1; }, 20));
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  const v1::TrialResult& r = coordinator_.reports[0].result();
  EXPECT_EQ(r.status(), v1::TRIAL_STATUS_OK) << r.message();
  EXPECT_EQ(r.policy().canonical(), "full:uniform:1");
  ASSERT_EQ(r.ranks_size(), 1);
  EXPECT_EQ(r.ranks(0).peak_allocated_bytes(), 2500u);  // the fake's 1000 per layer + 500
}

TEST_F(DaemonTest, AnUnreadableAssignmentIsAFailedReportUnderItsPolicy) {
  Start(1);
  v1::TrialAssignment a = Replay("t-2", 0);
  a.mutable_policy()->set_canonical("selective:[warp_drive]");  // only a foreign coordinator
  coordinator_.Push(a);
  ASSERT_TRUE(WaitUntil([&] { return coordinator_.NumReports() == 1; }));
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  const v1::TrialResult& r = coordinator_.reports[0].result();
  EXPECT_EQ(r.status(), v1::TRIAL_STATUS_FAILED);
  EXPECT_EQ(r.message().rfind("assignment: policy: ", 0), 0u) << r.message();
  EXPECT_EQ(r.policy().canonical(), "selective:[warp_drive]");
  EXPECT_EQ(coordinator_.reports[0].trial_id(), "t-2");
}

TEST_F(DaemonTest, HeartbeatCancelStopsTheTrial) {
  Start(1);
  coordinator_.Push(Replay("t-9", 600));
  ASSERT_TRUE(WaitUntil([&] { return daemon_->stats().running_trials == 1; }));
  {
    std::lock_guard<std::mutex> lock(coordinator_.mu);
    coordinator_.cancel_ids.push_back("t-9");
  }
  ASSERT_TRUE(WaitUntil([&] { return coordinator_.NumReports() == 1; }));
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  EXPECT_EQ(coordinator_.reports[0].result().status(), v1::TRIAL_STATUS_CANCELLED);
}

TEST_F(DaemonTest, SpoolsResultsWhileTheCoordinatorIsAwayAndRedeliversThem) {
  Start(1);
  ASSERT_TRUE(WaitUntil([&] { return daemon_->stats().registered; }));
  coordinator_.SetReportsDown(true);
  coordinator_.Push(Replay("t-1", 0.05));
  ASSERT_TRUE(WaitUntil([&] { return daemon_->stats().trials_finished == 1; }));
  EXPECT_EQ(coordinator_.NumReports(), 0u);
  EXPECT_EQ(daemon_->stats().spooled, 1);
  // The coordinator goes away altogether: the worker notices and re-registers when it is back.
  coordinator_.SetUp(false);
  ASSERT_TRUE(WaitUntil([&] { return !daemon_->stats().registered; }));
  coordinator_.SetReportsDown(false);
  coordinator_.SetUp(true);
  ASSERT_TRUE(WaitUntil([&] { return coordinator_.NumReports() == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return daemon_->stats().spooled == 0; }));
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  EXPECT_EQ(coordinator_.reports[0].trial_id(), "t-1");
  EXPECT_EQ(coordinator_.reports[0].result().status(), v1::TRIAL_STATUS_OK);
  EXPECT_GE(coordinator_.registrations, 2);
  EXPECT_EQ(coordinator_.last_registered_id, "w-1");  // re-registers under its old id
}

TEST_F(DaemonTest, ARestartedWorkerSendsWhatItsPredecessorSpooled) {
  ResultSpool spool(dir_ / "spool");
  ASSERT_TRUE(spool.Init().ok());
  v1::ReportTrialRequest old;
  old.set_worker_id("w-0");  // the predecessor's id: the lease the report answers
  old.set_trial_id("t-old");
  old.set_attempt(2);
  old.mutable_result()->set_status(v1::TRIAL_STATUS_OK);
  ASSERT_TRUE(spool.Put(old).ok());
  EXPECT_EQ(spool.List().size(), 1u);
  Start(1);
  ASSERT_TRUE(WaitUntil([&] { return coordinator_.NumReports() == 1; }));
  ASSERT_TRUE(WaitUntil([&] { return spool.List().empty(); }));
  std::lock_guard<std::mutex> lock(coordinator_.mu);
  EXPECT_EQ(coordinator_.reports[0].trial_id(), "t-old");
  EXPECT_EQ(coordinator_.reports[0].attempt(), 2);
  EXPECT_EQ(coordinator_.reports[0].worker_id(), "w-0");
}

// A SIGKILLed worker's trial ran on beside its re-run and its folder stayed for ever.
// A restarted worker ends the group its predecessor recorded and removes the stale folders.
TEST_F(DaemonTest, ARestartedWorkerEndsTheTrialProcessesItsPredecessorLeft) {
  const std::string orphan_dir = dir_ / "trials/t-old.1";
  const std::string stale_dir = dir_ / "trials/t-older.2";
  std::filesystem::create_directories(orphan_dir);
  std::filesystem::create_directories(stale_dir);
  WriteText(stale_dir + "/stderr-0.log", "left behind");
  const pid_t orphan = fork();
  ASSERT_GE(orphan, 0);
  if (orphan == 0) {
    setpgid(0, 0);
    execl("/bin/sleep", "sleep", "300", static_cast<char*>(nullptr));
    _exit(127);
  }
  setpgid(orphan, orphan);  // either side may win the race; both ask for the same group
  ASSERT_TRUE(WaitUntil([&] { return ProcessStartTime(orphan) != 0; }));
  ASSERT_TRUE(WriteGroupRecord(orphan_dir + "/" + kGroupRecordFile, orphan, orphan));

  Start(1);
  int status = 0;
  ASSERT_TRUE(WaitUntil([&] { return waitpid(orphan, &status, WNOHANG) == orphan; }));
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  EXPECT_TRUE(WaitUntil([&] {
    return !std::filesystem::exists(orphan_dir) && !std::filesystem::exists(stale_dir);
  }));
}

TEST_F(DaemonTest, RefusedCredentialsEndRunWithTheError) {
  {
    std::lock_guard<std::mutex> lock(coordinator_.mu);
    coordinator_.refuse_credentials = true;
  }
  Start(1);
  thread_.join();
  EXPECT_EQ(run_status_.code(), absl::StatusCode::kUnauthenticated);
  daemon_.reset();
}

TEST_F(DaemonTest, StopKillsRunningTrialsWithoutReportingThem) {
  Start(1);
  coordinator_.Push(Replay("t-1", 600));
  ASSERT_TRUE(WaitUntil([&] { return daemon_->stats().running_trials == 1; }));
  const auto t0 = std::chrono::steady_clock::now();
  StopDaemon();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5);
  EXPECT_EQ(coordinator_.NumReports(), 0u);
  EXPECT_TRUE(run_status_.ok());
}

TEST(WorkerDaemonCreate, RefusesBadOptions) {
  WorkerDaemonOptions options;
  options.work_dir = "/tmp";
  options.connection.target = "127.0.0.1:1";
  EXPECT_EQ(WorkerDaemon::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.slots = PlainSlots(1);
  options.work_dir = "";
  EXPECT_EQ(WorkerDaemon::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ResultSpool, PutListRemove) {
  TempDir dir;
  ResultSpool spool(dir / "spool");
  ASSERT_TRUE(spool.Init().ok());
  v1::ReportTrialRequest a, b;
  a.set_trial_id("t-a");
  a.set_attempt(1);
  b.set_trial_id("../../etc/passwd");  // ids never escape the spool folder
  b.set_attempt(1);
  ASSERT_TRUE(spool.Put(a).ok());
  ASSERT_TRUE(spool.Put(b).ok());
  ASSERT_TRUE(spool.Put(a).ok());  // same attempt twice: one file
  EXPECT_EQ(spool.List().size(), 2u);
  EXPECT_TRUE(std::filesystem::exists(dir / "spool/______etc_passwd.1.report"));
  spool.Remove(a);
  ASSERT_EQ(spool.List().size(), 1u);
  EXPECT_EQ(spool.List()[0].trial_id(), "../../etc/passwd");
}

}  // namespace
}  // namespace remat::worker
