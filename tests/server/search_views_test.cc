// The API views on their own: built from records (finished searches) and from a SearchRun.
#include "server/search_views.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "tests/server/test_util.h"

namespace remat::server {
namespace {

using testing::Entry;
using testing::ListStrategy;
using testing::SmallSpec;
using testing::Submit;

TrialRecord Finished(const std::string& id, const std::string& policy, double reserved_gib,
                     double step_time_s) {
  TrialRecord t;
  t.id = id;
  t.policy = policy;
  t.status = v1::TRIAL_STATUS_OK;
  t.result = Entry(reserved_gib, step_time_s).result();
  t.attempts = 1;
  t.worker_id = "w-a";
  return t;
}

TEST(SearchViewsTest, AStoredSearchWithItsTrialsAndBudgetInBytes) {
  SearchRecord rec;
  rec.id = "s-1";
  rec.owner = "alice";
  rec.state = v1::SEARCH_STATE_SUCCEEDED;
  rec.spec = proto::ToProto(SmallSpec());
  rec.frontier = {"selective:[]"};
  rec.recommendation = "selective:[]";
  rec.created_unix_ms = 1000;
  rec.updated_unix_ms = 4000;
  std::vector<TrialRecord> trials = {Finished("t-1", "selective:[]", 10, 1)};
  TrialRecord pending;
  pending.id = "t-2";
  pending.policy = "full:uniform:1";
  trials.push_back(pending);

  v1::Search view = StoredSearchView(rec, trials);
  EXPECT_EQ(view.owner(), "alice");
  EXPECT_EQ(view.trials_size(), 2);
  EXPECT_EQ(view.trials_done(), 1);
  EXPECT_EQ(view.trials_planned(), 2);  // at least the trials there are
  // What clients render and do not decide.
  EXPECT_EQ(view.memory_budget_bytes(), 80ULL << 30);
  EXPECT_EQ(view.memory_metric(), "reserved");
  EXPECT_EQ(view.fragmentation_size(), 0);
  EXPECT_EQ(view.trials(0).result().policy().canonical(), "selective:[]");

  v1::SearchProgress p = StoredProgressView(rec, trials);
  EXPECT_EQ(p.trials_done(), 1);
  EXPECT_EQ(p.best_policy(), "selective:[]");
  EXPECT_EQ(p.best_peak_bytes(), 10ULL << 30);  // reserved: the spec's memory metric
  EXPECT_DOUBLE_EQ(p.elapsed_s(), 3.0);

  SearchSummaryRecord row{rec, 1};
  row.search.trials_planned = 0;
  v1::SearchSummary sum = SummaryView(row);
  EXPECT_EQ(sum.trials_planned(), 1);
  EXPECT_EQ(sum.recommendation(), "selective:[]");
}

TEST(SearchViewsTest, FragmentationFindingsAndTheMetricComeWithTheSearch) {
  search::SearchSpec spec = SmallSpec();
  spec.search.memory_metric = search::MemoryMetric::kAllocated;
  spec.search.memory_budget_gib = 4;
  SearchRecord rec;
  rec.id = "s-1";
  rec.spec = proto::ToProto(spec);
  rec.state = v1::SEARCH_STATE_SUCCEEDED;
  TrialRecord t = Finished("t-1", "selective:[]", 9, 1);
  t.result->mutable_ranks(0)->set_peak_allocated_bytes(3ULL << 30);  // reserved 9: fragmented
  v1::Search view = StoredSearchView(rec, {t});
  EXPECT_EQ(view.memory_metric(), "allocated");
  EXPECT_EQ(view.memory_budget_bytes(), 4ULL << 30);
  ASSERT_EQ(view.fragmentation_size(), 1);
  EXPECT_TRUE(absl::StrContains(view.fragmentation(0), "selective:[]: rank 0 reserved"))
      << view.fragmentation(0);

  // Allocated (3 GiB) itself over the budget (1.5 GiB): capacity, not fragmentation.
  spec.search.memory_budget_gib = 1.5;
  rec.spec = proto::ToProto(spec);
  view = StoredSearchView(rec, {t});
  ASSERT_EQ(view.fragmentation_size(), 1);
  EXPECT_TRUE(absl::StrContains(view.fragmentation(0), "capacity, not fragmentation"))
      << view.fragmentation(0);
}

TEST(SearchViewsTest, AnActiveSearchShowsWhatWasMeasuredSoFar) {
  auto run = SearchRun::FromRequest("alice", Submit(SmallSpec(), {{"selective:[]", Entry(10, 1)}}));
  ASSERT_TRUE(run.ok());
  SearchRun& s = **run;
  s.rec.id = "s-1";
  s.rec.state = v1::SEARCH_STATE_RUNNING;
  s.rec.created_unix_ms = 0;
  s.strategy = std::make_unique<ListStrategy>(
      std::vector<std::string>{"selective:[]", "full:uniform:1", "full:block:1", "full:block:2"});
  int n = 0;
  auto trials = s.Enqueue(s.Proposals(2, [&] { return "t-" + std::to_string(n++); }));
  s.MarkFinal(*trials[0], Entry(10, 1).result(), "w-a");

  v1::Search view = ActiveSearchView(s);
  EXPECT_EQ(view.trials_planned(), 4);
  EXPECT_EQ(view.trials_done(), 1);
  EXPECT_EQ(view.recommendation(), "selective:[]");
  EXPECT_FALSE(view.apply().megatron_bridge().empty());

  v1::SearchProgress p = ProgressView(s, trials[0], 10'000);
  EXPECT_EQ(p.last_trial().id(), "t-0");
  EXPECT_EQ(p.best_policy(), "selective:[]");
  EXPECT_DOUBLE_EQ(p.elapsed_s(), 10.0);
  EXPECT_DOUBLE_EQ(p.eta_s(), 30.0);  // 10 s per trial, three to go
}

}  // namespace
}  // namespace remat::server
