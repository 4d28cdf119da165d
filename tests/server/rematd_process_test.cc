// rematd as a process: flag errors (exit 2), SIGTERM drains (exit 0), and a coordinator killed
// with SIGKILL mid-search and restarted on the same database finishes the search with every
// policy recorded exactly once.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "remat/v1/remat.grpc.pb.h"
#include "search/rules.h"
#include "tests/server/test_util.h"

namespace remat::server {
namespace {

using testing::Entry;
using testing::SmallSpec;
using testing::Submit;
using testing::Worker;

// A child process with its stdout and stderr captured in files.
class Process {
 public:
  Process(const std::vector<std::string>& args, const std::string& dir) {
    out_path_ = dir + "/stdout." + std::to_string(counter_);
    err_path_ = dir + "/stderr." + std::to_string(counter_++);
    pid_ = fork();
    if (pid_ == 0) {
      int out = open(out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int err = open(err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(out, 1);
      dup2(err, 2);
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
  }
  ~Process() {
    if (pid_ > 0 && !exited_) {
      kill(pid_, SIGKILL);
      Wait();
    }
  }

  // Exit status, or -signal.
  int Wait() {
    int status = 0;
    waitpid(pid_, &status, 0);
    exited_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  void Signal(int sig) { kill(pid_, sig); }
  std::string Stdout() const { return Read(out_path_); }
  std::string Stderr() const { return Read(err_path_); }

  // Waits for "rematd listening on ADDR" and returns ADDR.
  std::string WaitForAddress() const {
    for (int i = 0; i < 200; ++i) {
      const std::string out = Stdout();
      const std::string marker = "rematd listening on ";
      if (auto at = out.find(marker); at != std::string::npos) {
        auto end = out.find('\n', at);
        if (end != std::string::npos) return out.substr(at + marker.size(), end - at - marker.size());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return "";
  }

 private:
  static std::string Read(const std::string& path) {
    FILE* f = fopen(path.c_str(), "r");
    if (f == nullptr) return "";
    std::string s;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
    fclose(f);
    return s;
  }

  static inline int counter_ = 0;
  pid_t pid_ = -1;
  bool exited_ = false;
  std::string out_path_, err_path_;
};

class RematdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/remat-rematd-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

std::unique_ptr<grpc::ClientContext> Ctx() {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  return ctx;
}

// Exit 2 is what rematd.service's RestartPreventExitStatus names: bad configuration (a missing
// or empty token file included) must not put the unit into a restart loop.
TEST_F(RematdTest, BadFlagsExitTwoWithAnErrorLine) {
  const std::string empty = dir_ + "/empty.tokens";
  FILE* f = fopen(empty.c_str(), "w");
  fputs("# no tokens yet\n", f);
  fclose(f);
  for (const auto& args : std::vector<std::vector<std::string>>{
           {REMATD_PATH, "--bogus"},
           {REMATD_PATH, "--db", dir_ + "/x.db"},  // --listen missing
           {REMATD_PATH, "--listen", "nowhere", "--db", dir_ + "/x.db"},
           {REMATD_PATH, "--listen", "127.0.0.1:0", "--db", dir_ + "/x.db", "--max-attempts",
            "0"},
           {REMATD_PATH, "--listen", "127.0.0.1:0", "--db", dir_ + "/x.db", "--user-tokens",
            dir_ + "/missing"},
           {REMATD_PATH, "--listen", "127.0.0.1:0", "--db", dir_ + "/x.db", "--user-tokens",
            empty},
           {REMATD_PATH, "--listen", "127.0.0.1:0", "--db", dir_ + "/x.db", "--worker-tokens",
            empty},
           {REMATD_PATH, "--listen", "127.0.0.1:0", "--db", dir_ + "/x.db", "--log-level",
            "loud"}}) {
    Process p(args, dir_);
    EXPECT_EQ(p.Wait(), 2) << args.back();
    const std::string err = p.Stderr();
    EXPECT_EQ(err.rfind("error: ", 0), 0u) << err;
    EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
  }
}

TEST_F(RematdTest, SigtermDrainsAndExitsZero) {
  Process p({REMATD_PATH, "--listen", "127.0.0.1:0", "--db", dir_ + "/remat.db"}, dir_);
  ASSERT_FALSE(p.WaitForAddress().empty()) << p.Stderr();
  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(), 0) << p.Stderr();
  EXPECT_NE(p.Stderr().find("shutting down"), std::string::npos) << p.Stderr();
}

// The log names the address as bound (0.0.0.0 stays 0.0.0.0; the stdout line is what a local
// client dials), and a database that cannot be written is refused at start, not change by change.
TEST_F(RematdTest, LogsTheBoundAddressAndRefusesAReadOnlyDatabase) {
  {
    Process p({REMATD_PATH, "--listen", "0.0.0.0:0", "--db", dir_ + "/remat.db"}, dir_);
    const std::string address = p.WaitForAddress();
    ASSERT_FALSE(address.empty()) << p.Stderr();
    const std::string port = address.substr(address.rfind(':') + 1);
    bool logged = false;
    for (int i = 0; i < 100 && !logged; ++i) {
      logged = p.Stderr().find("listening on 0.0.0.0:" + port + " ") != std::string::npos;
      if (!logged) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(logged) << p.Stderr();
    p.Signal(SIGTERM);
    EXPECT_EQ(p.Wait(), 0) << p.Stderr();
  }
  // A read-only URI stands for a read-only file, folder or mount (which root would not feel).
  Process p({REMATD_PATH, "--listen", "127.0.0.1:0", "--db",
             "file:" + dir_ + "/remat.db?mode=ro"},
            dir_);
  EXPECT_EQ(p.Wait(), 1) << p.Stderr();
  EXPECT_NE(p.Stderr().find("cannot be written"), std::string::npos) << p.Stderr();
  EXPECT_EQ(p.Stdout().find("listening"), std::string::npos) << p.Stdout();
}

// SIGHUP reads the token files again (systemctl reload): rematd keeps serving, a new token works
// at once and a removed one is refused; a broken file is logged and changes nothing. Before,
// SIGHUP ended rematd with status 129 and no drain.
TEST_F(RematdTest, SighupReloadsTheTokenFilesAndKeepsServing) {
  const std::string users = dir_ + "/users.tokens";
  auto write = [&](const char* text) {
    FILE* f = fopen(users.c_str(), "w");
    fputs(text, f);
    fclose(f);
  };
  write("old-token alice\n");
  Process p({REMATD_PATH, "--listen", "127.0.0.1:0", "--db", dir_ + "/remat.db", "--user-tokens",
             users, "--drain", "1"},
            dir_);
  const std::string address = p.WaitForAddress();
  ASSERT_FALSE(address.empty()) << p.Stderr();
  auto stub = v1::RematService::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  auto list = [&](const std::string& token) {
    auto ctx = Ctx();
    ctx->AddMetadata("authorization", "Bearer " + token);
    v1::ListSearchesResponse r;
    return stub->ListSearches(ctx.get(), {}, &r).error_code();
  };
  ASSERT_EQ(list("old-token"), grpc::StatusCode::OK);
  ASSERT_EQ(list("new-token"), grpc::StatusCode::UNAUTHENTICATED);
  auto wait_for_log = [&](const std::string& text) {
    for (int i = 0; i < 100 && p.Stderr().find(text) == std::string::npos; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return p.Stderr().find(text) != std::string::npos;
  };

  write("new-token alice\n");
  p.Signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("token files read again: 1 user and 0 worker tokens")) << p.Stderr();
  EXPECT_EQ(list("new-token"), grpc::StatusCode::OK);
  EXPECT_EQ(list("old-token"), grpc::StatusCode::UNAUTHENTICATED);

  write("");
  p.Signal(SIGHUP);
  ASSERT_TRUE(wait_for_log("holds no tokens; keeping the 1 user and 0 worker tokens in use"))
      << p.Stderr();
  EXPECT_EQ(list("new-token"), grpc::StatusCode::OK);

  p.Signal(SIGTERM);
  EXPECT_EQ(p.Wait(), 0) << p.Stderr();
  EXPECT_NE(p.Stderr().find("shutting down"), std::string::npos) << p.Stderr();
}

TEST_F(RematdTest, SigkilledCoordinatorResumesOnTheSameDatabase) {
  const std::string db = dir_ + "/remat.db";
  const std::vector<std::string> args = {REMATD_PATH, "--listen", "127.0.0.1:0", "--db", db,
                                         "--lease-timeout", "3", "--heartbeat-interval", "1"};
  search::SearchSpec spec = SmallSpec("killed");
  spec.search.strategy = search::StrategyKind::kExhaustive;
  spec.search.max_trials = 100;
  std::map<std::string, v1::ReplayEntry> table;
  double gib = 10;
  for (const auto& p : search::EnumerateValidPolicies(spec)) {
    gib += 2;
    table[p.ToString()] = Entry(gib, 1 / gib);
  }
  ASSERT_GE(table.size(), 6u);

  std::string id, worker_id;
  std::vector<v1::TrialAssignment> unreported;
  {
    auto first = std::make_unique<Process>(args, dir_);
    const std::string addr = first->WaitForAddress();
    ASSERT_FALSE(addr.empty()) << first->Stderr();
    auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
    auto users = v1::RematService::NewStub(channel);
    auto workers = v1::WorkerService::NewStub(channel);
    v1::SubmitSearchResponse submitted;
    ASSERT_TRUE(users->SubmitSearch(Ctx().get(), Submit(spec, table), &submitted).ok());
    id = submitted.id();
    v1::RegisterResponse reg;
    ASSERT_TRUE(workers->Register(Ctx().get(), Worker(2), &reg).ok());
    worker_id = reg.worker_id();
    // Two results reported, two leases outstanding; then SIGKILL.
    for (int i = 0; i < 2; ++i) {
      v1::LeaseTrialRequest lease;
      lease.set_worker_id(worker_id);
      lease.set_free_slots(2);
      v1::LeaseTrialResponse got;
      ASSERT_TRUE(workers->LeaseTrial(Ctx().get(), lease, &got).ok());
      ASSERT_EQ(got.trials_size(), 2);
      if (i == 0) {
        for (const auto& a : got.trials()) {
          v1::ReportTrialRequest r;
          r.set_worker_id(worker_id);
          r.set_trial_id(a.trial_id());
          r.set_attempt(a.attempt());
          *r.mutable_result() = a.replay().result();
          v1::ReportTrialResponse ack;
          ASSERT_TRUE(workers->ReportTrial(Ctx().get(), r, &ack).ok());
        }
      } else {
        unreported.assign(got.trials().begin(), got.trials().end());
      }
    }
    first->Signal(SIGKILL);
    EXPECT_EQ(first->Wait(), -SIGKILL);
  }

  Process second(args, dir_);
  const std::string addr = second.WaitForAddress();
  ASSERT_FALSE(addr.empty()) << second.Stderr();
  auto channel = grpc::CreateChannel(addr, grpc::InsecureChannelCredentials());
  auto users = v1::RematService::NewStub(channel);
  auto workers = v1::WorkerService::NewStub(channel);
  // The worker delivers one of its outstanding results; the other one it lost with its process.
  {
    v1::ReportTrialRequest r;
    r.set_worker_id(worker_id);
    r.set_trial_id(unreported[0].trial_id());
    r.set_attempt(unreported[0].attempt());
    *r.mutable_result() = unreported[0].replay().result();
    v1::ReportTrialResponse ack;
    ASSERT_TRUE(workers->ReportTrial(Ctx().get(), r, &ack).ok());
    EXPECT_TRUE(ack.accepted());
    ASSERT_TRUE(workers->ReportTrial(Ctx().get(), r, &ack).ok());
    EXPECT_FALSE(ack.accepted());
  }
  // A fresh worker runs the rest, including the lost trial once its lease expires.
  v1::RegisterResponse reg;
  ASSERT_TRUE(workers->Register(Ctx().get(), Worker(1), &reg).ok());
  v1::Search s;
  for (int rounds = 0; rounds < 100; ++rounds) {
    v1::GetSearchRequest get;
    get.set_id(id);
    ASSERT_TRUE(users->GetSearch(Ctx().get(), get, &s).ok());
    if (s.state() == v1::SEARCH_STATE_SUCCEEDED) break;
    v1::LeaseTrialRequest lease;
    lease.set_worker_id(reg.worker_id());
    lease.set_free_slots(1);
    lease.set_wait_s(1);
    v1::LeaseTrialResponse got;
    ASSERT_TRUE(workers->LeaseTrial(Ctx().get(), lease, &got).ok());
    for (const auto& a : got.trials()) {
      v1::ReportTrialRequest r;
      r.set_worker_id(reg.worker_id());
      r.set_trial_id(a.trial_id());
      r.set_attempt(a.attempt());
      *r.mutable_result() = a.replay().result();
      v1::ReportTrialResponse ack;
      ASSERT_TRUE(workers->ReportTrial(Ctx().get(), r, &ack).ok());
      EXPECT_TRUE(ack.accepted());
    }
  }
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED);
  std::set<std::string> policies;
  for (const auto& t : s.trials()) {
    EXPECT_TRUE(policies.insert(t.policy().canonical()).second) << "twice: " << t.policy().canonical();
    EXPECT_EQ(t.status(), v1::TRIAL_STATUS_OK);
    if (t.id() == unreported[1].trial_id()) {
      EXPECT_EQ(t.attempts(), 2);
    }
  }
  EXPECT_EQ(policies.size(), table.size());
  second.Signal(SIGTERM);
  EXPECT_EQ(second.Wait(), 0);
}

}  // namespace
}  // namespace remat::server
