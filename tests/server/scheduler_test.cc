// The scheduler without gRPC: a fake clock, scripted strategies and a fault-injecting store.
#include "server/scheduler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <future>
#include <optional>
#include <set>

#include "search/frontier.h"
#include "search/limits.h"
#include "search/rules.h"
#include "server/metrics.h"
#include "tests/server/test_util.h"

namespace remat::server {
namespace {

using testing::Entry;
using testing::FakeClock;
using testing::FaultyStore;
using testing::ListStrategy;
using testing::SmallSpec;
using testing::Submit;
using testing::Worker;

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override { Open(":memory:"); }

  void Open(const std::string& path) {
    sched_.reset();
    auto inner = OpenSqliteStore(path);
    ASSERT_TRUE(inner.ok()) << inner.status();
    store_ = std::make_unique<FaultyStore>(std::move(*inner));
    StartScheduler();
  }

  void StartScheduler() {
    SchedulerOptions o = options_;
    o.lease_timeout_s = 15;
    o.heartbeat_interval_s = 2;
    o.max_trial_attempts = 3;
    o.monotonic_ms = clock_.Fn();
    o.unix_ms = clock_.Fn();
    o.make_strategy = [this](const search::SearchSpec& spec) -> std::unique_ptr<search::Strategy> {
      if (on_plan_) on_plan_(spec.name);
      auto it = scripts_.find(spec.name);
      if (it != scripts_.end()) return std::make_unique<ListStrategy>(it->second);
      return search::MakeStrategy(spec);
    };
    sched_ = std::make_unique<Scheduler>(o, store_.get(), &metrics_);
    ASSERT_TRUE(sched_->Resume().ok());
  }

  // Submits a scripted search over `table`'s policies (in the table's order when `order` is
  // empty) and returns its id.
  std::string SubmitScripted(const std::string& name,
                             const std::map<std::string, v1::ReplayEntry>& table,
                             std::vector<std::string> order = {},
                             const Principal& who = Principal::Anonymous(),
                             std::optional<uint64_t> seed = std::nullopt) {
    if (order.empty()) {
      for (const auto& [p, e] : table) order.push_back(p);
    }
    scripts_[name] = order;
    // A seed of its own per search unless told, so the results cache does not join them.
    search::SearchSpec spec = SmallSpec(name);
    spec.train.seed = seed.value_or(1000 + scripts_.size());
    auto r = sched_->SubmitSearch(who, Submit(spec, table));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->id() : "";
  }

  std::string Register(int slots, const std::string& gpu = "NVIDIA H200") {
    auto r = sched_->Register(Worker(slots, gpu));
    EXPECT_TRUE(r.ok()) << r.status();
    return r->worker_id();
  }

  absl::StatusOr<v1::LeaseTrialResponse> LeaseNow(const std::string& worker, int free) {
    v1::LeaseTrialRequest req;
    req.set_worker_id(worker);
    req.set_free_slots(free);
    std::optional<absl::StatusOr<v1::LeaseTrialResponse>> got;
    sched_->LeaseTrial(req, [&](absl::StatusOr<v1::LeaseTrialResponse> r) { got = std::move(r); });
    EXPECT_TRUE(got.has_value()) << "a wait_s=0 lease must answer at once";
    return got.value_or(absl::InternalError("no answer"));
  }

  // Leases exactly one trial.
  v1::TrialAssignment LeaseOne(const std::string& worker, int free = 1) {
    auto r = LeaseNow(worker, free);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->trials_size(), 1);
    return r->trials_size() > 0 ? r->trials(0) : v1::TrialAssignment();
  }

  absl::StatusOr<bool> Report(const std::string& worker, const v1::TrialAssignment& a,
                              std::optional<v1::TrialResult> result = std::nullopt) {
    v1::ReportTrialRequest req;
    req.set_worker_id(worker);
    req.set_trial_id(a.trial_id());
    req.set_attempt(a.attempt());
    *req.mutable_result() = result ? *result : a.replay().result();
    auto r = sched_->ReportTrial(req);
    if (!r.ok()) return r.status();
    return r->accepted();
  }

  v1::Search Get(const std::string& id) {
    auto s = sched_->GetSearch(Principal::Anonymous(), id);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : v1::Search();
  }

  v1::Trial TrialOf(const v1::Search& s, const std::string& policy) {
    for (const auto& t : s.trials()) {
      if (t.policy().canonical() == policy) return t;
    }
    ADD_FAILURE() << "no trial for " << policy;
    return v1::Trial();
  }

  SchedulerOptions options_;  // what a test changes before StartScheduler
  FakeClock clock_;
  Metrics metrics_{"test"};
  std::unique_ptr<FaultyStore> store_;
  std::unique_ptr<Scheduler> sched_;
  std::map<std::string, std::vector<std::string>> scripts_;
  std::function<void(const std::string&)> on_plan_;  // called as a search is planned
};

const std::map<std::string, v1::ReplayEntry> kTable = {
    {"selective:[]", Entry(70, 0.50)},
    {"selective:[core_attn]", Entry(50, 0.52)},
    {"full:uniform:1", Entry(30, 0.70)},
    {"full:block:1", Entry(95, 0.40)},  // over the 80 GiB budget
};

TEST_F(SchedulerTest, RunsASearchToItsFrontier) {
  const std::string w = Register(2);
  const std::string id = SubmitScripted("s", kTable);
  EXPECT_EQ(Get(id).state(), v1::SEARCH_STATE_QUEUED);
  int leased = 0;
  while (true) {
    auto r = LeaseNow(w, 2);
    ASSERT_TRUE(r.ok());
    if (r->trials_size() == 0) break;
    for (const auto& a : r->trials()) {
      ++leased;
      EXPECT_EQ(a.search_id(), id);
      EXPECT_EQ(a.world_size(), 1);
      EXPECT_EQ(a.attempt(), 1);
      EXPECT_TRUE(a.replay_found());
      EXPECT_EQ(a.spec().model().num_layers(), 2);
      EXPECT_EQ(Get(id).state(), v1::SEARCH_STATE_RUNNING);
      ASSERT_TRUE(*Report(w, a));
    }
  }
  EXPECT_EQ(leased, 4);
  v1::Search s = Get(id);
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_EQ(s.trials_size(), 4);
  EXPECT_EQ(s.trials_done(), 4);
  // Frontier within 80 GiB: 30 GiB @ 0.70 s, 50 GiB @ 0.52 s, 70 GiB @ 0.50 s.
  ASSERT_EQ(s.frontier_size(), 3);
  EXPECT_EQ(s.frontier(0), "full:uniform:1");
  EXPECT_EQ(s.frontier(1), "selective:[core_attn]");
  EXPECT_EQ(s.frontier(2), "selective:[]");
  EXPECT_EQ(s.recommendation(), "selective:[]");
  EXPECT_EQ(s.apply().megatron_lm(), search::Policy::None().MegatronLmFlags());
  EXPECT_EQ(s.memory_budget_bytes(), 80ULL << 30);
}

TEST_F(SchedulerTest, NothingFitsStillSucceedsWithAMessage) {
  const std::string w = Register(1);
  const std::string id = SubmitScripted("s", {{"selective:[]", Entry(90, 0.5)},
                                              {"full:uniform:1", Entry(85, 0.7, /*oom=*/true)}});
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(*Report(w, LeaseOne(w)));
  v1::Search s = Get(id);
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_FALSE(s.has_recommendation());
  EXPECT_EQ(s.frontier_size(), 0);
  EXPECT_FALSE(s.message().empty());
}

TEST_F(SchedulerTest, MissingReplayEntryIsSentAsNotFound) {
  const std::string w = Register(2);
  std::map<std::string, v1::ReplayEntry> table = {{"selective:[]", Entry(10, 0.5)}};
  scripts_["s"] = {"selective:[]", "full:uniform:1"};
  auto id = sched_->SubmitSearch(Principal::Anonymous(), Submit(SmallSpec("s"), table));
  ASSERT_TRUE(id.ok());
  v1::TrialAssignment a = LeaseOne(w);
  EXPECT_TRUE(a.replay_found());
  v1::TrialAssignment b = LeaseOne(w);
  EXPECT_EQ(b.policy().canonical(), "full:uniform:1");
  EXPECT_FALSE(b.replay_found());
}

TEST_F(SchedulerTest, DuplicateReportsAreNotAcceptedTwice) {
  const std::string w = Register(1);
  const std::string id = SubmitScripted("s", kTable);
  v1::TrialAssignment a = LeaseOne(w);
  auto first = Report(w, a);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first);
  auto second = Report(w, a);
  ASSERT_TRUE(second.ok());  // not an error
  EXPECT_FALSE(*second);
  v1::TrialResult bad;
  bad.set_status(v1::TRIAL_STATUS_RUNNING);
  EXPECT_EQ(Report(w, a, bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Get(id).trials_done(), 1);
  // Unknown trials are dropped, not errors.
  v1::TrialAssignment unknown;
  unknown.set_trial_id("t-unknown");
  *unknown.mutable_replay() = Entry(1, 1);
  EXPECT_FALSE(*Report(w, unknown));
}

// A client other than our worker may send a message of any size: it is kept bounded, so no
// reply that carries the trial (GetSearch, watch, list) outgrows the transport.
TEST_F(SchedulerTest, ReportedMessagesAreBounded) {
  const std::string w = Register(1);
  const std::string id = SubmitScripted("s", kTable, {"selective:[]"});
  v1::TrialAssignment a = LeaseOne(w);
  v1::TrialResult result = a.replay().result();
  result.set_message(std::string(10 << 20, 'e'));
  ASSERT_TRUE(*Report(w, a, result));
  const std::string kept = TrialOf(Get(id), "selective:[]").result().message();
  EXPECT_LE(kept.size(), search::limits::kMaxTrialMessageBytes);
  EXPECT_EQ(kept.substr(0, 10), "eeeeeeeeee");
}

TEST_F(SchedulerTest, ReportsAreValidatedBeforeTheyCount) {
  const std::string w = Register(1);
  const std::string id = SubmitScripted("s", kTable, {"selective:[]"});
  v1::TrialAssignment a = LeaseOne(w);
  const v1::TrialResult good = a.replay().result();
  const std::pair<std::function<void(v1::TrialResult&)>, std::string> bad[] = {
      {[](v1::TrialResult& r) { r.mutable_ranks(0)->set_rank(5); }, "result.ranks[0].rank:"},
      {[](v1::TrialResult& r) { r.add_ranks()->set_rank(0); }, "result.ranks: 2 ranks"},
      {[](v1::TrialResult& r) { r.set_tokens_per_s(-1); }, "result.tokens_per_s:"},
      {[](v1::TrialResult& r) { r.set_step_time_s(std::nan("")); }, "result.step_time_s:"},
      {[](v1::TrialResult& r) { r.mutable_ranks(0)->add_step_times_s(-0.5); },
       "result.ranks[0].step_times_s:"},
      // Out of the enum's range: not a final status, whatever the wire carries.
      {[](v1::TrialResult& r) { r.set_status(static_cast<v1::TrialStatus>(99)); },
       "result.status:"},
      {[](v1::TrialResult& r) { r.set_status(static_cast<v1::TrialStatus>(-1)); },
       "result.status:"},
      {[](v1::TrialResult& r) { r.set_status(static_cast<v1::TrialStatus>(INT32_MAX)); },
       "result.status:"},
      // A denormal step time would make tokens/s infinite.
      {[](v1::TrialResult& r) { r.set_step_time_s(1e-320); }, "result.step_time_s:"},
      {[](v1::TrialResult& r) { r.set_step_time_s(0); }, "result.step_time_s:"},
  };
  for (const auto& [edit, start] : bad) {
    v1::TrialResult r = good;
    edit(r);
    auto st = Report(w, a, r);
    ASSERT_FALSE(st.ok()) << start;
    EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(std::string(st.status().message()).rfind(start, 0), 0u) << st.status().message();
  }
  EXPECT_EQ(Get(id).trials_done(), 0);
  ASSERT_TRUE(*Report(w, a, good));
  EXPECT_EQ(Get(id).trials_done(), 1);
}

// A report refused for what it says is dropped by the worker; the trial then loses its lease,
// and the reason reaches the trial's message (not only the worker's log).
TEST_F(SchedulerTest, ARefusedReportsReasonReachesTheSearch) {
  const std::string id = SubmitScripted("s", kTable, {"selective:[]", "full:uniform:1"});
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const std::string w = Register(1);
    v1::TrialAssignment a = LeaseOne(w);
    v1::TrialResult r = a.replay().result();
    r.add_ranks()->set_rank(0);  // two results for rank 0
    ASSERT_EQ(Report(w, a, r).status().code(), absl::StatusCode::kInvalidArgument);
    clock_.Advance(16);
    sched_->Tick();
  }
  v1::Trial t = TrialOf(Get(id), "selective:[]");
  EXPECT_EQ(t.status(), v1::TRIAL_STATUS_FAILED);
  EXPECT_NE(t.result().message().find("its report was refused: result.ranks"), std::string::npos)
      << t.result().message();
}

TEST_F(SchedulerTest, ReplayTablesAreValidatedAtSubmit) {
  std::map<std::string, v1::ReplayEntry> table = kTable;
  table["selective:[]"].mutable_result()->set_status(v1::TRIAL_STATUS_RUNNING);
  auto r = sched_->SubmitSearch(Principal::Anonymous(), Submit(SmallSpec("t"), table));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("replay_table[selective:[]].result.status"),
            std::string::npos) << r.status().message();
  // Entries no worker could deliver as a report are refused here, naming the field: a status
  // out of the enum's range, two results for one rank, a rank outside this search's world, a
  // denormal step time.
  const std::pair<std::function<void(v1::TrialResult&)>, std::string> undeliverable[] = {
      {[](v1::TrialResult& r) { r.set_status(static_cast<v1::TrialStatus>(99)); }, ".status"},
      {[](v1::TrialResult& r) { r.add_ranks()->set_rank(0); }, ".ranks"},
      {[](v1::TrialResult& r) { r.mutable_ranks(0)->set_rank(1); }, ".ranks[0].rank"},
      {[](v1::TrialResult& r) { r.set_step_time_s(1e-320); }, ".step_time_s"},
      {[](v1::TrialResult& r) { r.mutable_ranks(0)->set_step_time_s(1e-320); },
       ".ranks[0].step_time_s"},
  };
  for (const auto& [edit, field] : undeliverable) {
    table = kTable;
    edit(*table["selective:[]"].mutable_result());
    r = sched_->SubmitSearch(Principal::Anonymous(), Submit(SmallSpec("t"), table));
    ASSERT_FALSE(r.ok()) << field;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("replay_table[selective:[]].result" + field),
              std::string::npos)
        << r.status().message();
  }
  table = kTable;
  table["selective:[]"].set_wall_s(-1);
  r = sched_->SubmitSearch(Principal::Anonymous(), Submit(SmallSpec("t"), table));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("wall_s"), std::string::npos) << r.status().message();
}

// One user cannot fill the coordinator with searches or trials; others still submit.
TEST_F(SchedulerTest, PerUserLimitsOnSearchesAndTrials) {
  options_.max_searches_per_user = 2;
  options_.max_trials_per_user = 6;
  StartScheduler();
  const Principal alice = Principal::User("alice");
  const Principal bob = Principal::User("bob");
  const std::map<std::string, v1::ReplayEntry> two = {{"selective:[]", Entry(70, 0.5)},
                                                      {"full:uniform:1", Entry(30, 0.7)}};
  SubmitScripted("a1", two, {}, alice);
  SubmitScripted("a2", two, {}, alice);
  scripts_["a3"] = {"selective:[]"};
  auto third = sched_->SubmitSearch(alice, Submit(SmallSpec("a3"), two));
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(third.status().message().find("--max-searches-per-user"), std::string::npos)
      << third.status().message();
  SubmitScripted("b1", two, {}, bob);  // bob is not alice
  scripts_["b2"] = {"selective:[]", "full:uniform:1", "full:block:1", "selective:[core_attn]",
                    "full:uniform:2"};
  auto many = sched_->SubmitSearch(bob, Submit(SmallSpec("b2"), kTable));
  ASSERT_FALSE(many.ok());  // 2 + 5 trials > 6
  EXPECT_EQ(many.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(many.status().message().find("--max-trials-per-user"), std::string::npos);
}

// A lease reply never outgrows the transport: a worker with many free slots gets the trials
// whose assignments fit limits::kMaxLeaseReplyBytes, the rest in its next lease.
TEST_F(SchedulerTest, LeaseRepliesStayUnderTheTransportLimit) {
  std::map<std::string, v1::ReplayEntry> table = kTable;
  for (auto& [policy, entry] : table) {
    entry.mutable_result()->set_status(v1::TRIAL_STATUS_FAILED);
    entry.mutable_result()->clear_ranks();
    // ~8 MiB per entry within a world of one rank: its steps, and four proxies' steps.
    auto fill = [](v1::RankResult* rank) {
      rank->set_rank(0);
      rank->set_step_time_s(0.5);
      for (int k = 0; k < 100000; ++k) rank->add_step_times_s(0.5);
      for (int k = 0; k < 100000; ++k) rank->add_warmup_step_times_s(0.5);
    };
    fill(entry.mutable_result()->add_ranks());
    for (int p = 0; p < 4; ++p) fill(entry.mutable_result()->add_proxies()->add_ranks());
  }
  const std::string w = Register(64);
  SubmitScripted("big", table);
  auto got = LeaseNow(w, 64);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_GE(got->trials_size(), 1);
  EXPECT_LT(got->trials_size(), static_cast<int>(table.size()));
  EXPECT_LE(got->ByteSizeLong(), 2 * search::limits::kMaxLeaseReplyBytes);
}

TEST_F(SchedulerTest, SilentWorkerLosesItsLeaseAndTheTrialRunsElsewhere) {
  const std::string a = Register(1);
  const std::string id = SubmitScripted("s", kTable, {"selective:[]"});
  v1::TrialAssignment first = LeaseOne(a);
  EXPECT_EQ(first.attempt(), 1);
  clock_.Advance(10);
  sched_->Tick();
  EXPECT_EQ(TrialOf(Get(id), "selective:[]").status(), v1::TRIAL_STATUS_RUNNING);
  clock_.Advance(6);  // 16 s of silence > 15 s lease timeout
  sched_->Tick();
  EXPECT_EQ(TrialOf(Get(id), "selective:[]").status(), v1::TRIAL_STATUS_PENDING);

  const std::string b = Register(1);
  v1::TrialAssignment second = LeaseOne(b);
  EXPECT_EQ(second.trial_id(), first.trial_id());
  EXPECT_EQ(second.attempt(), 2);
  ASSERT_TRUE(*Report(b, second));
  // The silent worker comes back and reports too late: not recorded twice.
  EXPECT_FALSE(*Report(a, first));
  v1::Search s = Get(id);
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_EQ(TrialOf(s, "selective:[]").worker_id(), b);
  EXPECT_EQ(TrialOf(s, "selective:[]").attempts(), 2);
}

TEST_F(SchedulerTest, LateReportFromAnExpiredLeaseIsKeptWhenFirst) {
  const std::string a = Register(1);
  const std::string id = SubmitScripted("s", kTable, {"selective:[]"});
  v1::TrialAssignment first = LeaseOne(a);
  clock_.Advance(16);
  sched_->Tick();  // requeued
  ASSERT_TRUE(*Report(a, first));  // the result is not lost
  EXPECT_EQ(Get(id).state(), v1::SEARCH_STATE_SUCCEEDED);
}

TEST_F(SchedulerTest, HeartbeatsKeepLeasesAlive) {
  const std::string a = Register(1);
  const std::string id = SubmitScripted("s", kTable, {"selective:[]"});
  v1::TrialAssignment t = LeaseOne(a);
  for (int i = 0; i < 20; ++i) {
    clock_.Advance(2);
    v1::HeartbeatRequest hb;
    hb.set_worker_id(a);
    hb.add_running_trial_ids(t.trial_id());
    auto r = sched_->Heartbeat(hb);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->cancel_trial_ids_size(), 0);
    EXPECT_FALSE(r->reregister());
    sched_->Tick();
  }
  EXPECT_EQ(TrialOf(Get(id), "selective:[]").status(), v1::TRIAL_STATUS_RUNNING);
  // One heartbeat without it (say, its report is on the way) does not lose it...
  v1::HeartbeatRequest empty;
  empty.set_worker_id(a);
  clock_.Advance(2);
  ASSERT_TRUE(sched_->Heartbeat(empty).ok());
  EXPECT_EQ(TrialOf(Get(id), "selective:[]").status(), v1::TRIAL_STATUS_RUNNING);
  // ...but a worker that keeps heartbeating without listing it loses it after a lease timeout.
  clock_.Advance(14);
  ASSERT_TRUE(sched_->Heartbeat(empty).ok());
  EXPECT_EQ(TrialOf(Get(id), "selective:[]").status(), v1::TRIAL_STATUS_PENDING);
}

// A heartbeat never leases: naming a pending trial (any user's) that this worker was never
// handed tells the worker to stop it, and a report invented for it is not accepted. A worker
// that lost its own lease while it still ran the trial takes that lease back.
TEST_F(SchedulerTest, HeartbeatsNeverAdoptATrialTheWorkerWasNotHanded) {
  const std::string honest = Register(1);
  const std::string id = SubmitScripted("s", kTable, {"selective:[]"});
  const std::string thief = Register(1);
  const v1::Trial pending = TrialOf(Get(id), "selective:[]");
  ASSERT_EQ(pending.status(), v1::TRIAL_STATUS_PENDING);
  v1::HeartbeatRequest hb;
  hb.set_worker_id(thief);
  hb.add_running_trial_ids(pending.id());
  auto answer = sched_->Heartbeat(hb);
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->cancel_trial_ids_size(), 1);
  EXPECT_EQ(answer->cancel_trial_ids(0), pending.id());
  EXPECT_EQ(TrialOf(Get(id), "selective:[]").status(), v1::TRIAL_STATUS_PENDING);
  v1::TrialAssignment invented;
  invented.set_trial_id(pending.id());
  invented.set_attempt(1);
  *invented.mutable_replay() = Entry(1, 1e-3);
  EXPECT_FALSE(*Report(thief, invented));
  EXPECT_EQ(Get(id).trials_done(), 0);

  // Its own lease, lost while it still ran it, comes back to the worker that held it...
  v1::TrialAssignment a = LeaseOne(honest);
  clock_.Advance(16);
  sched_->Tick();
  ASSERT_EQ(TrialOf(Get(id), "selective:[]").status(), v1::TRIAL_STATUS_PENDING);
  EXPECT_EQ(sched_->Heartbeat(hb)->cancel_trial_ids_size(), 1);  // ...never to another
  hb.set_worker_id(honest);
  answer = sched_->Heartbeat(hb);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->cancel_trial_ids_size(), 0);
  const v1::Trial back = TrialOf(Get(id), "selective:[]");
  EXPECT_EQ(back.status(), v1::TRIAL_STATUS_RUNNING);
  EXPECT_EQ(back.worker_id(), honest);
  EXPECT_EQ(back.attempts(), 1);
  ASSERT_TRUE(*Report(honest, a));
  EXPECT_EQ(Get(id).state(), v1::SEARCH_STATE_SUCCEEDED);

  // What a heartbeat lists is bounded by the worker's slots, and nothing long is echoed.
  v1::HeartbeatRequest flood;
  flood.set_worker_id(honest);
  for (int i = 0; i < 5000; ++i) flood.add_running_trial_ids("t-" + std::to_string(i));
  EXPECT_EQ(sched_->Heartbeat(flood).status().code(), absl::StatusCode::kInvalidArgument);
  v1::HeartbeatRequest long_id;
  long_id.set_worker_id(honest);
  long_id.add_running_trial_ids(std::string(10 << 10, 't'));
  answer = sched_->Heartbeat(long_id);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->cancel_trial_ids_size(), 0);
}

// Planning a submitted search holds no lock: while one plans (here, for as long as the test
// says), another user's GetSearch and a worker's heartbeat and lease answer.
TEST_F(SchedulerTest, PlanningASearchHoldsUpNoOtherCall) {
  const std::string w = Register(1);
  const std::string other = SubmitScripted("other", kTable, {"selective:[]"});
  std::promise<void> planning, release;
  on_plan_ = [&](const std::string& name) {
    if (name != "slow") return;
    planning.set_value();
    release.get_future().wait();
  };
  scripts_["slow"] = {"selective:[]"};
  auto submit = std::async(std::launch::async, [&] {
    return sched_->SubmitSearch(Principal::User("alice"), Submit(SmallSpec("slow"), kTable));
  });
  planning.get_future().wait();
  auto get = std::async(std::launch::async,
                        [&] { return sched_->GetSearch(Principal::Anonymous(), other); });
  auto beat = std::async(std::launch::async, [&] {
    v1::HeartbeatRequest hb;
    hb.set_worker_id(w);
    return sched_->Heartbeat(hb);
  });
  const bool got = get.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  const bool beaten = beat.wait_for(std::chrono::seconds(5)) == std::future_status::ready;
  release.set_value();  // before the checks: a failed one must not leave the submit waiting
  EXPECT_TRUE(got) << "GetSearch waited for another search's planning";
  EXPECT_TRUE(beaten) << "a heartbeat waited for a search's planning";
  EXPECT_TRUE(get.get().ok());
  EXPECT_TRUE(beat.get().ok());
  ASSERT_TRUE(submit.get().ok());
}

TEST_F(SchedulerTest, UnknownWorkerIsToldToRegister) {
  v1::HeartbeatRequest hb;
  hb.set_worker_id("w-unknown");
  EXPECT_TRUE(sched_->Heartbeat(hb)->reregister());
  EXPECT_EQ(LeaseNow("w-unknown", 1).status().code(), absl::StatusCode::kFailedPrecondition);
  // Re-registering with the old id keeps it.
  v1::RegisterRequest r = Worker(1);
  r.set_worker_id("w-unknown");
  EXPECT_EQ(sched_->Register(r)->worker_id(), "w-unknown");
  EXPECT_FALSE(sched_->Heartbeat(hb)->reregister());
}

TEST_F(SchedulerTest, BoundedAttemptsEndInFailedWithTheReason) {
  const std::string id = SubmitScripted("s", kTable, {"selective:[]", "full:uniform:1"});
  std::string trial;
  for (int attempt = 1; attempt <= 3; ++attempt) {
    const std::string w = Register(1);
    v1::TrialAssignment a = LeaseOne(w);
    if (trial.empty()) trial = a.trial_id();
    ASSERT_EQ(a.trial_id(), trial);  // requeued at the front of its search
    EXPECT_EQ(a.attempt(), attempt);
    clock_.Advance(16);
    sched_->Tick();
  }
  v1::Trial t = TrialOf(Get(id), "selective:[]");
  EXPECT_EQ(t.status(), v1::TRIAL_STATUS_FAILED);
  EXPECT_EQ(t.attempts(), 3);
  EXPECT_NE(t.result().message().find("lost its worker 3 times"), std::string::npos)
      << t.result().message();
  EXPECT_NE(t.result().message().find("silent"), std::string::npos);
  // The search goes on with its other trial.
  const std::string w = Register(1);
  v1::TrialAssignment other = LeaseOne(w);
  EXPECT_EQ(other.policy().canonical(), "full:uniform:1");
  ASSERT_TRUE(*Report(w, other));
  EXPECT_EQ(Get(id).state(), v1::SEARCH_STATE_SUCCEEDED);
}

TEST_F(SchedulerTest, CancelStopsQueuedAndRunningTrials) {
  const std::string w = Register(1);
  const std::string id = SubmitScripted("s", kTable);
  v1::TrialAssignment running = LeaseOne(w);
  auto c = sched_->CancelSearch(Principal::Anonymous(), id);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->state(), v1::SEARCH_STATE_CANCELLED);
  v1::Search s = Get(id);
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_CANCELLED);
  for (const auto& t : s.trials()) EXPECT_EQ(t.status(), v1::TRIAL_STATUS_CANCELLED);
  // The worker hears about it on its next heartbeat.
  v1::HeartbeatRequest hb;
  hb.set_worker_id(w);
  hb.add_running_trial_ids(running.trial_id());
  auto r = sched_->Heartbeat(hb);
  ASSERT_EQ(r->cancel_trial_ids_size(), 1);
  EXPECT_EQ(r->cancel_trial_ids(0), running.trial_id());
  EXPECT_FALSE(*Report(w, running));
  EXPECT_EQ(LeaseNow(w, 1)->trials_size(), 0);
  // Cancelling again is harmless; a finished search cannot be cancelled.
  EXPECT_TRUE(sched_->CancelSearch(Principal::Anonymous(), id).ok());
  const std::string done = SubmitScripted("d", {{"selective:[]", Entry(1, 1)}});
  ASSERT_TRUE(*Report(w, LeaseOne(w)));
  EXPECT_EQ(sched_->CancelSearch(Principal::Anonymous(), done).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(SchedulerTest, SearchesShareWorkersFairly) {
  const std::string w = Register(1);
  const std::string a = SubmitScripted("a", kTable);
  const std::string b = SubmitScripted("b", kTable);
  std::vector<std::string> order;
  for (int i = 0; i < 6; ++i) {
    v1::TrialAssignment t = LeaseOne(w);
    order.push_back(t.search_id());
    ASSERT_TRUE(*Report(w, t));
  }
  for (size_t i = 1; i < order.size(); ++i) {
    EXPECT_NE(order[i], order[i - 1]) << "lease " << i << " went to the same search again";
  }
}

TEST_F(SchedulerTest, TrialsNeedWorldSizeSlotsOnOneWorker) {
  search::SearchSpec spec = SmallSpec("tp2");
  spec.parallel.tensor_model_parallel_size = 2;
  scripts_["tp2"] = {"selective:[]"};
  auto id = sched_->SubmitSearch(Principal::Anonymous(),
                                 Submit(spec, {{"selective:[]", Entry(1, 1)}}));
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string small = Register(1);
  EXPECT_EQ(LeaseNow(small, 1)->trials_size(), 0);
  const std::string big = Register(4);
  EXPECT_EQ(LeaseNow(big, 1)->trials_size(), 0);  // it says only one slot is free
  v1::TrialAssignment a = LeaseOne(big, 4);
  EXPECT_EQ(a.world_size(), 2);
}

TEST_F(SchedulerTest, ResultsCacheReusesMeasurementsOnTheSameHardware) {
  const std::string h200 = Register(1, "NVIDIA H200");
  const Principal anyone = Principal::Anonymous();
  const std::string first = SubmitScripted("first", kTable, {"selective:[]"}, anyone, 1);
  ASSERT_TRUE(*Report(h200, LeaseOne(h200)));
  ASSERT_EQ(Get(first).state(), v1::SEARCH_STATE_SUCCEEDED);

  // Same measurement (another name, another strategy script, same model and settings).
  const std::string again =
      SubmitScripted("again", kTable, {"selective:[]", "full:uniform:1"}, anyone, 1);
  v1::TrialAssignment next = LeaseOne(h200);
  EXPECT_EQ(next.policy().canonical(), "full:uniform:1");  // selective:[] was not handed out
  v1::Trial reused = TrialOf(Get(again), "selective:[]");
  EXPECT_EQ(reused.status(), v1::TRIAL_STATUS_OK);
  EXPECT_TRUE(reused.result().reused());
  EXPECT_DOUBLE_EQ(reused.result().step_time_s(), 0.50);

  // Other hardware: measured again.
  const std::string h100 = Register(1, "NVIDIA H100");
  ASSERT_TRUE(*Report(h200, next));
  const std::string other = SubmitScripted("other", kTable, {"selective:[]"}, anyone, 1);
  v1::TrialAssignment on_h100 = LeaseOne(h100);
  EXPECT_EQ(on_h100.search_id(), other);
  ASSERT_TRUE(*Report(h100, on_h100));
  EXPECT_FALSE(TrialOf(Get(other), "selective:[]").result().reused());

  // Another budget changes the key too.
  search::SearchSpec spec = SmallSpec("budget");
  spec.train.seed = 1;
  spec.search.memory_budget_gib = 40;
  scripts_["budget"] = {"selective:[]"};
  auto budget = sched_->SubmitSearch(Principal::Anonymous(), Submit(spec, kTable));
  v1::TrialAssignment b = LeaseOne(h200);
  EXPECT_EQ(b.search_id(), budget->id());
}

// A trial identical to one running for another search joins it instead of running
// twice: it takes an ok/oom result as reused, and runs itself when the one it joined fails or its
// search is cancelled.
TEST_F(SchedulerTest, IdenticalTrialsJoinTheOneInFlight) {
  const std::string w = Register(1);
  const Principal anyone = Principal::Anonymous();
  const std::string lead = SubmitScripted("lead", kTable, {"selective:[]"}, anyone, 7);
  v1::TrialAssignment running = LeaseOne(w);
  ASSERT_EQ(running.search_id(), lead);
  // Submitted while the first runs (queued after it: joins at once).
  const std::string follow = SubmitScripted("follow", kTable, {"selective:[]"}, anyone, 7);
  EXPECT_EQ(Get(follow).state(), v1::SEARCH_STATE_RUNNING);
  const std::string w2 = Register(1);
  auto none = LeaseNow(w2, 1);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->trials_size(), 0) << "the joined trial must not be handed out";
  ASSERT_TRUE(*Report(w, running));
  v1::Trial taken = TrialOf(Get(follow), "selective:[]");
  EXPECT_EQ(taken.status(), v1::TRIAL_STATUS_OK);
  EXPECT_TRUE(taken.result().reused());
  EXPECT_EQ(Get(follow).state(), v1::SEARCH_STATE_SUCCEEDED);

  // Queued before the other is leased (a second slot busy elsewhere): joins at the lease; the
  // one it joined fails, so it goes back to its queue and runs.
  const std::string a = SubmitScripted("a", kTable, {"full:uniform:1"}, anyone, 8);
  const std::string b = SubmitScripted("b", kTable, {"full:uniform:1"}, anyone, 8);
  v1::TrialAssignment first = LeaseOne(w);
  const std::string other = first.search_id() == a ? b : a;
  EXPECT_EQ(LeaseNow(w2, 1)->trials_size(), 0);
  v1::TrialResult failed;
  failed.set_status(v1::TRIAL_STATUS_FAILED);
  failed.set_message("boom");
  ASSERT_TRUE(*Report(w, first, failed));
  v1::TrialAssignment again = LeaseOne(w2);
  EXPECT_EQ(again.search_id(), other);
  ASSERT_TRUE(*Report(w2, again));
  EXPECT_FALSE(TrialOf(Get(other), "full:uniform:1").result().reused());

  // The search it joined is cancelled: it runs itself.
  const std::string c = SubmitScripted("c", kTable, {"selective:[core_attn]"}, anyone, 9);
  v1::TrialAssignment c_trial = LeaseOne(w);
  ASSERT_EQ(c_trial.search_id(), c);
  const std::string d = SubmitScripted("d", kTable, {"selective:[core_attn]"}, anyone, 9);
  EXPECT_EQ(LeaseNow(w2, 1)->trials_size(), 0);
  ASSERT_TRUE(sched_->CancelSearch(anyone, c).ok());
  v1::TrialAssignment d_trial = LeaseOne(w2);
  EXPECT_EQ(d_trial.search_id(), d);
  ASSERT_TRUE(*Report(w2, d_trial));
  EXPECT_EQ(Get(d).state(), v1::SEARCH_STATE_SUCCEEDED);
}

// A search no connected worker can run says why at once (get, watch, list), runs as
// soon as one that can registers, and fails after unserved_search_timeout_s of it otherwise.
TEST_F(SchedulerTest, UnservedSearchSaysWhyAndFailsAfterABoundedWait) {
  sched_.reset();
  options_.unserved_search_timeout_s = 60;
  StartScheduler();
  search::SearchSpec spec = SmallSpec("cmd");
  spec.search.backend = search::Backend::kCommand;
  spec.search.command_template = "megatron-8b";
  auto submit = [&] {
    auto r = sched_->SubmitSearch(Principal::Anonymous(), Submit(spec, {}));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? r->id() : "";
  };
  // No worker at all: it says so and waits without a deadline.
  const std::string id = submit();
  sched_->Tick();
  EXPECT_EQ(Get(id).message(), "waiting: no worker is connected");
  clock_.Advance(3600);
  sched_->Tick();
  EXPECT_EQ(Get(id).state(), v1::SEARCH_STATE_QUEUED);

  // A worker without the template: the reason names it, in get, watch and list.
  v1::RegisterRequest plain = Worker(1);
  plain.add_backends("command");
  const std::string w = sched_->Register(plain)->worker_id();
  sched_->Tick();
  const std::string why = "waiting: no connected worker offers command template \"megatron-8b\"";
  EXPECT_EQ(Get(id).message(), why);
  v1::SearchProgress progress;
  auto watch = sched_->Watch(Principal::Anonymous(), id, [] {});
  ASSERT_TRUE(watch.ok());
  ASSERT_EQ(sched_->PollWatch(*watch, &progress), Scheduler::WatchPoll::kUpdate);
  EXPECT_EQ(progress.message(), why);
  sched_->Unwatch(*watch);
  auto list = sched_->ListSearches(Principal::Anonymous(), 10);
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->searches(0).message(), why);
  EXPECT_EQ(LeaseNow(w, 1)->trials_size(), 0);

  // One that offers it arrives: the message goes, its trial is leased.
  clock_.Advance(30);
  v1::RegisterRequest with = plain;
  with.add_command_templates("megatron-8b");
  const std::string w2 = sched_->Register(with)->worker_id();
  sched_->Tick();
  EXPECT_EQ(Get(id).message(), "");
  EXPECT_EQ(LeaseOne(w2).search_id(), id);
  ASSERT_TRUE(sched_->CancelSearch(Principal::Anonymous(), id).ok());

  // Only the worker without it stays connected: the next search fails after 60 s of waiting.
  clock_.Advance(20);
  sched_->Heartbeat([&] {
    v1::HeartbeatRequest h;
    h.set_worker_id(w);
    return h;
  }());
  sched_->Tick();  // w2 is silent: lost
  const std::string second = submit();
  sched_->Tick();
  EXPECT_EQ(Get(second).message(), why);
  for (int i = 0; i < 7; ++i) {
    clock_.Advance(10);
    sched_->Heartbeat([&] {
      v1::HeartbeatRequest h;
      h.set_worker_id(w);
      return h;
    }());
    sched_->Tick();
  }
  const v1::Search failed = Get(second);
  EXPECT_EQ(failed.state(), v1::SEARCH_STATE_FAILED);
  EXPECT_EQ(failed.message(),
            "no trial ran: no connected worker offers command template \"megatron-8b\" for 60 s "
            "(rematd --unserved-search-timeout)");
  for (const v1::Trial& t : failed.trials()) {
    EXPECT_EQ(t.result().status(), v1::TRIAL_STATUS_CANCELLED);
  }
}

// A measured (not replayed) result: one rank with these steps and this reserved peak.
v1::TrialResult Measured(double reserved_gib, std::vector<double> steps, double loss = 2.0) {
  v1::TrialResult r = Entry(reserved_gib, 1).result();
  std::sort(steps.begin(), steps.end());
  const double median = steps[steps.size() / 2];
  r.set_step_time_s(median);
  r.set_step_time_spread_s(steps.back() - steps.front());
  r.set_tokens_per_s(128.0 / median);
  r.set_loss(loss);
  r.set_grad_norm(1.0);
  r.set_warmup_steps_taken(3);
  r.set_warmup_settled(true);
  (*r.mutable_versions())["remat"] = "test";
  for (double t : steps) r.mutable_ranks(0)->add_step_times_s(t);
  r.mutable_ranks(0)->set_step_time_s(median);
  return r;
}

// Frontier points within each other's noise are measured once more before the recommendation;
// the second run is leased (not taken from the results cache), marked, and pooled with the first.
TEST_F(SchedulerTest, NearTiesAreMeasuredOnceMoreBeforeTheRecommendation) {
  const std::string w = Register(1);
  search::SearchSpec spec = SmallSpec("ties");
  spec.search.backend = search::Backend::kBuiltin;
  scripts_["ties"] = {"selective:[]", "selective:[core_attn]", "full:uniform:1"};
  auto submitted = sched_->SubmitSearch(Principal::Anonymous(), Submit(spec, {}));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::string id = submitted->id();
  // The control and core_attn are 0.4% apart: a near-tie. full:uniform:1 is far slower.
  const std::map<std::string, v1::TrialResult> first = {
      {"selective:[]", Measured(70, {0.500, 0.500, 0.500})},
      {"selective:[core_attn]", Measured(50, {0.502, 0.502, 0.502})},
      {"full:uniform:1", Measured(30, {0.700, 0.700, 0.700})},
  };
  std::vector<std::string> order;
  for (int i = 0; i < 3; ++i) {
    v1::TrialAssignment a = LeaseOne(w);
    order.push_back(a.policy().canonical());
    ASSERT_TRUE(*Report(w, a, first.at(a.policy().canonical())));
  }
  EXPECT_EQ(order, scripts_["ties"]);
  ASSERT_EQ(Get(id).state(), v1::SEARCH_STATE_RUNNING);  // not concluded: the ties run again
  // The second runs: core_attn comes out slower this time.
  const std::map<std::string, v1::TrialResult> second = {
      {"selective:[]", Measured(70, {0.500, 0.501, 0.500})},
      {"selective:[core_attn]", Measured(50, {0.530, 0.530, 0.530})},
  };
  std::set<std::string> again;
  for (int i = 0; i < 2; ++i) {
    v1::TrialAssignment a = LeaseOne(w);
    EXPECT_TRUE(again.insert(a.policy().canonical()).second);
    ASSERT_TRUE(*Report(w, a, second.at(a.policy().canonical())));
  }
  EXPECT_EQ(again, (std::set<std::string>{"selective:[]", "selective:[core_attn]"}));
  EXPECT_EQ(LeaseNow(w, 1)->trials_size(), 0);  // bounded: one round only

  const v1::Search s = Get(id);
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED);
  ASSERT_EQ(s.trials_size(), 5);
  int remeasured = 0;
  for (const v1::Trial& t : s.trials()) {
    if (!t.remeasure()) continue;
    ++remeasured;
    EXPECT_FALSE(t.result().reused());
    EXPECT_EQ(t.reason().rfind("re-measure: ", 0), 0u) << t.reason();
  }
  EXPECT_EQ(remeasured, 2);
  // Pooled: core_attn's six steps have a median of (0.502 + 0.530) / 2 = 0.516 s, 3% slower
  // than the control, and spread by 0.028 s (5.4%): the two runs disagree, so its noise band
  // widens and it stays tied; the control replays nothing and is recommended. The figures the
  // recommendation saw are the pooled ones.
  EXPECT_EQ(s.recommendation(), "selective:[]");
  ASSERT_TRUE(s.has_recommendation_detail());
  ASSERT_EQ(s.recommendation_detail().tied_size(), 2);
  const v1::RecommendationCandidate& pooled = s.recommendation_detail().tied(1);
  EXPECT_EQ(pooled.policy(), "selective:[core_attn]");
  EXPECT_DOUBLE_EQ(pooled.tokens_per_s(), search::TokensPerSecond(spec, 0.516));
  EXPECT_NEAR(pooled.noise(), 0.028 / 0.516, 1e-9);
  // The policy's last trial carries the combined figures; the first does not.
  EXPECT_FALSE(s.trials(1).has_combined());
  const v1::Trial& last = s.trials(3).policy().canonical() == "selective:[core_attn]" ? s.trials(3)
                                                                                      : s.trials(4);
  ASSERT_TRUE(last.has_combined());
  EXPECT_DOUBLE_EQ(last.combined().step_time_s(), 0.516);
  EXPECT_EQ(last.combined().ranks(0).step_times_s_size(), 6);
  // Numerics: every trial's loss matched the control's; versions summed up.
  EXPECT_EQ(s.numerics_mismatches_size(), 0);
  EXPECT_EQ(s.versions().at("remat"), "test");
}

// Replay stays deterministic: a table's near-ties are not replayed twice.
TEST_F(SchedulerTest, ReplayedNearTiesAreNotRemeasured) {
  const std::string w = Register(1);
  const std::map<std::string, v1::ReplayEntry> table = {
      {"selective:[]", Entry(70, 0.500)}, {"selective:[core_attn]", Entry(50, 0.502)}};
  const std::string id = SubmitScripted("replay-ties", table);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(*Report(w, LeaseOne(w)));
  EXPECT_EQ(LeaseNow(w, 1)->trials_size(), 0);
  EXPECT_EQ(Get(id).state(), v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_EQ(Get(id).trials_size(), 2);
}

// A trial whose loss is off the control's is marked, and the search says so.
TEST_F(SchedulerTest, NumericsMismatchMarksTheTrialAndTheSearch) {
  const std::string w = Register(1);
  search::SearchSpec spec = SmallSpec("numerics");
  spec.search.backend = search::Backend::kBuiltin;
  spec.train.precision = search::Precision::kFp32;
  scripts_["numerics"] = {"selective:[]", "selective:[core_attn]", "full:uniform:1"};
  auto submitted = sched_->SubmitSearch(Principal::Anonymous(), Submit(spec, {}));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  const std::map<std::string, v1::TrialResult> results = {
      {"selective:[]", Measured(70, {0.50, 0.50, 0.50}, 2.0)},
      {"selective:[core_attn]", Measured(50, {0.60, 0.60, 0.60}, 2.0 * (1 + 5e-6))},
      {"full:uniform:1", Measured(30, {0.70, 0.70, 0.70}, 2.1)},
  };
  for (int i = 0; i < 3; ++i) {
    v1::TrialAssignment a = LeaseOne(w);
    ASSERT_TRUE(*Report(w, a, results.at(a.policy().canonical())));
  }
  const v1::Search s = Get(submitted->id());
  EXPECT_EQ(s.numerics_compared(), 2);
  EXPECT_DOUBLE_EQ(s.numerics_tolerance(), 1e-5);
  ASSERT_EQ(s.numerics_mismatches_size(), 1);
  EXPECT_EQ(s.numerics_mismatches(0).rfind("full:uniform:1: loss 2.1", 0), 0u)
      << s.numerics_mismatches(0);
  EXPECT_TRUE(TrialOf(s, "selective:[core_attn]").numerics_mismatch().empty());
  EXPECT_EQ(TrialOf(s, "full:uniform:1").numerics_mismatch(), s.numerics_mismatches(0));
}

TEST_F(SchedulerTest, LongPollIsAnsweredWhenWorkArrivesOrTheWaitEnds) {
  const std::string w = Register(1);
  v1::LeaseTrialRequest req;
  req.set_worker_id(w);
  req.set_free_slots(1);
  req.set_wait_s(5);
  std::optional<absl::StatusOr<v1::LeaseTrialResponse>> got;
  sched_->LeaseTrial(req, [&](absl::StatusOr<v1::LeaseTrialResponse> r) { got = std::move(r); });
  EXPECT_FALSE(got.has_value());
  SubmitScripted("s", kTable);
  ASSERT_TRUE(got.has_value());
  ASSERT_TRUE(got->ok());
  EXPECT_EQ((*got)->trials_size(), 1);

  // No work (the worker says it has no free slot): answered empty after the wait.
  got.reset();
  req.set_free_slots(0);
  sched_->LeaseTrial(req, [&](absl::StatusOr<v1::LeaseTrialResponse> r) { got = std::move(r); });
  clock_.Advance(4);
  sched_->Tick();
  EXPECT_FALSE(got.has_value());
  clock_.Advance(1.5);
  sched_->Tick();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ((*got)->trials_size(), 0);

  // A cancelled wait is answered at once; shutdown answers the rest.
  got.reset();
  uint64_t wait = sched_->LeaseTrial(
      req, [&](absl::StatusOr<v1::LeaseTrialResponse> r) { got = std::move(r); });
  ASSERT_NE(wait, 0u);
  sched_->CancelLeaseWait(wait);
  ASSERT_TRUE(got.has_value());
  got.reset();
  sched_->LeaseTrial(req, [&](absl::StatusOr<v1::LeaseTrialResponse> r) { got = std::move(r); });
  sched_->Shutdown();
  EXPECT_TRUE(got.has_value());
}

TEST_F(SchedulerTest, WatchersSeeEveryTrialAndTheFinalState) {
  const std::string w = Register(1);
  const std::string id = SubmitScripted("s", kTable);
  int wakes = 0;
  auto watch = sched_->Watch(Principal::Anonymous(), id, [&] { ++wakes; });
  ASSERT_TRUE(watch.ok());
  EXPECT_GE(wakes, 1);
  std::vector<v1::SearchProgress> updates;
  auto drain = [&] {
    v1::SearchProgress p;
    Scheduler::WatchPoll r;
    while ((r = sched_->PollWatch(*watch, &p)) == Scheduler::WatchPoll::kUpdate ||
           r == Scheduler::WatchPoll::kFinal) {
      updates.push_back(p);
      if (r == Scheduler::WatchPoll::kFinal) return true;
    }
    return false;
  };
  EXPECT_FALSE(drain());
  ASSERT_EQ(updates.size(), 1u);
  EXPECT_EQ(updates[0].state(), v1::SEARCH_STATE_QUEUED);
  EXPECT_EQ(updates[0].trials_planned(), 4);
  bool final = false;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(*Report(w, LeaseOne(w)));
    final = drain();
  }
  EXPECT_TRUE(final);
  EXPECT_EQ(updates.back().state(), v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_EQ(updates.back().trials_done(), 4);
  EXPECT_EQ(updates.back().best_policy(), "selective:[]");
  int with_trial = 0;
  for (const auto& u : updates) with_trial += u.has_last_trial() ? 1 : 0;
  EXPECT_EQ(with_trial, 4);
  EXPECT_EQ(sched_->PollWatch(*watch, nullptr), Scheduler::WatchPoll::kClosed);

  // Watching a finished search gives its final state at once.
  auto late = sched_->Watch(Principal::Anonymous(), id, [] {});
  ASSERT_TRUE(late.ok());
  v1::SearchProgress p;
  EXPECT_EQ(sched_->PollWatch(*late, &p), Scheduler::WatchPoll::kFinal);
  EXPECT_EQ(p.state(), v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_EQ(p.frontier_size(), 3);
}

TEST_F(SchedulerTest, UsersSeeOnlyTheirOwnSearches) {
  const Principal alice = Principal::User("alice");
  const Principal bob = Principal::User("bob");
  const std::string id = SubmitScripted("s", kTable, {}, alice);
  EXPECT_TRUE(sched_->GetSearch(alice, id).ok());
  EXPECT_EQ(sched_->GetSearch(bob, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_->CancelSearch(bob, id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_->Watch(bob, id, [] {}).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(sched_->ListSearches(bob, 0)->searches_size(), 0);
  ASSERT_EQ(sched_->ListSearches(alice, 0)->searches_size(), 1);
  EXPECT_EQ(sched_->ListSearches(alice, 0)->searches(0).owner(), "alice");
  EXPECT_EQ(sched_->GetSearch(alice, "s-nope").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, BadSpecsAreRefusedNamingTheField) {
  search::SearchSpec spec = SmallSpec("bad");
  spec.model.hidden_size = 0;
  auto r = sched_->SubmitSearch(Principal::Anonymous(), Submit(spec, kTable));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(r.status().message()).find("hidden_size"), std::string::npos)
      << r.status();
  auto empty = sched_->SubmitSearch(Principal::Anonymous(), Submit(SmallSpec("t"), {}));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(empty.status().message()).find("replay_table"), std::string::npos);
}

TEST_F(SchedulerTest, StoreFailuresFailTheCallAndChangeNothing) {
  const std::string w = Register(1);
  const std::string id = SubmitScripted("s", kTable, {"selective:[]"});
  v1::TrialAssignment a = LeaseOne(w);
  store_->FailNext("RecordResult");
  EXPECT_EQ(Report(w, a).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(TrialOf(Get(id), "selective:[]").status(), v1::TRIAL_STATUS_RUNNING);
  EXPECT_TRUE(*Report(w, a));  // the worker retries
  EXPECT_EQ(Get(id).state(), v1::SEARCH_STATE_SUCCEEDED);

  store_->FailNext("CreateSearch");
  scripts_["x"] = {"selective:[]"};
  EXPECT_EQ(sched_->SubmitSearch(Principal::Anonymous(), Submit(SmallSpec("x"), kTable))
                .status()
                .code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(sched_->ListSearches(Principal::Anonymous(), 0)->searches_size(), 1);

  // Proposals that could not be written are written later; the search is not lost.
  store_->FailNext("AddTrials");
  const std::string later = SubmitScripted("later", kTable, {"selective:[core_attn]"});
  EXPECT_EQ(Get(later).trials_size(), 0);
  sched_->Tick();
  EXPECT_EQ(Get(later).trials_size(), 1);
  ASSERT_TRUE(*Report(w, LeaseOne(w)));
  EXPECT_EQ(Get(later).state(), v1::SEARCH_STATE_SUCCEEDED);

  // A failed final write is retried by Tick.
  const std::string fin = SubmitScripted("fin", kTable, {"full:uniform:1"});
  v1::TrialAssignment f = LeaseOne(w);
  store_->FailNext("UpdateSearch");  // the final write
  ASSERT_TRUE(*Report(w, f));
  EXPECT_EQ(Get(fin).state(), v1::SEARCH_STATE_RUNNING);
  sched_->Tick();
  EXPECT_EQ(Get(fin).state(), v1::SEARCH_STATE_SUCCEEDED);
}

class SchedulerRestartTest : public SchedulerTest {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/remat-sched-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
    Open(dir_ + "/remat.db");
  }
  void TearDown() override {
    sched_.reset();
    store_.reset();
    std::filesystem::remove_all(dir_);
  }
  std::string dir_;
};

TEST_F(SchedulerRestartTest, ResumesEverySearchRecordingEachPolicyOnce) {
  const std::string w = Register(2);
  const std::string one = SubmitScripted("one", kTable);
  const std::string two = SubmitScripted("two", kTable);
  // Some results in, some leases out, some queued: then the coordinator dies.
  v1::TrialAssignment done1 = LeaseOne(w);
  ASSERT_TRUE(*Report(w, done1));
  v1::TrialAssignment leased = LeaseOne(w);
  v1::TrialAssignment lost = LeaseOne(w);
  Open(dir_ + "/remat.db");

  // The worker that held `leased` reports it after the restart: accepted once.
  EXPECT_TRUE(*Report(w, leased));
  EXPECT_FALSE(*Report(w, leased));
  // `lost` never comes back: after a lease timeout it is requeued and runs again.
  clock_.Advance(16);
  sched_->Tick();
  const std::string w2 = Register(1);
  int runs = 0;
  while (true) {
    auto r = LeaseNow(w2, 1);
    ASSERT_TRUE(r.ok());
    if (r->trials_size() == 0) break;
    ASSERT_TRUE(*Report(w2, r->trials(0)));
    ++runs;
    ASSERT_LT(runs, 20);
  }
  EXPECT_EQ(runs, 8 - 2);
  for (const std::string& id : {one, two}) {
    v1::Search s = Get(id);
    EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED) << id;
    std::set<std::string> policies;
    for (const auto& t : s.trials()) {
      EXPECT_TRUE(policies.insert(t.policy().canonical()).second) << t.policy().canonical();
      EXPECT_EQ(t.status(), v1::TRIAL_STATUS_OK);
    }
    EXPECT_EQ(policies.size(), 4u);
    EXPECT_EQ(s.recommendation(), "selective:[]");
  }
}

// The re-measure round survives a restart: the second trial of a policy is recognised as a
// re-measure (not handed to the strategy, not proposed again).
TEST_F(SchedulerRestartTest, RemeasureRoundSurvivesARestart) {
  const std::string w = Register(1);
  search::SearchSpec spec = SmallSpec("ties");
  spec.search.backend = search::Backend::kBuiltin;
  scripts_["ties"] = {"selective:[]", "selective:[core_attn]"};
  auto submitted = sched_->SubmitSearch(Principal::Anonymous(), Submit(spec, {}));
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  v1::TrialResult result = Entry(70, 0.5).result();
  (*result.mutable_ranks(0)).add_step_times_s(0.5);
  for (int i = 0; i < 2; ++i) ASSERT_TRUE(*Report(w, LeaseOne(w), result));
  v1::TrialAssignment again = LeaseOne(w);  // the first re-measure
  Open(dir_ + "/remat.db");
  ASSERT_TRUE(*Report(w, again, result));
  int runs = 0;
  while (true) {
    auto r = LeaseNow(w, 1);
    ASSERT_TRUE(r.ok());
    if (r->trials_size() == 0) break;
    ASSERT_TRUE(*Report(w, r->trials(0), result));
    ASSERT_LT(++runs, 5);
  }
  EXPECT_EQ(runs, 1);  // the other re-measure, and nothing more
  const v1::Search s = Get(submitted->id());
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_EQ(s.trials_size(), 4);
}

TEST_F(SchedulerRestartTest, RestartWithRealExhaustiveStrategy) {
  search::SearchSpec spec = SmallSpec("exhaustive");
  spec.search.strategy = search::StrategyKind::kExhaustive;
  spec.search.max_trials = 100;
  std::map<std::string, v1::ReplayEntry> table;
  const auto policies = search::EnumerateValidPolicies(spec);
  ASSERT_GT(policies.size(), 3u);
  double gib = 10;
  for (const auto& p : policies) {
    gib += 1;
    table[p.ToString()] = Entry(gib, 1.0 / gib);
  }
  auto id = sched_->SubmitSearch(Principal::Anonymous(), Submit(spec, table));
  ASSERT_TRUE(id.ok()) << id.status();
  const std::string w = Register(1);
  ASSERT_TRUE(*Report(w, LeaseOne(w)));
  ASSERT_TRUE(*Report(w, LeaseOne(w)));
  Open(dir_ + "/remat.db");
  size_t runs = 2;
  while (true) {
    auto r = LeaseNow(w, 1);
    ASSERT_TRUE(r.ok());
    if (r->trials_size() == 0) break;
    ASSERT_TRUE(*Report(w, r->trials(0)));
    ++runs;
    ASSERT_LE(runs, policies.size());
  }
  v1::Search s = Get(id->id());
  EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_EQ(static_cast<size_t>(s.trials_size()), policies.size());
  EXPECT_EQ(runs, policies.size());
}

// Crash consistency at every step: the coordinator "dies" after its n-th store call (every later
// call fails, as a killed process writes nothing more), then a new one opens the same database.
// For every n, every search must finish with each policy recorded exactly once.
TEST_F(SchedulerRestartTest, SurvivesACrashAfterAnyStoreCall) {
  const std::map<std::string, v1::ReplayEntry> table = {
      {"selective:[]", Entry(70, 0.50)},
      {"selective:[core_attn]", Entry(50, 0.52)},
      {"full:uniform:1", Entry(30, 0.70)}};
  // Drives a worker until nothing more happens; returns the assignments it still holds.
  auto drive = [&](const std::string& worker, std::vector<v1::TrialAssignment> held) {
    for (int round = 0; round < 50; ++round) {
      std::vector<v1::TrialAssignment> next;
      for (const auto& a : held) {
        if (!Report(worker, a).ok()) next.push_back(a);  // keep it: deliver later
      }
      held = next;
      auto r = LeaseNow(worker, 2);
      if (!r.ok() || r->trials_size() == 0) {
        if (held.empty()) break;
        continue;
      }
      held.insert(held.end(), r->trials().begin(), r->trials().end());
    }
    return held;
  };
  auto run = [&](int crash_after, int* calls) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    Open(dir_ + "/remat.db");
    if (crash_after >= 0) store_->FailAllAfter(crash_after);
    std::vector<std::string> ids;
    for (const char* name : {"one", "two"}) {
      scripts_[name] = {};
      for (const auto& [p, e] : table) scripts_[name].push_back(p);
      search::SearchSpec spec = SmallSpec(name);
      spec.train.seed = ids.size() + 1;
      auto id = sched_->SubmitSearch(Principal::Anonymous(), Submit(spec, table));
      if (id.ok()) ids.push_back(id->id());
    }
    v1::RegisterRequest reg = Worker(2);
    reg.set_worker_id("w-fixed");
    sched_->Register(reg).IgnoreError();
    std::vector<v1::TrialAssignment> held = drive("w-fixed", {});
    if (calls != nullptr) *calls = store_->total_calls();

    // Restart on the same file; the worker comes back with what it held, and time passes.
    Open(dir_ + "/remat.db");
    ASSERT_TRUE(sched_->Register(reg).ok());
    held = drive("w-fixed", held);
    clock_.Advance(16);
    sched_->Tick();
    ASSERT_TRUE(sched_->Register(reg).ok());
    held = drive("w-fixed", held);
    EXPECT_TRUE(held.empty());
    auto list = sched_->ListSearches(Principal::Anonymous(), 0);
    ASSERT_TRUE(list.ok());
    // Both searches exist once both submissions were acknowledged.
    EXPECT_EQ(list->searches_size(), static_cast<int>(ids.size())) << "crash after " << crash_after;
    if (crash_after < 0) {
      EXPECT_EQ(ids.size(), 2u);
    }
    for (const auto& summary : list->searches()) {
      v1::Search s = Get(summary.id());
      EXPECT_EQ(s.state(), v1::SEARCH_STATE_SUCCEEDED) << "crash after " << crash_after;
      std::set<std::string> policies;
      for (const auto& t : s.trials()) {
        EXPECT_TRUE(policies.insert(t.policy().canonical()).second)
            << "crash after " << crash_after << ": " << t.policy().canonical() << " twice";
        EXPECT_EQ(t.status(), v1::TRIAL_STATUS_OK) << "crash after " << crash_after;
      }
      EXPECT_EQ(policies.size(), table.size()) << "crash after " << crash_after;
    }
  };
  int total = 0;
  run(-1, &total);
  ASSERT_GT(total, 10);
  RecordProperty("crash_points", total);
  for (int n = 0; n <= total; ++n) run(n, nullptr);
}

}  // namespace
}  // namespace remat::server
