// The CPU collectives: results, groups, and failures that end in an error instead of a hang.
// Ranks are threads of this process (each with its own Collectives object).

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "engine/collectives.h"

namespace remat::engine {
namespace {

std::string FreshDir() {
  static int counter = 0;
  auto dir = std::filesystem::temp_directory_path() /
             ("remat-tcp-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// Runs body(rank, collectives) on `world` threads; returns each rank's error ("" if none).
std::vector<std::string> RunRanks(int world, double timeout_s,
                                  const std::function<void(int, Collectives&)>& body,
                                  const std::vector<int>& absent = {}) {
  const std::string dir = FreshDir();
  std::vector<std::string> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    if (std::find(absent.begin(), absent.end(), r) != absent.end()) continue;
    threads.emplace_back([&, r] {
      try {
        CollectivesOptions o;
        o.rank = r;
        o.world_size = world;
        o.rendezvous_dir = dir;
        o.timeout_s = timeout_s;
        auto c = NewTcpCollectives(o);
        body(r, *c);
      } catch (const CollectiveError& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(TcpCollectivesTest, AllReduceAllGatherReduceScatter) {
  const int world = 3;
  auto errors = RunRanks(world, 20, [](int r, Collectives& c) {
    std::vector<float> v = {float(r), float(r + 1)};
    c.AllReduce(c.World(), v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(v, (std::vector<float>{3, 6}));
    std::vector<double> mx = {double(r)};
    c.AllReduce(c.World(), mx.data(), 1, DataType::kFloat64, ReduceOp::kMax);
    EXPECT_EQ(mx[0], 2.0);
    std::vector<int64_t> mine = {r * 10, r * 10 + 1}, all(6);
    c.AllGather(c.World(), mine.data(), all.data(), 2, DataType::kInt64);
    EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 10, 11, 20, 21}));
    std::vector<float> in = {1, 2, 3, 4, 5, 6}, out(2);
    c.ReduceScatter(c.World(), in.data(), out.data(), 2, DataType::kFloat32);
    EXPECT_EQ(out, (std::vector<float>{3.0f * (2 * r + 1), 3.0f * (2 * r + 2)}));
    c.Barrier(c.World());
    c.Synchronize();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TcpCollectivesTest, Bfloat16SumsAndSubgroups) {
  auto errors = RunRanks(4, 20, [](int r, Collectives& c) {
    // Two TP groups {0,1} {2,3} and two DP groups {0,2} {1,3}, as the trial runner builds them.
    Group tp = c.CreateGroup({{0, 1}, {2, 3}});
    Group dp = c.CreateGroup({{0, 2}, {1, 3}});
    EXPECT_EQ(tp.size(), 2);
    EXPECT_EQ(tp.rank, r % 2);
    EXPECT_EQ(dp.rank, r / 2);
    float v = float(r);
    c.AllReduce(tp, &v, 1, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(v, r < 2 ? 1.0f : 5.0f);
    float w = float(r);
    c.AllReduce(dp, &w, 1, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(w, r % 2 == 0 ? 2.0f : 4.0f);
    uint16_t bf = 0x3f80;  // 1.0 in bfloat16
    c.AllReduce(c.World(), &bf, 1, DataType::kBFloat16, ReduceOp::kSum);
    EXPECT_EQ(bf, 0x4080);  // 4.0
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TcpCollectivesTest, AllToAllWithUnevenAndZeroCounts) {
  // Member i sends (i + j) % 3 elements to member j, each valued 100 * i + j; then the same
  // exchange within the subgroups {0, 2} and {1} (a group of one copies).
  const int world = 3;
  auto errors = RunRanks(world, 20, [](int r, Collectives& c) {
    std::vector<size_t> send(world), recv(world);
    std::vector<float> in;
    for (int j = 0; j < world; ++j) {
      send[j] = static_cast<size_t>((r + j) % 3);
      recv[j] = static_cast<size_t>((j + r) % 3);
      for (size_t k = 0; k < send[j]; ++k) in.push_back(float(100 * r + j));
    }
    std::vector<float> out(3, -1.0f);  // each rank receives 0 + 1 + 2 elements
    c.AllToAll(c.World(), in.data(), send, out.data(), recv, DataType::kFloat32);
    std::vector<float> want;
    for (int j = 0; j < world; ++j) {
      for (size_t k = 0; k < recv[j]; ++k) want.push_back(float(100 * j + r));
    }
    EXPECT_EQ(out, want) << "rank " << r;

    Group g = c.CreateGroup({{0, 2}, {1}});
    if (g.size() == 2) {
      // Rank 0 sends nothing at all; rank 2 sends two values to 0 and one to itself.
      std::vector<int64_t> mine = r == 0 ? std::vector<int64_t>{} : std::vector<int64_t>{7, 8, 9};
      std::vector<size_t> s = r == 0 ? std::vector<size_t>{0, 0} : std::vector<size_t>{2, 1};
      std::vector<size_t> rc = r == 0 ? std::vector<size_t>{0, 2} : std::vector<size_t>{0, 1};
      std::vector<int64_t> got(r == 0 ? 2 : 1);
      c.AllToAll(g, mine.data(), s, got.data(), rc, DataType::kInt64);
      EXPECT_EQ(got, r == 0 ? (std::vector<int64_t>{7, 8}) : (std::vector<int64_t>{9}));
    } else {
      std::vector<float> one = {5, 6}, back(2);
      c.AllToAll(g, one.data(), {2}, back.data(), {2}, DataType::kFloat32);
      EXPECT_EQ(back, one);
    }
    c.Synchronize();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST(TcpCollectivesTest, AllToAllWithAMissingPeerTimesOut) {
  const auto start = std::chrono::steady_clock::now();
  auto errors = RunRanks(2, 1.5, [](int r, Collectives& c) {
    if (r == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(4));  // never joins the exchange in time
      return;
    }
    float v = 1, w = 0;
    c.AllToAll(c.World(), &v, {0, 1}, &w, {0, 1}, DataType::kFloat32);
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 15.0);
  EXPECT_NE(errors[0].find("all-to-all"), std::string::npos) << errors[0];
}

TEST(TcpCollectivesTest, MissingRankTimesOutInsteadOfHanging) {
  const auto start = std::chrono::steady_clock::now();
  auto errors = RunRanks(3, 1.5, [](int, Collectives&) {}, /*absent=*/{2});
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 15.0);
  EXPECT_NE(errors[0], "");
  EXPECT_NE(errors[1], "");
}

TEST(TcpCollectivesTest, RankThatLeavesFailsTheOthersPromptly) {
  const auto start = std::chrono::steady_clock::now();
  auto errors = RunRanks(2, 30, [](int r, Collectives& c) {
    if (r == 1) return;  // leaves (says goodbye) without joining the next collective
    float v = 1;
    c.AllReduce(c.World(), &v, 1, DataType::kFloat32, ReduceOp::kSum);
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 15.0);  // far below the 30 s timeout
  EXPECT_NE(errors[0].find("left"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[1], "");
}

PeerTransfer Send(int peer, int tag, std::vector<float>& v) {
  return PeerTransfer{true, peer, tag, v.data(), v.size(), DataType::kFloat32};
}
PeerTransfer Recv(int peer, int tag, std::vector<float>& v) {
  return PeerTransfer{false, peer, tag, v.data(), v.size(), DataType::kFloat32};
}

// A pipeline's traffic on a subgroup: activations go forward, each stage answers with a
// gradient in one exchange with its next stage (Megatron's send_forward_recv_backward), and
// transfers with different tags between one pair match by tag whatever the posting order.
TEST(TcpCollectivesTest, SendRecvAlongAPipeline) {
  auto errors = RunRanks(4, 20, [](int r, Collectives& c) {
    Group pipe = c.CreateGroup({{0, 2, 3}, {1}});
    if (r == 1) return;
    const int p = pipe.rank, last = pipe.size() - 1;
    std::vector<float> act(3, 0), grad(2, 0);
    if (p > 0) {
      c.SendRecv(pipe, {Recv(p - 1, 0, act)});
      for (int i = 0; i < 3; ++i) ASSERT_EQ(act[i], float(10 * (p - 1) + i));
    }
    std::vector<float> out = {float(10 * p), float(10 * p + 1), float(10 * p + 2)};
    if (p < last) {
      c.SendRecv(pipe, {Send(p + 1, 0, out), Recv(p + 1, 1, grad)});
      EXPECT_EQ(grad[0], float(100 + p + 1));
      EXPECT_EQ(grad[1], float(-(p + 1)));
    }
    if (p > 0) {
      std::vector<float> mine = {float(100 + p), float(-p)};
      c.SendRecv(pipe, {Send(p - 1, 1, mine)});
    }
    // Tags: stage 0 posts tag 5 then tag 6; stage 1 takes tag 6 first, in its own call.
    if (p == 0) {
      std::vector<float> five = {5}, six = {6};
      c.SendRecv(pipe, {Send(1, 5, five), Send(1, 6, six)});
    } else if (p == 1) {
      std::vector<float> a(1), b(1);
      c.SendRecv(pipe, {Recv(0, 6, a)});
      c.SendRecv(pipe, {Recv(0, 5, b)});
      EXPECT_EQ(a[0], 6);
      EXPECT_EQ(b[0], 5);
    }
    c.Barrier(pipe);
  });
  for (int r = 0; r < 4; ++r) EXPECT_EQ(errors[r], "") << r;
}

TEST(TcpCollectivesTest, SendRecvFailuresAreErrors) {
  // A receive of the wrong size. (Separate worlds: a rank that fails leaves without saying
  // goodbye, and the hub then fails everyone still waiting with that news instead.)
  auto errors = RunRanks(2, 30, [](int r, Collectives& c) {
    std::vector<float> two = {1, 2}, three(3);
    if (r == 0) c.SendRecv(c.World(), {Send(1, 0, two)});
    if (r == 1) c.SendRecv(c.World(), {Recv(0, 0, three)});
  });
  EXPECT_NE(errors[1].find("matched a send of 8"), std::string::npos) << errors[1];
  // A receive from a rank that left without sending.
  errors = RunRanks(2, 30, [](int r, Collectives& c) {
    std::vector<float> v(1);
    if (r == 1) c.SendRecv(c.World(), {Recv(0, 0, v)});
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_NE(errors[1].find("left"), std::string::npos) << errors[1];
  // A receive nobody answers times out.
  const auto start = std::chrono::steady_clock::now();
  errors = RunRanks(2, 1.5, [](int r, Collectives& c) {
    std::vector<float> v(1);
    if (r == 0) c.SendRecv(c.World(), {Recv(1, 0, v)});
    if (r == 1) std::this_thread::sleep_for(std::chrono::seconds(4));
  });
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(took, 15.0);
  EXPECT_NE(errors[0].find("timed out"), std::string::npos) << errors[0];
}

TEST(TcpCollectivesTest, NoHubIsAnError) {
  auto errors = RunRanks(2, 1, [](int, Collectives&) {}, /*absent=*/{0});
  EXPECT_NE(errors[1].find("no hub"), std::string::npos) << errors[1];
}

}  // namespace
}  // namespace remat::engine
