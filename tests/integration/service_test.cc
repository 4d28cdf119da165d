// rematd + remat-worker + remat as real processes on loopback (replay backend, fast wall_s):
// concurrent searches, a coordinator killed and restarted, a worker killed mid-trial, cancel,
// auth refusals, and the metrics page checked by promtool.
#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "search/planner.h"
#include "search/rules.h"
#include "tests/integration/harness.h"
#include "worker/process_runner.h"

namespace remat::integration {
namespace {

using nlohmann::json;

std::vector<std::string> Policies(const json& search) {
  std::vector<std::string> out;
  for (const auto& t : search["trials"]) out.push_back(t["policy"]);
  return out;
}

std::vector<std::string> AllValidPolicies() {
  std::vector<std::string> out;
  for (const auto& p : search::EnumerateValidPolicies(TestModel())) out.push_back(p.ToString());
  return out;
}

// Every policy recorded exactly once, every trial final; an exhaustive search ran them all.
void ExpectEachPolicyOnce(const json& search, bool exhaustive = true) {
  std::vector<std::string> ran = Policies(search);
  std::set<std::string> unique(ran.begin(), ran.end());
  EXPECT_EQ(unique.size(), ran.size()) << "a policy was recorded twice: " << search.dump();
  if (exhaustive) {
    std::vector<std::string> all = AllValidPolicies();
    EXPECT_EQ(unique, std::set<std::string>(all.begin(), all.end()));
  }
  for (const auto& t : search["trials"]) {
    const std::string s = t["status"];
    EXPECT_TRUE(s == "ok" || s == "oom" || s == "failed") << t.dump();
  }
}

void ExpectCorrectFrontier(const json& search, const json& table, double budget_gib = 10) {
  const std::vector<std::string> expected = ExpectedFrontier(table, Policies(search), budget_gib);
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(search["frontier"].get<std::vector<std::string>>(), expected) << search.dump();
  // The recommendation is the frontier's fastest point: the last one (memory ascending).
  EXPECT_EQ(search["recommendation"], expected.back());
}

class ServiceTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_.LogTails();
  }
  Cluster cluster_;
};

TEST_F(ServiceTest, TwoWorkersRunThreeSearchesAtOnce) {
  cluster_.StartCoordinator();
  cluster_.StartWorker(2);
  cluster_.StartWorker(2);
  std::vector<json> tables;
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    tables.push_back(MakeReplayTable(/*seed=*/i + 1, /*wall_s=*/0.25, /*missing=*/i));
    ids.push_back(cluster_.Submit(cluster_.WriteReplaySpec("s" + std::to_string(i), tables[i])));
  }
  std::set<std::string> workers;
  for (int i = 0; i < 3; ++i) {
    json result = cluster_.WaitFinal(ids[i], 90);
    ASSERT_EQ(result["state"], "succeeded") << result.dump();
    ExpectEachPolicyOnce(result);
    ExpectCorrectFrontier(result, tables[i]);
    for (const auto& t : result["trials"]) workers.insert(t["worker_id"].get<std::string>());
    // Policies missing from the table fail as such, never guessed.
    int missing = 0;
    for (const auto& t : result["trials"]) missing += t["message"] == "not in replay table";
    EXPECT_EQ(missing, i);
  }
  EXPECT_EQ(workers.size(), 2u) << "both workers should have run trials";
}

TEST_F(ServiceTest, CoordinatorKilledMidSearchResumesEverySearch) {
  Daemon* coordinator = cluster_.StartCoordinator();
  cluster_.StartWorker(2);
  cluster_.StartWorker(2);
  std::vector<json> tables;
  std::vector<std::string> ids;
  for (int i = 0; i < 2; ++i) {
    tables.push_back(MakeReplayTable(/*seed=*/10 + i, /*wall_s=*/0.8));
    ids.push_back(cluster_.Submit(cluster_.WriteReplaySpec("k" + std::to_string(i), tables[i])));
  }
  // Kill it once trials have been recorded but the searches are not done.
  json mid = cluster_.WaitFor(ids[0], [](const json& j) {
    return j["trials_done"].get<int>() >= 2 && j["state"] == "running";
  });
  coordinator->Kill(SIGKILL);
  EXPECT_EQ(coordinator->Wait(10), 128 + SIGKILL);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // workers finish trials meanwhile
  cluster_.StartCoordinator();
  for (int i = 0; i < 2; ++i) {
    json result = cluster_.WaitFinal(ids[i], 90);
    ASSERT_EQ(result["state"], "succeeded") << result.dump();
    ExpectEachPolicyOnce(result);
    ExpectCorrectFrontier(result, tables[i]);
  }
}

TEST_F(ServiceTest, TrialOfAKilledWorkerRunsAgainElsewhere) {
  cluster_.StartCoordinator();
  Daemon* first = cluster_.StartWorker(1);
  // The control takes 3 s, the rest a moment: the worker dies while running the control.
  json table = MakeReplayTable(/*seed=*/20, /*wall_s=*/0.05);
  table["trials"]["selective:[]"]["wall_s"] = 3.0;
  const std::string id = cluster_.Submit(cluster_.WriteReplaySpec("w", table));
  std::string victim_trial, victim_worker;
  cluster_.WaitFor(id, [&](const json& j) {
    for (const auto& t : j["trials"]) {
      if (t["policy"] == "selective:[]" && t["status"] == "running" &&
          !t["worker_id"].get<std::string>().empty()) {
        victim_trial = t["id"];
        victim_worker = t["worker_id"];
        return true;
      }
    }
    return false;
  });
  ASSERT_FALSE(victim_trial.empty());
  first->Kill(SIGKILL);
  first->Wait(10);
  cluster_.StartWorker(1);
  json result = cluster_.WaitFinal(id, 90);
  ASSERT_EQ(result["state"], "succeeded") << result.dump();
  ExpectEachPolicyOnce(result);
  ExpectCorrectFrontier(result, table);
  bool found = false;
  for (const auto& t : result["trials"]) {
    if (t["id"] != victim_trial) continue;
    found = true;
    EXPECT_GE(t["attempts"].get<int>(), 2) << t.dump();
    EXPECT_NE(t["worker_id"], victim_worker) << t.dump();
    EXPECT_NE(t["status"], "failed") << t.dump();
  }
  EXPECT_TRUE(found);
}

TEST_F(ServiceTest, CancelledSearchStopsItsTrials) {
  cluster_.StartCoordinator();
  cluster_.StartWorker(1);
  // Trials that would take ten minutes: only cancelling ends them.
  const std::string slow = cluster_.Submit(
      cluster_.WriteReplaySpec("slow", MakeReplayTable(/*seed=*/30, /*wall_s=*/600)));
  cluster_.WaitFor(slow, [](const json& j) {
    for (const auto& t : j["trials"]) {
      if (t["status"] == "running") return true;
    }
    return false;
  });
  CommandResult cancel = cluster_.Remat({"cancel", slow});
  EXPECT_EQ(cancel.exit_code, 0) << cancel.err;
  json cancelled = cluster_.WaitFinal(slow, 30);
  EXPECT_EQ(cancelled["state"], "cancelled");
  for (const auto& t : cancelled["trials"]) {
    EXPECT_NE(t["status"], "ok") << t.dump();
    EXPECT_NE(t["status"], "running") << t.dump();
  }
  // The worker's only slot is free again: a quick search now runs to the end.
  json table = MakeReplayTable(/*seed=*/31, /*wall_s=*/0.02);
  const std::string quick = cluster_.Submit(cluster_.WriteReplaySpec("quick", table));
  json result = cluster_.WaitFinal(quick, 60);
  EXPECT_EQ(result["state"], "succeeded") << result.dump();
  ExpectCorrectFrontier(result, table);
}

TEST_F(ServiceTest, AuthRefusals) {
  const std::string users = cluster_.dir() + "/users.tokens";
  const std::string workers = cluster_.dir() + "/workers.tokens";
  std::ofstream(users) << "# user tokens\nalice-secret alice\nbob-secret bob\n";
  std::ofstream(workers) << "worker-secret node1\n";
  auto token_file = [&](const std::string& name, const std::string& token) {
    const std::string path = cluster_.dir() + "/" + name;
    std::ofstream(path) << token << "\n";
    return path;
  };
  const std::string alice = token_file("alice", "alice-secret");
  const std::string bob = token_file("bob", "bob-secret");
  const std::string wrong = token_file("wrong", "not-a-token");
  const std::string worker_token = token_file("worker", "worker-secret");
  cluster_.StartCoordinator({"--user-tokens", users, "--worker-tokens", workers});

  CommandResult none = cluster_.Remat({"list"});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_EQ(none.err.rfind("error: coordinator at " + cluster_.address() +
                               " refused the request: unauthenticated",
                           0),
            0u)
      << none.err;
  EXPECT_EQ(std::count(none.err.begin(), none.err.end(), '\n'), 1);
  CommandResult bad = cluster_.Remat({"list", "--token-file", wrong});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("unauthenticated"), std::string::npos) << bad.err;
  CommandResult as_worker = cluster_.Remat({"list", "--token-file", worker_token});
  EXPECT_EQ(as_worker.exit_code, 1);
  EXPECT_NE(as_worker.err.find("permission denied"), std::string::npos) << as_worker.err;

  // A worker with a user's token is refused and exits; one with its own token serves.
  Daemon* impostor = cluster_.StartWorker(1, {"--token-file", alice});
  EXPECT_EQ(impostor->Wait(30), 1);
  cluster_.StartWorker(1, {"--token-file", worker_token});

  json table = MakeReplayTable(/*seed=*/40, /*wall_s=*/0.02);
  const std::string id =
      cluster_.Submit(cluster_.WriteReplaySpec("auth", table), {"--token-file", alice});
  ASSERT_FALSE(id.empty());
  // Bob neither sees nor cancels Alice's search.
  CommandResult bob_get = cluster_.Remat({"get", id, "--token-file", bob});
  EXPECT_NE(bob_get.exit_code, 0);
  EXPECT_EQ(bob_get.err.rfind("error: ", 0), 0u);
  CommandResult bob_cancel = cluster_.Remat({"cancel", id, "--token-file", bob});
  EXPECT_NE(bob_cancel.exit_code, 0);
  CommandResult bob_list = cluster_.Remat({"list", "--token-file", bob});
  EXPECT_EQ(bob_list.exit_code, 0);
  EXPECT_EQ(bob_list.out.find(id), std::string::npos) << bob_list.out;
  CommandResult alice_list = cluster_.Remat({"list", "--token-file", alice});
  EXPECT_NE(alice_list.out.find(id), std::string::npos) << alice_list.out;

  json result = cluster_.WaitFinal(id, 60, {"--token-file", alice});
  EXPECT_EQ(result["state"], "succeeded");
  ExpectCorrectFrontier(result, table);
}

TEST_F(ServiceTest, TlsForClientsAndWorkers) {
  if (access("/usr/bin/openssl", X_OK) != 0) GTEST_SKIP() << "openssl not installed";
  const std::string cert = cluster_.dir() + "/cert.pem", key = cluster_.dir() + "/key.pem";
  worker::ChildSpec gen;
  gen.argv = {"/usr/bin/openssl",
              "req",
              "-x509",
              "-newkey",
              "rsa:2048",
              "-nodes",
              "-keyout",
              key,
              "-out",
              cert,
              "-days",
              "1",
              "-subj",
              "/CN=localhost",
              "-addext",
              "subjectAltName=IP:127.0.0.1,DNS:localhost"};
  worker::GroupLimits limits;
  limits.timeout_s = 60;
  ASSERT_TRUE(worker::RunProcessGroup({gen}, limits, nullptr).children[0].ok());
  cluster_.StartCoordinator({"--tls-cert", cert, "--tls-key", key});
  cluster_.StartWorker(2, {"--tls-ca", cert});
  // A plaintext client cannot talk to a TLS coordinator: one readable line, exit 1.
  CommandResult plain = cluster_.Remat({"list"});
  EXPECT_EQ(plain.exit_code, 1);
  EXPECT_EQ(plain.err.rfind("error: ", 0), 0u) << plain.err;
  json table = MakeReplayTable(/*seed=*/70, /*wall_s=*/0.02);
  const std::string id =
      cluster_.Submit(cluster_.WriteReplaySpec("tls", table), {"--tls-ca", cert});
  json result = cluster_.WaitFinal(id, 60, {"--tls-ca", cert});
  EXPECT_EQ(result["state"], "succeeded") << result.dump();
  ExpectCorrectFrontier(result, table);
}

// The same guided spec submitted twice, the second while the first's trials are in
// flight, gives the same trials and the same answer: the second search joins the first's running
// trials and takes its cached results without getting ahead of what the first knew when it chose.
// Each round: one worker with `slots` slots, the second submit after `head_start` trials of the
// first are done (0: at once, so the second's trials join the first's running ones).
TEST_F(ServiceTest, IdenticalSearchesGiveIdenticalAnswersWhateverTheirTiming) {
  cluster_.StartCoordinator();
  struct Round {
    int slots;
    int head_start;
  };
  const Round rounds[] = {{1, 0}, {1, 3}, {2, 2}, {2, 0}};
  int n = 0;
  for (const Round& round : rounds) {
    SCOPED_TRACE("slots " + std::to_string(round.slots) + ", head start " +
                 std::to_string(round.head_start));
    Daemon* worker = cluster_.StartWorker(round.slots);
    const json table = MakeReplayTable(/*seed=*/60 + n, /*wall_s=*/0.3);
    const std::string spec = cluster_.WriteReplaySpec("same" + std::to_string(n++), table,
                                                      "guided", /*budget_gib=*/8);
    const std::string first = cluster_.Submit(spec);
    cluster_.WaitFor(first, [&](const json& j) {
      return j["trials_done"].get<int>() >= round.head_start;
    });
    const std::string second = cluster_.Submit(spec);
    const json a = cluster_.WaitFinal(first, 90);
    const json b = cluster_.WaitFinal(second, 90);
    ASSERT_EQ(a["state"], "succeeded") << a.dump();
    ASSERT_EQ(b["state"], "succeeded") << b.dump();
    std::vector<std::string> pa = Policies(a), pb = Policies(b);
    EXPECT_EQ(pa.size(), pb.size()) << a.dump() << "\n" << b.dump();
    EXPECT_EQ(std::set<std::string>(pa.begin(), pa.end()),
              std::set<std::string>(pb.begin(), pb.end()));
    EXPECT_EQ(a["frontier"], b["frontier"]);
    EXPECT_EQ(a["recommendation"], b["recommendation"]);
    // Each policy measured once between the two: the other search's trial joined it while it
    // ran, or took its result from the cache after (re-measures of near-ties excepted).
    std::map<std::string, int> measured;
    for (const json* j : {&a, &b}) {
      for (const auto& t : (*j)["trials"]) {
        if (!t["remeasure"].get<bool>() && !t["reused"].get<bool>()) ++measured[t["policy"]];
      }
    }
    for (const std::string& p : pa) EXPECT_EQ(measured[p], 1) << p << "\n" << a.dump() << "\n" << b.dump();
    worker->Kill(SIGTERM);
    worker->Wait(10);
  }
}

TEST_F(ServiceTest, PromtoolAcceptsTheMetricsPage) {
  if (access("/usr/bin/promtool", X_OK) != 0 && access("/usr/local/bin/promtool", X_OK) != 0) {
    GTEST_SKIP() << "promtool not installed (Debian package prometheus)";
  }
  const int metrics_port = FreePort();
  cluster_.StartCoordinator({"--metrics-listen", "127.0.0.1:" + std::to_string(metrics_port)});
  cluster_.StartWorker(2);
  json table = MakeReplayTable(/*seed=*/50, /*wall_s=*/0.02);
  const std::string id = cluster_.Submit(cluster_.WriteReplaySpec("metrics", table));
  cluster_.WaitFinal(id, 60);
  const std::string page = HttpGet(metrics_port, "/metrics");
  ASSERT_NE(page.find("remat_"), std::string::npos) << page;
  const std::string path = cluster_.dir() + "/metrics.txt";
  std::ofstream(path) << page;
  worker::ChildSpec check;
  check.argv = {"/bin/sh", "-c", "promtool check metrics < '" + path + "'"};
  check.stdout_path = cluster_.dir() + "/promtool.out";
  check.stderr_path = cluster_.dir() + "/promtool.err";
  worker::GroupLimits limits;
  limits.timeout_s = 60;
  worker::GroupOutcome o = worker::RunProcessGroup({check}, limits, nullptr);
  EXPECT_TRUE(o.children[0].ok()) << o.children[0].Describe() << "\n"
                                  << worker::FileTail(check.stdout_path, 40, 8000) << "\n"
                                  << worker::FileTail(check.stderr_path, 40, 8000);
}

}  // namespace
}  // namespace remat::integration
