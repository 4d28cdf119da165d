#include "worker/result_combiner.h"

#include <gtest/gtest.h>

namespace remat::worker {
namespace {

v1::TrialAssignment Assignment(int world) {
  v1::TrialAssignment a;
  a.set_trial_id("t-1");
  a.mutable_policy()->set_canonical("selective:[core_attn]");
  a.set_world_size(world);
  a.mutable_spec()->mutable_model()->set_seq_length(1000);
  a.mutable_spec()->mutable_train()->set_micro_batch_size(2);
  a.mutable_spec()->mutable_parallel()->set_data_parallel_size(world);
  return a;
}

v1::TrialResult Rank(int rank, v1::TrialStatus status, double step, uint64_t alloc,
                     const std::string& message = "") {
  v1::TrialResult r;
  r.set_status(status);
  r.set_step_time_s(step);
  r.set_step_time_spread_s(step / 10);
  r.set_loss(1.0 + rank);
  r.set_message(message);
  v1::RankResult* rr = r.add_ranks();
  rr->set_rank(rank);
  rr->set_peak_allocated_bytes(alloc);
  rr->set_peak_reserved_bytes(alloc * 2);
  return r;
}

TEST(ResultCombiner, SortsRanksTakesTheSlowestStepAndRecomputesThroughput) {
  v1::TrialResult c = CombineRankResults(Assignment(2), {Rank(1, v1::TRIAL_STATUS_OK, 0.5, 300),
                                                         Rank(0, v1::TRIAL_STATUS_OK, 0.4, 200)});
  EXPECT_EQ(c.status(), v1::TRIAL_STATUS_OK);
  ASSERT_EQ(c.ranks_size(), 2);
  EXPECT_EQ(c.ranks(0).rank(), 0);
  EXPECT_EQ(c.ranks(1).rank(), 1);
  EXPECT_EQ(c.ranks(1).peak_reserved_bytes(), 600u);
  EXPECT_DOUBLE_EQ(c.step_time_s(), 0.5);
  EXPECT_DOUBLE_EQ(c.step_time_spread_s(), 0.05);
  EXPECT_DOUBLE_EQ(c.tokens_per_s(), 2.0 * 1000 * 2 / 0.5);
  EXPECT_DOUBLE_EQ(c.loss(), 1.0);  // rank 0's
  EXPECT_EQ(c.policy().canonical(), "selective:[core_attn]");
}

TEST(ResultCombiner, TheWorstStatusWins) {
  v1::TrialResult c = CombineRankResults(
      Assignment(2), {Rank(0, v1::TRIAL_STATUS_FAILED, 0, 0, "collective timed out"),
                      Rank(1, v1::TRIAL_STATUS_OOM, 0, 100, "out of memory")});
  EXPECT_EQ(c.status(), v1::TRIAL_STATUS_OOM);
  EXPECT_EQ(c.message(), "rank 0: collective timed out; rank 1: out of memory");
  EXPECT_DOUBLE_EQ(c.tokens_per_s(), 0);

  c = CombineRankResults(Assignment(2), {Rank(0, v1::TRIAL_STATUS_OK, 0.1, 1),
                                         Rank(1, v1::TRIAL_STATUS_FAILED, 0, 0, "crashed")});
  EXPECT_EQ(c.status(), v1::TRIAL_STATUS_FAILED);
  EXPECT_EQ(c.message(), "rank 1: crashed");
}

TEST(ResultCombiner, SeverityOrder) {
  EXPECT_LT(StatusSeverity(v1::TRIAL_STATUS_OK), StatusSeverity(v1::TRIAL_STATUS_FAILED));
  EXPECT_LT(StatusSeverity(v1::TRIAL_STATUS_FAILED), StatusSeverity(v1::TRIAL_STATUS_OOM));
  EXPECT_LT(StatusSeverity(v1::TRIAL_STATUS_OOM), StatusSeverity(v1::TRIAL_STATUS_INVALID));
  EXPECT_LT(StatusSeverity(v1::TRIAL_STATUS_INVALID), StatusSeverity(v1::TRIAL_STATUS_TIMEOUT));
  EXPECT_LT(StatusSeverity(v1::TRIAL_STATUS_TIMEOUT), StatusSeverity(v1::TRIAL_STATUS_CANCELLED));
}

TEST(ResultCombiner, MissingRanksMakeAnOkTrialFail) {
  v1::TrialResult c = CombineRankResults(Assignment(2), {Rank(0, v1::TRIAL_STATUS_OK, 0.1, 1)});
  EXPECT_EQ(c.status(), v1::TRIAL_STATUS_FAILED);
  EXPECT_NE(c.message().find("1 of 2 ranks"), std::string::npos);
}

TEST(ResultCombiner, NonFinalRankStatusCountsAsFailed) {
  v1::TrialResult c =
      CombineRankResults(Assignment(1), {Rank(0, v1::TRIAL_STATUS_UNSPECIFIED, 0.1, 1)});
  EXPECT_EQ(c.status(), v1::TRIAL_STATUS_FAILED);
}

TEST(ResultCombiner, MergesDepthProxiesOfAllRanks) {
  std::vector<v1::TrialResult> per_rank;
  for (int rank : {1, 0}) {
    v1::TrialResult r = Rank(rank, v1::TRIAL_STATUS_OK, 0.5 + rank, 100 * (rank + 1));
    r.set_predicted(true);
    for (int depth : {2, 4}) {
      v1::ProxyMeasurement* p = r.add_proxies();
      p->set_num_layers(depth);
      p->set_step_time_s(0.1 * depth + rank);
      v1::RankResult* rr = p->add_ranks();
      rr->set_rank(rank);
      rr->set_peak_allocated_bytes(depth * 10 + rank);
    }
    per_rank.push_back(r);
  }
  v1::TrialResult c = CombineRankResults(Assignment(2), per_rank);
  EXPECT_TRUE(c.predicted());
  ASSERT_EQ(c.proxies_size(), 2);
  EXPECT_EQ(c.proxies(0).num_layers(), 2);
  EXPECT_EQ(c.proxies(1).num_layers(), 4);
  ASSERT_EQ(c.proxies(1).ranks_size(), 2);
  EXPECT_EQ(c.proxies(1).ranks(0).rank(), 0);
  EXPECT_EQ(c.proxies(1).ranks(1).peak_allocated_bytes(), 41u);
  EXPECT_DOUBLE_EQ(c.proxies(1).step_time_s(), 1.4);  // the slower rank
}

TEST(ResultCombiner, TokensPerSecondFollowsTheContract) {
  v1::SearchSpec spec;
  spec.mutable_model()->set_seq_length(4096);
  EXPECT_DOUBLE_EQ(TokensPerSecond(spec, 0.5), 4096 / 0.5);  // unset mbs and dp default to 1
  spec.mutable_train()->set_micro_batch_size(2);
  spec.mutable_parallel()->set_data_parallel_size(4);
  EXPECT_DOUBLE_EQ(TokensPerSecond(spec, 2.0), 2 * 4096 * 4 / 2.0);
  EXPECT_DOUBLE_EQ(TokensPerSecond(spec, 0), 0);
}

}  // namespace
}  // namespace remat::worker
