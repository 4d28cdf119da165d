// The results-cache key: what joins two trials and what keeps them apart.
#include "server/cache_key.h"

#include <gtest/gtest.h>

#include "proto/convert.h"
#include "tests/server/test_util.h"

namespace remat::server {
namespace {

using testing::Entry;
using testing::SmallSpec;
using testing::Worker;

class CacheKeyTest : public ::testing::Test {
 protected:
  std::string Key(const search::SearchSpec& spec, const std::string& policy = "selective:[]",
                  const v1::RegisterRequest& worker = Worker(1),
                  const v1::ReplayEntry* replay = nullptr) {
    return ResultsCacheKey(proto::ToProto(spec), policy, worker, replay);
  }
  search::SearchSpec base_ = SmallSpec("base");
};

TEST_F(CacheKeyTest, IgnoresWhatCannotChangeAMeasurement) {
  const std::string key = Key(base_);
  search::SearchSpec other = base_;
  other.name = "renamed";
  other.search.strategy = search::StrategyKind::kExhaustive;
  other.search.max_trials = 7;
  other.search.objective = search::Objective::kRecommend;
  other.search.memory_headroom_gib = 3;
  other.search.memory_metric = search::MemoryMetric::kAllocated;
  other.search.trial_timeout_s = 5;
  other.search.replay_table = "elsewhere.json";
  EXPECT_EQ(Key(other), key);
  // A node of 8 such GPUs measures a trial like a node of 1.
  EXPECT_EQ(Key(base_, "selective:[]", Worker(8)), key);
}

TEST_F(CacheKeyTest, SeparatesWhatCanChangeAMeasurement) {
  const std::string key = Key(base_);
  auto differs = [&](auto change) {
    search::SearchSpec s = base_;
    change(s);
    return Key(s) != key;
  };
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.model.hidden_size = 128; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.train.seed = 99; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.train.micro_batch_size = 2; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.parallel.tensor_model_parallel_size = 2; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.search.memory_budget_gib = 40; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.search.warmup_steps = 9; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.search.measure_steps = 9; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.search.warmup_max_steps = 9; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.search.steady_window = 2; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.search.steady_tolerance = 0.1; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.search.backend = search::Backend::kBuiltin; }));
  EXPECT_TRUE(differs([](search::SearchSpec& s) { s.search.device = search::Device::kCpu; }));
  EXPECT_NE(Key(base_, "full:uniform:1"), key);
  EXPECT_NE(Key(base_, "selective:[]", Worker(1, "NVIDIA H100")), key);
  EXPECT_NE(Key(base_, "selective:[]", Worker(1, "NVIDIA H200", 1)), key);
  v1::RegisterRequest newer = Worker(1);
  (*newer.mutable_versions())["torch"] = "2.4.0";
  EXPECT_NE(Key(base_, "selective:[]", newer), key);
  const v1::ReplayEntry a = Entry(10, 1), b = Entry(11, 1);
  EXPECT_NE(Key(base_, "selective:[]", Worker(1), &a), Key(base_, "selective:[]", Worker(1), &b));
  EXPECT_EQ(Key(base_, "selective:[]", Worker(1), &a), Key(base_, "selective:[]", Worker(1), &a));
}

TEST_F(CacheKeyTest, HardwareSignatureListsGpuKinds) {
  v1::RegisterRequest w = Worker(2);
  v1::Gpu* other = w.add_gpus();
  other->set_name("NVIDIA H100");
  other->set_memory_bytes(80);
  EXPECT_EQ(HardwareSignature(w), "NVIDIA H100/80,NVIDIA H200/150000000000");
}

}  // namespace
}  // namespace remat::server
