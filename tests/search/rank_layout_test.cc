#include "search/rank_layout.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace remat::search {
namespace {

using Groups = std::vector<std::vector<int>>;

ParallelSpec Layout(int tp, int cp, int dp, int pp, int ep = 1) {
  ParallelSpec p;
  p.tensor_model_parallel_size = tp;
  p.context_parallel_size = cp;
  p.data_parallel_size = dp;
  p.pipeline_model_parallel_size = pp;
  p.expert_model_parallel_size = ep;
  return p;
}

// Every rank of the world in exactly one group, each group of `size` ranks.
void ExpectPartition(const Groups& groups, int world, int size) {
  std::multiset<int> seen;
  for (const auto& g : groups) {
    EXPECT_EQ(static_cast<int>(g.size()), size);
    seen.insert(g.begin(), g.end());
  }
  ASSERT_EQ(static_cast<int>(seen.size()), world);
  for (int r = 0; r < world; ++r) EXPECT_EQ(seen.count(r), 1u) << r;
}

TEST(RankLayoutTest, PlaceFollowsMegatronsOrderTpCpDpPp) {
  const ParallelSpec p = Layout(2, 2, 3, 2);  // 24 ranks, 12 per stage
  EXPECT_EQ(RanksPerStage(p), 12);
  for (int r = 0; r < p.WorldSize(); ++r) {
    const RankPlace at = PlaceOf(p, r);
    EXPECT_EQ(at.tp + 2 * (at.cp + 2 * (at.dp + 3 * at.pp)), r);
    EXPECT_EQ(at.pp, r / RanksPerStage(p));
  }
  const RankPlace at = PlaceOf(p, 13);  // the second stage's second rank
  EXPECT_EQ(at.tp, 1);
  EXPECT_EQ(at.cp, 0);
  EXPECT_EQ(at.dp, 0);
  EXPECT_EQ(at.pp, 1);
}

TEST(RankLayoutTest, GroupsOfTpDpPp) {
  const ParallelSpec p = Layout(2, 1, 2, 2);  // TP 2 x DP 2 x PP 2
  const ParallelGroups g = GroupsOf(p);
  EXPECT_EQ(g.tp, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.dp, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.pp, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_TRUE(g.ep.empty());
  EXPECT_TRUE(g.expert_dp.empty());
}

TEST(RankLayoutTest, ContextParallelSitsBetweenTpAndDp) {
  const ParallelSpec p = Layout(2, 2, 2, 1);
  const ParallelGroups g = GroupsOf(p);
  EXPECT_EQ(g.cp, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.dp, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // Megatron's dp-cp group: the ranks of a stage with the same TP rank (gradients go over it).
  EXPECT_EQ(g.dp_cp, (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  ExpectPartition(g.tp, 8, 2);
}

TEST(RankLayoutTest, ExpertGroupsAreBlocksOfAStageAndTheirReplicas) {
  const ParallelSpec p = Layout(1, 1, 4, 2, /*ep=*/2);  // EP 2 carved out of DP 4, PP 2
  const ParallelGroups g = GroupsOf(p);
  EXPECT_EQ(g.ep, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.expert_dp, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

// Megatron's expert grid etp-ep-edp-pp, decoupled from the dense grid: TP 2 x DP 2 x PP 2 with
// EP 2 and ETP 1 or 2 (the layouts of tests/engine/moe_dispatch_test.cc).
TEST(RankLayoutTest, ExpertTensorParallelGridIsDecoupledFromTheDenseOne) {
  ParallelSpec p = Layout(2, 1, 2, 2, /*ep=*/2);
  p.sequence_parallel = true;
  p.expert_tensor_parallel_size = 1;
  ParallelGroups g = GroupsOf(p);
  EXPECT_EQ(g.expert_tp, (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(g.ep, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.expert_tp_ep, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.expert_dp, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  p.expert_tensor_parallel_size = std::nullopt;  // ETP = TP = 2
  g = GroupsOf(p);
  EXPECT_EQ(g.expert_tp, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(g.ep, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(g.expert_tp_ep, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(g.expert_dp, (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // EP 1, ETP 1 under TP 2: the experts are whole on every rank of a stage.
  p.expert_model_parallel_size = 1;
  p.expert_tensor_parallel_size = 1;
  g = GroupsOf(p);
  EXPECT_EQ(g.ep, (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(g.expert_dp, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
}

TEST(RankLayoutTest, EveryKindPartitionsABigWorld) {
  const ParallelSpec p = Layout(8, 2, 8, 16, /*ep=*/8);  // 2,048 ranks
  const ParallelGroups g = GroupsOf(p);
  const int world = p.WorldSize();
  ExpectPartition(g.tp, world, 8);
  ExpectPartition(g.cp, world, 2);
  ExpectPartition(g.dp, world, 8);
  ExpectPartition(g.dp_cp, world, 16);
  ExpectPartition(g.pp, world, 16);
  ExpectPartition(g.ep, world, 8);
  // ETP defaults to TP (8): the expert-DP groups hold the stage's 128 ranks / (ETP 8 x EP 8).
  ExpectPartition(g.expert_tp, world, 8);
  ExpectPartition(g.expert_tp_ep, world, 64);
  ExpectPartition(g.expert_dp, world, 2);
  // A stage's ranks never share a pipeline group; a pipeline group has one rank per stage.
  for (const auto& group : g.pp) {
    for (size_t s = 0; s < group.size(); ++s) EXPECT_EQ(PlaceOf(p, group[s]).pp, static_cast<int>(s));
  }
}

}  // namespace
}  // namespace remat::search
