// The stand-in collectives (engine/collectives.h, NewStandInCollectives): one rank of a world run
// alone fills every output buffer as the real collective would in shape, and records each call on
// a group of more than one rank under the group's name, with the bytes the header defines.

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/collectives.h"

namespace remat::engine {
namespace {

const search::CommRecord* Find(const std::vector<search::CommRecord>& records,
                               const std::string& group, search::CollectiveKind kind) {
  for (const search::CommRecord& r : records) {
    if (r.group == group && r.kind == kind) return &r;
  }
  return nullptr;
}

TEST(StandInCollectivesTest, GroupsHaveTheRealMembership) {
  auto c = NewStandInCollectives(5, 8, -1, 1);
  EXPECT_EQ(c->rank(), 5);
  EXPECT_EQ(c->world_size(), 8);
  const Group tp = c->CreateGroup({{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  EXPECT_EQ(tp.ranks, (std::vector<int>{4, 5}));
  EXPECT_EQ(tp.rank, 1);
  const Group dp = c->CreateGroup({{0, 2, 4, 6}, {1, 3, 5, 7}});
  EXPECT_EQ(dp.ranks, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(dp.rank, 2);
  EXPECT_NE(tp.id, dp.id);
  EXPECT_THROW(c->CreateGroup({{0, 1}}), CollectiveError);
  EXPECT_THROW(NewStandInCollectives(8, 8, -1, 1), std::invalid_argument);
}

// The dispatchers' routing exchange: member k places on gets this rank's routing with every expert
// moved on by k x the experts per rank, so the group's routing, summed, loads every expert rank
// evenly. Member 1 of 3; 6 experts, 2 per expert-parallel rank.
TEST(StandInCollectivesTest, RoutingIsShiftedOverTheExpertRanks) {
  auto c = NewStandInCollectives(1, 3, -1, 1);
  const Group g = c->CreateGroup({{0, 1, 2}});
  c->NameGroup(g, "expert_tp_ep");
  using Routing = Collectives::Routing;
  const std::vector<int64_t> counts = {9, 1, 0, 0, 2, 0};  // this rank's tokens per expert
  std::vector<int64_t> all(18, -1);
  c->AllGatherRouting(g, counts.data(), all.data(), 6, Routing::kCountsPerExpert, 6, 2);
  // Member 1 (this rank) as it is; member 2 one expert rank on; member 0 two on.
  EXPECT_EQ(std::vector<int64_t>(all.begin() + 6, all.begin() + 12), counts);
  EXPECT_EQ(std::vector<int64_t>(all.begin() + 12, all.end()),
            (std::vector<int64_t>{2, 0, 9, 1, 0, 0}));
  EXPECT_EQ(std::vector<int64_t>(all.begin(), all.begin() + 6),
            (std::vector<int64_t>{0, 0, 2, 0, 9, 1}));
  for (int rank = 0; rank < 3; ++rank) {  // 36 rows over the group, 12 per expert rank
    int64_t load = 0;
    for (int m = 0; m < 3; ++m) load += all[m * 6 + 2 * rank] + all[m * 6 + 2 * rank + 1];
    EXPECT_EQ(load, 12) << "expert rank " << rank;
  }
  const std::vector<int64_t> top = {0, 5, 3, 4};  // two tokens, top-2
  std::vector<int64_t> idx(12, -1);
  c->AllGatherRouting(g, top.data(), idx.data(), 4, Routing::kExpertIndices, 6, 2);
  EXPECT_EQ(idx, (std::vector<int64_t>{4, 3, 1, 2, 0, 5, 3, 4, 2, 1, 5, 0}));
  const search::CommRecord* r = Find(c->Records(), "expert_tp_ep", search::CollectiveKind::kAllGather);
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(r->calls, 2);
}

TEST(StandInCollectivesTest, OutputsAreFilledAndCallsRecorded) {
  auto c = NewStandInCollectives(1, 4, -1, 1);
  const Group g = c->CreateGroup({{0, 1}, {2, 3}});
  c->NameGroup(g, "tp");
  at::Tensor in = at::arange(3, at::kFloat) + 1;  // 1 2 3

  at::Tensor gathered = at::zeros({6});
  c->AllGather(g, in.data_ptr(), gathered.data_ptr(), 3, DataType::kFloat32);
  EXPECT_TRUE(gathered.equal(at::cat({in, in})));

  at::Tensor scatter_in = at::arange(6, at::kFloat);
  at::Tensor mine = at::zeros({3});
  c->ReduceScatter(g, scatter_in.data_ptr(), mine.data_ptr(), 3, DataType::kFloat32);
  EXPECT_TRUE(mine.equal(scatter_in.narrow(0, 3, 3)));  // member 1's chunk

  at::Tensor keep = in.clone();
  c->AllReduce(g, keep.data_ptr(), 3, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_TRUE(keep.equal(in));

  // Counts: [to member 0: 5 7, to member 1 (me): 2 4] -> every source sends 2 4.
  at::Tensor counts = at::tensor(std::vector<int64_t>{5, 7, 2, 4}, at::kLong);
  at::Tensor got = at::zeros({4}, at::kLong);
  c->AllToAll(g, counts.data_ptr(), {2, 2}, got.data_ptr(), {2, 2}, DataType::kInt64);
  EXPECT_EQ(std::vector<int64_t>(got.data_ptr<int64_t>(), got.data_ptr<int64_t>() + 4),
            (std::vector<int64_t>{2, 4, 2, 4}));

  // Tokens: 3 rows sent, 5 received: `in` cycled.
  at::Tensor rows = at::zeros({5});
  c->AllToAll(g, in.data_ptr(), {1, 2}, rows.data_ptr(), {2, 3}, DataType::kFloat32);
  EXPECT_TRUE(rows.equal(at::tensor({1.f, 2.f, 3.f, 1.f, 2.f})));

  // Point-to-point: the receive gets N(0, 1)-like values, the send is dropped.
  at::Tensor recv = at::zeros({1000}, at::kBFloat16);
  at::Tensor send = at::ones({7});
  c->SendRecv(g, {PeerTransfer{true, 0, 0, send.data_ptr(), 7, DataType::kFloat32},
                  PeerTransfer{false, 0, 0, recv.data_ptr(), 1000, DataType::kBFloat16}});
  const at::Tensor f = recv.to(at::kFloat);
  EXPECT_GT(f.std().item<double>(), 0.8);
  EXPECT_LT(f.std().item<double>(), 1.2);
  EXPECT_LT(std::abs(f.mean().item<double>()), 0.15);

  // A group of one moves nothing: not recorded.
  Group self;
  self.id = -1;
  self.ranks = {1};
  c->AllReduce(self, keep.data_ptr(), 3, DataType::kFloat32, ReduceOp::kSum);

  const std::vector<search::CommRecord> records = c->Records();
  EXPECT_EQ(records.size(), 5u);
  using K = search::CollectiveKind;
  const search::CommRecord* ag = Find(records, "tp", K::kAllGather);
  ASSERT_NE(ag, nullptr);
  EXPECT_EQ(ag->bytes, 6 * 4);  // the gathered output
  EXPECT_EQ(ag->ranks, (std::vector<int>{0, 1}));
  EXPECT_EQ(Find(records, "tp", K::kReduceScatter)->bytes, 6 * 4);  // the input
  EXPECT_EQ(Find(records, "tp", K::kAllReduce)->bytes, 3 * 4);
  const search::CommRecord* a2a = Find(records, "tp", K::kAllToAll);
  EXPECT_EQ(a2a->calls, 2);
  EXPECT_EQ(a2a->bytes, 4 * 8 + 3 * 4);  // what this rank sends
  EXPECT_EQ(Find(records, "tp", K::kSendRecv)->bytes, 7 * 4);
  c->ResetRecords();
  EXPECT_TRUE(c->Records().empty());
  c->AllReduce(c->World(), keep.data_ptr(), 3, DataType::kFloat32, ReduceOp::kSum);
  ASSERT_EQ(c->Records().size(), 1u);
  EXPECT_EQ(c->Records()[0].group, "world");
}

// In place, as the distributed optimizer calls them: the buffer's own chunk is left alone.
TEST(StandInCollectivesTest, InPlaceGatherAndScatter) {
  auto c = NewStandInCollectives(1, 2, -1, 1);
  const Group g = c->CreateGroup({{0, 1}});
  at::Tensor buf = at::arange(8, at::kFloat);
  float* base = buf.data_ptr<float>();
  c->ReduceScatter(g, base, base + 4, 4, DataType::kFloat32);
  EXPECT_TRUE(buf.equal(at::arange(8, at::kFloat)));
  c->AllGather(g, base + 4, base, 4, DataType::kFloat32);
  EXPECT_TRUE(buf.equal(at::cat({at::arange(4, 8, at::kFloat), at::arange(4, 8, at::kFloat)})));
}

}  // namespace
}  // namespace remat::engine
