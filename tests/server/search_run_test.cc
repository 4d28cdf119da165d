// SearchRun on its own: the life cycle of one search's trials, without a store or workers.
#include "server/search_run.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "tests/server/test_util.h"

namespace remat::server {
namespace {

using testing::Entry;
using testing::ListStrategy;
using testing::SmallSpec;
using testing::Submit;

std::unique_ptr<SearchRun> NewRun(const std::vector<std::string>& policies,
                                  double budget_gib = 80) {
  search::SearchSpec spec = SmallSpec();
  spec.search.memory_budget_gib = budget_gib;
  std::map<std::string, v1::ReplayEntry> table;
  for (const auto& p : policies) table[p] = Entry(10, 1);
  auto run = SearchRun::FromRequest("alice", Submit(spec, table));
  EXPECT_TRUE(run.ok()) << run.status();
  (*run)->strategy = std::make_unique<ListStrategy>(policies);
  (*run)->rec.id = "s-1";
  return *std::move(run);
}

v1::TrialResult Measured(double reserved_gib, double step_time_s) {
  return Entry(reserved_gib, step_time_s).result();
}

std::function<std::string()> Ids() {
  auto n = std::make_shared<int>(0);
  return [n] { return "t-" + std::to_string((*n)++); };
}

// A strategy whose estimate runs one ahead of what it proposed, as a guided search's can.
class CreepingStrategy : public ListStrategy {
 public:
  using ListStrategy::ListStrategy;
  std::vector<search::Candidate> Propose(int max_count) override {
    auto out = ListStrategy::Propose(max_count);
    proposed_ += static_cast<int>(out.size());
    return out;
  }
  int PlannedTotal() const override { return std::max(estimate_floor, proposed_ + 1); }
  int estimate_floor = 4;

 private:
  int proposed_ = 0;
};

TEST(SearchRunTest, PlannedTotalMovesOnlyWhenMoreTrialsAreProposedThanItSaid) {
  std::vector<std::string> policies = {"selective:[]",   "selective:[core_attn]", "full:uniform:1",
                                       "full:uniform:2", "full:block:1",          "full:block:2"};
  auto run = NewRun(policies);
  SearchRun& s = *run;
  auto strategy = std::make_unique<CreepingStrategy>(policies);
  CreepingStrategy* creeping = strategy.get();
  s.strategy = std::move(strategy);
  std::vector<int> shown;
  std::vector<int> revised_from;
  for (int i = 0; i < 6; ++i) {
    auto queued = s.Enqueue(s.Proposals(1, Ids()));
    ASSERT_EQ(queued.size(), 1u);
    shown.push_back(s.PlannedTotal());
    revised_from.push_back(s.planned_revised_from);
    s.MarkFinal(*queued[0], Measured(10 - i, 1 + i), "");
    // The estimate falling back does not move the total either.
    creeping->estimate_floor = 0;
  }
  // 4 as first estimated; at the fifth proposal it must move: to the estimate then (6), and says
  // from what; no trial moves it otherwise.
  EXPECT_EQ(shown, (std::vector<int>{4, 4, 4, 4, 6, 6}));
  EXPECT_EQ(revised_from, (std::vector<int>{0, 0, 0, 0, 4, 4}));
}

TEST(SearchRunTest, ResultsAreRecordedUnderTheTrialsOwnPolicy) {
  RunTrial t;
  t.rec.policy = "selective:[core_attn]";
  v1::TrialResult reported = Measured(10, 1);
  reported.mutable_policy()->set_canonical("full:block:1");  // whatever the reporter said
  v1::TrialResult r = ResultOfTrial(t, reported);
  EXPECT_EQ(r.policy().canonical(), "selective:[core_attn]");
  EXPECT_EQ(r.status(), reported.status());
  EXPECT_DOUBLE_EQ(r.step_time_s(), reported.step_time_s());

  r = CoordinatorResult(t, v1::TRIAL_STATUS_CANCELLED, "search cancelled");
  EXPECT_EQ(r.policy().canonical(), "selective:[core_attn]");
  EXPECT_EQ(r.status(), v1::TRIAL_STATUS_CANCELLED);
  EXPECT_EQ(r.message(), "search cancelled");
}

TEST(SearchRunTest, RequestsAreValidatedAndReplayKeysMadeCanonical) {
  auto run = SearchRun::FromRequest(
      "alice", Submit(SmallSpec(), {{"selective:[ core_attn ]", Entry(10, 1)}}));
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ((*run)->rec.owner, "alice");
  EXPECT_EQ((*run)->rec.state, v1::SEARCH_STATE_QUEUED);
  EXPECT_NE((*run)->ReplayFor("selective:[core_attn]"), nullptr);
  EXPECT_EQ((*run)->ReplayFor("none"), nullptr);

  auto empty = SearchRun::FromRequest("alice", Submit(SmallSpec(), {}));
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(empty.status().message(), "replay_table"));

  search::SearchSpec command = SmallSpec();
  command.search.backend = search::Backend::kCommand;
  auto no_template = SearchRun::FromRequest("alice", Submit(command, {}));
  EXPECT_TRUE(absl::StrContains(no_template.status().message(), "search.command_template"))
      << no_template.status();
}

// What the builtin engine cannot run, and Megatron's spec-wide rules, are refused at submit
// (INVALID_ARGUMENT naming the field), not found trial by trial.
TEST(SearchRunTest, SpecWideProblemsAreRefusedAtSubmit) {
  search::SearchSpec cp = SmallSpec();
  cp.search.backend = search::Backend::kBuiltin;
  cp.model.attention_backend = search::AttentionBackend::kFlash;
  cp.parallel.context_parallel_size = 2;
  cp.parallel.cp_comm_type = search::CpCommType::kA2aP2p;  // hierarchical: not in the engine
  auto refused = SearchRun::FromRequest("alice", Submit(cp, {}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(refused.status().message(), "parallel.cp_comm_type:"))
      << refused.status();
  search::SearchSpec fp8 = SmallSpec();
  fp8.search.backend = search::Backend::kBuiltin;
  fp8.model.fp8 = "hybrid";
  refused = SearchRun::FromRequest("alice", Submit(fp8, {}));
  EXPECT_TRUE(absl::StartsWith(refused.status().message(), "model.fp8:")) << refused.status();
  // Other backends run it (the command backend runs Megatron itself).
  fp8.search.backend = search::Backend::kCommand;
  fp8.search.command_template = "megatron";
  EXPECT_TRUE(SearchRun::FromRequest("alice", Submit(fp8, {})).ok());

  search::SearchSpec bias = SmallSpec();
  bias.model.num_moe_experts = 4;
  bias.model.moe_grouped_gemm = true;  // with add_bias_linear's default true
  refused = SearchRun::FromRequest("alice", Submit(bias, {{"selective:[]", Entry(10, 1)}}));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(refused.status().message(), "model.add_bias_linear:"))
      << refused.status();
}

TEST(SearchRunTest, TrialsMoveFromQueueToLeaseToResult) {
  auto run = NewRun({"selective:[]", "selective:[core_attn]", "full:uniform:1"});
  SearchRun& s = *run;
  std::vector<TrialRecord> proposed = s.Proposals(2, Ids());
  ASSERT_EQ(proposed.size(), 2u);
  EXPECT_EQ(proposed[1].seq, 1);
  EXPECT_TRUE(s.Outstanding());  // proposed, not stored yet
  std::vector<RunTrial*> queued = s.Enqueue(std::move(proposed));
  EXPECT_TRUE(s.unsaved.empty());
  EXPECT_EQ(s.queue.size(), 2u);
  EXPECT_TRUE(s.Proposals(2, Ids()).empty());  // the queue already holds two

  RunTrial& first = *queued[0];
  s.MarkLeased(first, 1, "w-a", 100);
  EXPECT_EQ(s.running, 1);
  EXPECT_EQ(s.queue.front(), queued[1]);
  s.Requeue(first);  // lost lease: back to the front
  EXPECT_EQ(s.running, 0);
  EXPECT_EQ(s.queue.front(), &first);
  s.MarkLeased(first, 2, "w-b", 200);

  s.MarkFinal(first, Measured(10, 1), "w-b");
  s.MarkFinal(*queued[1], Measured(5, 2), "");  // e.g. from the results cache, never leased
  EXPECT_EQ(s.done, 2);
  EXPECT_EQ(s.running, 0);
  EXPECT_TRUE(s.queue.empty());
  EXPECT_EQ(first.rec.result->policy().canonical(), "selective:[]");
  EXPECT_EQ(s.Frontier().size(), 2u);

  std::vector<TrialRecord> last = s.Proposals(1, Ids());
  ASSERT_EQ(last.size(), 1u);
  EXPECT_EQ(last[0].policy, "full:uniform:1");
  s.Enqueue(std::move(last));
  s.MarkFinal(*s.queue.front(), Measured(4, 3), "");
  EXPECT_FALSE(s.Outstanding());
  EXPECT_TRUE(s.strategy->Done());

  s.Conclude();
  EXPECT_EQ(s.rec.state, v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_EQ(s.rec.recommendation.value_or(""), "selective:[]");
  EXPECT_EQ(s.rec.frontier.size(), 3u);
  EXPECT_EQ(s.rec.apply.megatron_bridge(),
            "model.recompute_granularity=selective model.recompute_method=null "
            "model.recompute_num_layers=null model.recompute_modules=[]");
  EXPECT_EQ(s.rec.apply.megatron_lm(), "");  // no recompute: leave the flags unset
  EXPECT_TRUE(s.rec.message.empty());
}

// The apply strings are the coordinator's (moved here from the CLI's render test: the CLI no
// longer derives them).
TEST(SearchRunTest, ApplyStringsFollowTheRecommendation) {
  struct Case {
    std::string policy, bridge, lm;
  };
  for (const Case& c : std::vector<Case>{
           {"full:block:2",
            "model.recompute_granularity=full model.recompute_method=block "
            "model.recompute_num_layers=2 model.recompute_modules=null",
            "--recompute-granularity full --recompute-method block --recompute-num-layers 2"},
           {"selective:[core_attn,mlp]",
            "model.recompute_granularity=selective model.recompute_method=null "
            "model.recompute_num_layers=null model.recompute_modules=[core_attn,mlp]",
            "--recompute-granularity selective --recompute-modules core_attn mlp"}}) {
    auto run = NewRun({c.policy});
    SearchRun& s = *run;
    s.Enqueue(s.Proposals(1, Ids()));
    s.MarkFinal(*s.queue.front(), Measured(10, 1), "");
    s.Conclude();
    EXPECT_EQ(s.rec.recommendation.value_or(""), c.policy);
    EXPECT_EQ(s.rec.apply.megatron_bridge(), c.bridge);
    EXPECT_EQ(s.rec.apply.megatron_lm(), c.lm);
  }
}

TEST(SearchRunTest, ConcludeSaysWhyNothingWasRecommended) {
  auto run = NewRun({"selective:[]"}, /*budget_gib=*/1);
  SearchRun& s = *run;
  s.Enqueue(s.Proposals(1, Ids()));
  s.MarkFinal(*s.queue.front(), Measured(10, 1), "");
  s.Conclude();
  EXPECT_EQ(s.rec.state, v1::SEARCH_STATE_SUCCEEDED);
  EXPECT_FALSE(s.rec.recommendation.has_value());
  EXPECT_TRUE(s.rec.apply.megatron_bridge().empty());
  // The nothing-fits message (the CLI renders it and no longer computes it).
  EXPECT_TRUE(absl::StrContains(s.rec.message, "no policy fits")) << s.rec.message;
  EXPECT_TRUE(absl::StrContains(s.rec.message, "closest: selective:[]")) << s.rec.message;
  EXPECT_FALSE(absl::StrContains(s.rec.message, "static memory alone")) << s.rec.message;

  // Static memory alone over the budget: said first, with the settings that can fix it.
  auto big = NewRun({"selective:[]"}, /*budget_gib=*/0.0001);  // SmallSpec's ~1 MiB of state
  big->Enqueue(big->Proposals(1, Ids()));
  big->MarkFinal(*big->queue.front(), Measured(10, 1), "");
  big->Conclude();
  EXPECT_TRUE(absl::StartsWith(big->rec.message, "static memory alone")) << big->rec.message;
  EXPECT_TRUE(absl::StrContains(big->rec.message, "no policy fits")) << big->rec.message;

  auto failed = NewRun({"selective:[]"});
  v1::TrialResult crash;
  crash.set_status(v1::TRIAL_STATUS_FAILED);
  crash.set_message("segfault");
  failed->Enqueue(failed->Proposals(1, Ids()));
  failed->MarkFinal(*failed->queue.front(), crash, "w-a");
  failed->Conclude();
  EXPECT_EQ(failed->rec.state, v1::SEARCH_STATE_FAILED);
  EXPECT_TRUE(absl::StrContains(failed->rec.message, "selective:[]: failed (segfault)"))
      << failed->rec.message;
}

TEST(SearchRunTest, CancelAllEndsEveryOpenTrial) {
  auto run = NewRun({"selective:[]", "selective:[core_attn]"});
  SearchRun& s = *run;
  auto trials = s.Enqueue(s.Proposals(2, Ids()));
  s.MarkLeased(*trials[0], 1, "w-a", 0);
  std::vector<v1::TrialStatus> seen;
  s.CancelAll("cancelled by bob", [&](RunTrial& t) { seen.push_back(t.rec.status); });
  EXPECT_EQ(seen,
            (std::vector<v1::TrialStatus>{v1::TRIAL_STATUS_RUNNING, v1::TRIAL_STATUS_PENDING}));
  for (RunTrial* t : trials) {
    EXPECT_EQ(t->rec.status, v1::TRIAL_STATUS_CANCELLED);
    EXPECT_EQ(t->rec.result->message(), "cancelled by bob");
  }
  EXPECT_FALSE(s.Outstanding());
}

TEST(SearchRunTest, RestoreRebuildsQueueLeasesAndResults) {
  auto run = NewRun({"selective:[]", "selective:[core_attn]", "full:uniform:1", "full:block:1"});
  SearchRun& s = *run;
  std::vector<TrialRecord> records = s.Proposals(4, Ids());
  s.unsaved.clear();
  records[0].status = v1::TRIAL_STATUS_OK;
  records[0].result = Measured(10, 1);
  records[1].status = v1::TRIAL_STATUS_RUNNING;
  records[1].worker_id = "w-gone";
  records[2].status = v1::TRIAL_STATUS_RUNNING;
  records[2].worker_id = "w-here";
  auto fresh = SearchRun::FromRecord(s.rec);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  SearchRun& r = **fresh;
  r.strategy = std::make_unique<ListStrategy>(std::vector<std::string>{
      "selective:[]", "selective:[core_attn]", "full:uniform:1", "full:block:1"});
  ASSERT_TRUE(r.RestoreTrials(std::move(records), [](RunTrial& t) -> absl::StatusOr<bool> {
                 return t.rec.worker_id == "w-here";
               }).ok());
  EXPECT_EQ(r.done, 1);
  EXPECT_EQ(r.running, 1);
  ASSERT_EQ(r.queue.size(), 2u);  // the requeued one keeps its place in proposal order
  EXPECT_EQ(r.queue[0]->rec.policy, "selective:[core_attn]");
  EXPECT_EQ(r.queue[1]->rec.policy, "full:block:1");
  EXPECT_EQ(r.results.size(), 1u);
  EXPECT_TRUE(r.Proposals(4, Ids()).empty());  // the strategy knows all four were proposed

  auto failing = SearchRun::FromRecord(s.rec);
  (*failing)->strategy = std::make_unique<ListStrategy>(std::vector<std::string>{});
  std::vector<TrialRecord> one(1);
  one[0].policy = "selective:[]";
  one[0].status = v1::TRIAL_STATUS_RUNNING;
  EXPECT_FALSE((*failing)
                   ->RestoreTrials(one,
                                   [](RunTrial&) -> absl::StatusOr<bool> {
                                     return absl::UnavailableError("store down");
                                   })
                   .ok());
}

// A scripted strategy that records the re-measure round's pooled runs and, given them, has one
// more policy to propose (as the guided one may: search/planner.h ObserveRemeasured).
class ResumingStrategy : public ListStrategy {
 public:
  ResumingStrategy(std::vector<std::string> policies, std::string after)
      : ListStrategy(std::move(policies)), after_(std::move(after)) {}
  std::vector<search::Candidate> Propose(int max_count) override {
    if (!resumed_) return ListStrategy::Propose(max_count);
    std::vector<search::Candidate> out;
    if (max_count > 0 && !after_proposed_) {
      after_proposed_ = true;
      search::Candidate c;
      c.policy = *search::ParsePolicy(after_);
      out.push_back(c);
    }
    return out;
  }
  void Observe(const search::TrialResult& r) override {
    if (r.policy.ToString() == after_) after_observed_ = true;
    ListStrategy::Observe(r);
  }
  bool Done() const override {
    return resumed_ ? after_observed_ : ListStrategy::Done();
  }
  void ObserveRemeasured(const std::vector<search::TrialResult>& pooled) override {
    ++calls;
    this->pooled = pooled;
    resumed_ = true;
  }
  int calls = 0;
  std::vector<search::TrialResult> pooled;

 private:
  std::string after_;
  bool resumed_ = false, after_proposed_ = false, after_observed_ = false;
};

// The re-measure round's runs reach the strategy pooled, all at once when the last is final
// (whatever order they finish in), and the strategy may go on; a restart hands them over again.
TEST(SearchRunTest, TheStrategySeesTheRemeasuresPooledOnceAllAreIn) {
  auto run = NewRun({"selective:[]", "selective:[core_attn]", "full:uniform:1"});
  SearchRun& s = *run;
  auto owned = std::make_unique<ResumingStrategy>(
      std::vector<std::string>{"selective:[]", "selective:[core_attn]"}, "full:uniform:1");
  ResumingStrategy* strategy = owned.get();
  s.strategy = std::move(owned);
  std::vector<RunTrial*> first = s.Enqueue(s.Proposals(2, Ids()));
  ASSERT_EQ(first.size(), 2u);
  s.MarkFinal(*first[0], Measured(10, 1.0), "");
  s.MarkFinal(*first[1], Measured(8, 2.0), "");
  EXPECT_TRUE(s.strategy->Done());
  // The round (a replayed search has none of its own: its table holds one run per policy).
  s.remeasure_proposed = true;
  std::vector<TrialRecord> again(2);
  for (int i = 0; i < 2; ++i) {
    again[i].id = "again-" + std::to_string(i);
    again[i].search_id = s.rec.id;
    again[i].seq = 2 + i;
    again[i].policy = first[i]->rec.policy;
    again[i].status = v1::TRIAL_STATUS_PENDING;
  }
  std::vector<RunTrial*> round = s.Enqueue(std::move(again));
  ASSERT_TRUE(round[0]->remeasure && round[1]->remeasure);
  s.MarkFinal(*round[1], Measured(8, 3.0), "");  // the second finishes first
  EXPECT_EQ(strategy->calls, 0);
  EXPECT_TRUE(s.Proposals(1, Ids()).empty());
  s.MarkFinal(*round[0], Measured(10, 1.5), "");
  ASSERT_EQ(strategy->calls, 1);
  ASSERT_EQ(strategy->pooled.size(), 2u);
  for (const search::TrialResult& r : strategy->pooled) {
    // Each policy's two runs pooled (medians only here: their median).
    EXPECT_DOUBLE_EQ(r.step_time_s, r.policy.ToString() == "selective:[]" ? 1.25 : 2.5);
  }
  EXPECT_FALSE(s.strategy->Done());
  std::vector<TrialRecord> more = s.Proposals(2, Ids());
  ASSERT_EQ(more.size(), 1u);
  EXPECT_EQ(more[0].policy, "full:uniform:1");
  EXPECT_EQ(s.Proposals(2, Ids()).size(), 1u);  // still unsaved: the same proposal

  // A restart with the round final: the restored strategy is handed the pooled runs again.
  std::vector<TrialRecord> records;
  for (const auto& t : s.trials) records.push_back(t->rec);
  auto fresh = SearchRun::FromRecord(s.rec);
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  auto restored = std::make_unique<ResumingStrategy>(
      std::vector<std::string>{"selective:[]", "selective:[core_attn]"}, "full:uniform:1");
  ResumingStrategy* again_strategy = restored.get();
  (*fresh)->strategy = std::move(restored);
  ASSERT_TRUE((*fresh)
                  ->RestoreTrials(std::move(records),
                                  [](RunTrial&) -> absl::StatusOr<bool> { return true; })
                  .ok());
  EXPECT_EQ(again_strategy->calls, 1);
  EXPECT_EQ(again_strategy->pooled.size(), 2u);
  EXPECT_TRUE((*fresh)->remeasures_observed);
}

TEST(SearchRunTest, UnreadableStoredResultsBecomeFailures) {
  v1::TrialResult bad;
  bad.set_status(v1::TRIAL_STATUS_RUNNING);  // never a stored final result
  search::TrialResult r = ResultToDomain("selective:[]", bad);
  EXPECT_EQ(r.status, search::TrialStatus::kFailed);
  EXPECT_TRUE(absl::StrContains(r.message, "unreadable result")) << r.message;
  EXPECT_EQ(r.policy.ToString(), "selective:[]");
  EXPECT_TRUE(IsFinal(v1::TRIAL_STATUS_OOM));
  EXPECT_FALSE(IsFinal(v1::TRIAL_STATUS_RUNNING));
  EXPECT_TRUE(IsFinished(v1::SEARCH_STATE_CANCELLED));
  EXPECT_FALSE(IsFinished(v1::SEARCH_STATE_RUNNING));
}

}  // namespace
// What a worker reports is checked against the trial's world: final statuses only (the enum's
// named ones), one result per rank, step times that throughput can be divided by.
TEST(SearchRunTest, WireResultsAreCheckedAgainstTheWorld) {
  v1::TrialResult r;
  r.set_status(v1::TRIAL_STATUS_OK);
  r.set_step_time_s(0.5);
  for (int rank : {0, 1, 2, 3}) r.add_ranks()->set_rank(rank);
  EXPECT_TRUE(ValidateWireResult(r, "result", 4).ok());
  EXPECT_FALSE(ValidateWireResult(r, "result", 3).ok());
  v1::TrialResult twice = r;
  twice.mutable_ranks(3)->set_rank(1);
  absl::Status st = ValidateWireResult(twice, "result", 4);
  EXPECT_EQ(st.message(), "result.ranks[3].rank: rank 1 has a result already");
  for (int status : {0, 7, 8, 9, 99, -1, INT32_MAX}) {
    v1::TrialResult bad = r;
    bad.set_status(static_cast<v1::TrialStatus>(status));
    EXPECT_FALSE(ValidateWireResult(bad, "result", 4).ok()) << status;
    EXPECT_FALSE(IsFinal(bad.status())) << status;
  }
  v1::TrialResult oom = r;
  oom.set_status(v1::TRIAL_STATUS_OOM);
  oom.set_step_time_s(0);  // an OOM measured no step
  EXPECT_TRUE(ValidateWireResult(oom, "result", 4).ok());
  for (double step : {1e-320, 1e-9, 1e9}) {
    v1::TrialResult bad = r;
    bad.mutable_ranks(0)->add_step_times_s(step);
    EXPECT_FALSE(ValidateWireResult(bad, "result", 4).ok()) << step;
  }
  v1::TrialResult versions = r;
  (*versions.mutable_versions())["torch"] = std::string(100000, 'v');
  EXPECT_FALSE(ValidateWireResult(versions, "result", 4).ok());
}

}  // namespace remat::server
