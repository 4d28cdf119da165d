#include "worker/result_combiner.h"

#include <gtest/gtest.h>

namespace remat::worker {
namespace {

using search::TrialStatus;

Assignment MakeAssignment(int world) {
  v1::TrialAssignment a;
  a.set_trial_id("t-1");
  a.mutable_policy()->set_canonical("selective:[core_attn]");
  a.set_world_size(world);
  a.mutable_spec()->mutable_model()->set_seq_length(1000);
  a.mutable_spec()->mutable_train()->set_micro_batch_size(2);
  a.mutable_spec()->mutable_parallel()->set_data_parallel_size(world);
  return ToAssignment(a);
}

search::TrialResult Rank(int rank, TrialStatus status, double step, uint64_t alloc,
                         const std::string& message = "") {
  search::TrialResult r;
  r.status = status;
  r.step_time_s = step;
  r.step_time_spread_s = step / 10;
  r.loss = 1.0 + rank;
  r.message = message;
  search::RankResult& rr = r.ranks.emplace_back();
  rr.rank = rank;
  rr.peak_allocated_bytes = alloc;
  rr.peak_reserved_bytes = alloc * 2;
  return r;
}

TEST(ResultCombiner, SortsRanksTakesTheSlowestStepAndRecomputesThroughput) {
  search::TrialResult c = CombineRankResults(
      MakeAssignment(2), {Rank(1, TrialStatus::kOk, 0.5, 300), Rank(0, TrialStatus::kOk, 0.4, 200)});
  EXPECT_EQ(c.status, TrialStatus::kOk);
  ASSERT_EQ(c.ranks.size(), 2u);
  EXPECT_EQ(c.ranks[0].rank, 0);
  EXPECT_EQ(c.ranks[1].rank, 1);
  EXPECT_EQ(c.ranks[1].peak_reserved_bytes, 600u);
  EXPECT_DOUBLE_EQ(c.step_time_s, 0.5);
  EXPECT_DOUBLE_EQ(c.step_time_spread_s, 0.05);
  EXPECT_DOUBLE_EQ(c.tokens_per_s, 2.0 * 1000 * 2 / 0.5);
  EXPECT_DOUBLE_EQ(c.loss, 1.0);  // rank 0's
}

TEST(ResultCombiner, TheWorstStatusWins) {
  search::TrialResult c = CombineRankResults(
      MakeAssignment(2), {Rank(0, TrialStatus::kFailed, 0, 0, "collective timed out"),
                          Rank(1, TrialStatus::kOom, 0, 100, "out of memory")});
  EXPECT_EQ(c.status, TrialStatus::kOom);
  EXPECT_EQ(c.message, "rank 0: collective timed out; rank 1: out of memory");
  EXPECT_DOUBLE_EQ(c.tokens_per_s, 0);

  c = CombineRankResults(MakeAssignment(2), {Rank(0, TrialStatus::kOk, 0.1, 1),
                                             Rank(1, TrialStatus::kFailed, 0, 0, "crashed")});
  EXPECT_EQ(c.status, TrialStatus::kFailed);
  EXPECT_EQ(c.message, "rank 1: crashed");
}

TEST(ResultCombiner, SeverityOrder) {
  EXPECT_LT(StatusSeverity(TrialStatus::kOk), StatusSeverity(TrialStatus::kFailed));
  EXPECT_LT(StatusSeverity(TrialStatus::kFailed), StatusSeverity(TrialStatus::kOom));
  EXPECT_LT(StatusSeverity(TrialStatus::kOom), StatusSeverity(TrialStatus::kInvalid));
  EXPECT_LT(StatusSeverity(TrialStatus::kInvalid), StatusSeverity(TrialStatus::kTimeout));
  EXPECT_LT(StatusSeverity(TrialStatus::kTimeout), StatusSeverity(TrialStatus::kCancelled));
}

TEST(ResultCombiner, MissingRanksMakeAnOkTrialFail) {
  search::TrialResult c =
      CombineRankResults(MakeAssignment(2), {Rank(0, TrialStatus::kOk, 0.1, 1)});
  EXPECT_EQ(c.status, TrialStatus::kFailed);
  EXPECT_NE(c.message.find("1 of 2 ranks"), std::string::npos);
}

TEST(ResultCombiner, NonFinalRankStatusCountsAsFailed) {
  // A rank's file is read with ResultFromWire: a status that is not final reads as failed.
  v1::TrialResult file;
  file.set_status(v1::TRIAL_STATUS_UNSPECIFIED);
  file.set_step_time_s(0.1);
  file.add_ranks()->set_peak_allocated_bytes(1);
  search::TrialResult c = CombineRankResults(MakeAssignment(1), {ResultFromWire(file)});
  EXPECT_EQ(c.status, TrialStatus::kFailed);
  file.set_status(v1::TRIAL_STATUS_RUNNING);
  EXPECT_EQ(ResultFromWire(file).status, TrialStatus::kFailed);
}

TEST(ResultCombiner, MergesDepthProxiesOfAllRanks) {
  std::vector<search::TrialResult> per_rank;
  for (int rank : {1, 0}) {
    search::TrialResult r = Rank(rank, TrialStatus::kOk, 0.5 + rank, 100 * (rank + 1));
    r.predicted = true;
    for (int depth : {2, 4}) {
      search::ProxyMeasurement& p = r.proxies.emplace_back();
      p.num_layers = depth;
      p.step_time_s = 0.1 * depth + rank;
      search::RankResult& rr = p.ranks.emplace_back();
      rr.rank = rank;
      rr.peak_allocated_bytes = depth * 10 + rank;
    }
    per_rank.push_back(r);
  }
  search::TrialResult c = CombineRankResults(MakeAssignment(2), per_rank);
  EXPECT_TRUE(c.predicted);
  ASSERT_EQ(c.proxies.size(), 2u);
  EXPECT_EQ(c.proxies[0].num_layers, 2);
  EXPECT_EQ(c.proxies[1].num_layers, 4);
  ASSERT_EQ(c.proxies[1].ranks.size(), 2u);
  EXPECT_EQ(c.proxies[1].ranks[0].rank, 0);
  EXPECT_EQ(c.proxies[1].ranks[1].peak_allocated_bytes, 41u);
  EXPECT_DOUBLE_EQ(c.proxies[1].step_time_s, 1.4);  // the slower rank
}

// A layout proxy is one process whose result lists every rank of the layout (search/
// layout_proxy.h): its stage proxies stay one per role even at equal depths, in pipeline order
// (stage 10 after stage 2), and its message is not pinned on "rank 0".
TEST(ResultCombiner, KeepsALayoutProxysStagesAndItsMessage) {
  search::TrialResult r;
  r.status = TrialStatus::kOk;
  r.predicted = true;
  r.step_time_s = 2;
  r.message = "layout proxy: 4 of 12 pipeline stages measured";
  for (int rank = 0; rank < 12; ++rank) r.ranks.emplace_back().rank = rank;
  for (int stage : {0, 1, 10, 11}) {
    search::ProxyMeasurement& p = r.proxies.emplace_back();
    p.role = "stage " + std::to_string(stage);
    p.rank = stage;
    p.num_layers = 8;
    p.ranks.emplace_back().rank = stage;
  }
  Assignment assignment = MakeAssignment(1);
  assignment.spec.search.layout_proxy = true;
  search::TrialResult c = CombineRankResults(assignment, {r});
  EXPECT_EQ(c.status, TrialStatus::kOk);
  EXPECT_EQ(c.ranks.size(), 12u);
  EXPECT_EQ(c.message, "layout proxy: 4 of 12 pipeline stages measured");
  ASSERT_EQ(c.proxies.size(), 4u);
  EXPECT_EQ(c.proxies[2].role, "stage 10");
  EXPECT_EQ(c.proxies[2].rank, 10);
  EXPECT_EQ(c.proxies[3].role, "stage 11");
}

}  // namespace
}  // namespace remat::worker
