// The megatron executor's control flow, with tests/worker/fake_megatron_driver.py (the driver's
// real mapping and metrics writer, no torch) and, for refusals and a missing Megatron Core, the
// real driver (worker/megatron_driver/remat_megatron_driver.py), which refuses before it imports
// torch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "tests/worker/test_util.h"
#include "worker/megatron_executor.h"

namespace remat::worker {
namespace {

using search::TrialStatus;
using testing::ReadText;
using testing::TempDir;

v1::TrialAssignment MegatronAssignment(const std::string& mode, int world,
                                       const std::string& policy = "selective:[core_attn]",
                                       double timeout_s = 30) {
  v1::TrialAssignment a;
  a.set_trial_id("t-9");
  a.set_search_id("s-3");
  a.set_attempt(1);
  a.set_world_size(world);
  a.mutable_policy()->set_canonical(policy);
  v1::SearchSpec* spec = a.mutable_spec();
  spec->set_name(mode);
  v1::ModelSpec* m = spec->mutable_model();
  m->set_num_layers(4);
  m->set_hidden_size(64);
  m->set_num_attention_heads(4);
  m->set_seq_length(128);
  m->set_vocab_size(1000);
  m->set_add_bias_linear(false);
  spec->mutable_train()->set_micro_batch_size(2);
  spec->mutable_parallel()->set_data_parallel_size(world);
  spec->mutable_search()->set_backend("megatron");
  spec->mutable_search()->set_trial_timeout_s(timeout_s);
  spec->mutable_search()->set_warmup_steps(2);
  spec->mutable_search()->set_measure_steps(3);
  return a;
}

std::vector<Slot> GpuSlots(int n) {
  std::vector<Slot> slots;
  for (int i = 0; i < n; ++i) {
    Slot s;
    s.index = 3 + i;
    s.gpu = true;
    s.name = "GPU";
    slots.push_back(s);
  }
  return slots;
}

class MegatronTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "python3 not installed";
    setenv("REMAT_SOURCE_DIR", REMAT_SOURCE_DIR, 1);
  }
  search::TrialResult Run(const v1::TrialAssignment& a, bool real_driver = false,
                          const std::string& megatron_path = "/opt/megatron-lm") {
    MegatronExecutorOptions options;
    options.python = "/usr/bin/python3";
    options.driver = real_driver
                         ? std::string(REMAT_SOURCE_DIR) +
                               "/worker/megatron_driver/remat_megatron_driver.py"
                         : std::string(REMAT_SOURCE_DIR) + "/tests/worker/fake_megatron_driver.py";
    options.megatron_path = megatron_path;
    options.limits.kill_grace_s = 0.3;
    options.limits.peer_failure_grace_s = 0.5;
    options.limits.peer_exit_grace_s = 3;
    auto executor = MakeMegatronExecutor(options);
    assignment_ = ToAssignment(a);
    TrialContext context;
    context.assignment = &assignment_;
    context.slots = GpuSlots(a.world_size());
    context.trial_dir = dir_.path();
    return executor->Run(context);
  }
  worker::Assignment assignment_;
  TempDir dir_;
};

TEST_F(MegatronTest, RanksWriteTheDriversMetricsAndTheWorkerCombinesThem) {
  search::TrialResult r = Run(MegatronAssignment("ok", 2));
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[1].rank, 1);
  EXPECT_EQ(r.ranks[0].peak_allocated_bytes, 4500u);
  EXPECT_EQ(r.ranks[1].peak_reserved_bytes, 8600u);
  EXPECT_EQ(r.ranks[0].static_bytes, 400u);
  EXPECT_NEAR(r.step_time_s, 0.4, 1e-9);  // warm-up steps dropped
  EXPECT_DOUBLE_EQ(r.loss, 7.5);           // the first measured step
  EXPECT_DOUBLE_EQ(r.grad_norm, 1.5);
  EXPECT_DOUBLE_EQ(r.setup_s, 2.25);       // the slowest rank's
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 2.0 * 2 * 128 / 0.4);
  // The spec reached the driver's mapping with the policy as Megatron settings.
  EXPECT_NE(r.message.find("layers=4 recompute_granularity=selective "
                           "recompute_modules=[core_attn]"),
            std::string::npos)
      << r.message;
  const std::string log = ReadText(dir_ / "stderr-1.log");
  EXPECT_NE(log.find("megatron-path /opt/megatron-lm"), std::string::npos) << log;
  EXPECT_NE(log.find("CUDA_VISIBLE_DEVICES=4"), std::string::npos) << log;
  EXPECT_NE(ReadText(dir_ / "spec.json").find("\"num_layers\":4"), std::string::npos);
}

TEST_F(MegatronTest, DepthProxiesRunTheCutSpecAndPredictTheFullDepth) {
  v1::TrialAssignment a = MegatronAssignment("ok", 1, "full:uniform:1");
  a.mutable_spec()->mutable_model()->set_num_layers(8);
  a.mutable_spec()->mutable_search()->add_proxy_layers(2);
  a.mutable_spec()->mutable_search()->add_proxy_layers(4);
  search::TrialResult r = Run(a);
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  EXPECT_TRUE(r.predicted);
  ASSERT_EQ(r.ranks.size(), 1u);
  EXPECT_EQ(r.ranks[0].peak_allocated_bytes, 8500u);  // 1000 per layer + 500
  EXPECT_NEAR(r.step_time_s, 0.8, 1e-9);
  EXPECT_NE(ReadText(dir_ / "depth-2/spec.json").find("\"num_layers\":2"), std::string::npos);
  // Both depths' processes are recorded where a restarted worker looks: the trial folder.
  const std::string record = ReadText(dir_ / ".remat-group");
  EXPECT_EQ(std::count(record.begin(), record.end(), '\n'), 2) << record;
}

TEST_F(MegatronTest, OomInARanksFileIsOom) {
  search::TrialResult r = Run(MegatronAssignment("oom", 2));
  EXPECT_EQ(r.status, TrialStatus::kOom) << r.message;
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[0].failing_request_bytes, 1610612736u);
}

TEST_F(MegatronTest, ARankOutOfMemoryWhosePeerHangsIsOomOnceThePeerIsEnded) {
  search::TrialResult r = Run(MegatronAssignment("oomhang", 2));  // peer_exit_grace_s 3
  EXPECT_EQ(r.status, TrialStatus::kOom) << r.message;
  // Worded by the one per-rank collector (worker/rank_collector.h), as for remat-trial.
  EXPECT_NE(r.message.find("rank 1: killed after rank 0 had finished"), std::string::npos)
      << r.message;
}

TEST_F(MegatronTest, ACrashWithOutOfMemoryInItsLogIsOom) {
  search::TrialResult r = Run(MegatronAssignment("crash", 1));
  EXPECT_EQ(r.status, TrialStatus::kOom) << r.message;
  EXPECT_NE(r.message.find("rank 0: driver exited with status 1"), std::string::npos) << r.message;
}

TEST_F(MegatronTest, ARankWithoutAFileIsFailedWithItsStderr) {
  search::TrialResult r = Run(MegatronAssignment("fail", 2));
  EXPECT_EQ(r.status, TrialStatus::kFailed) << r.message;
  EXPECT_NE(r.message.find("rank 1: driver exited with status 3"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("boom"), std::string::npos) << r.message;
}

TEST_F(MegatronTest, TimeoutKillsTheRanks) {
  search::TrialResult r = Run(MegatronAssignment("hang", 2, "selective:[core_attn]", 1.5));
  EXPECT_EQ(r.status, TrialStatus::kTimeout) << r.message;
}

TEST_F(MegatronTest, ANoOpLabelIsInvalidBeforeAnythingRuns) {
  search::TrialResult r = Run(MegatronAssignment("ok", 1, "selective:[moe]"));
  EXPECT_EQ(r.status, TrialStatus::kInvalid) << r.message;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "stderr-0.log"));
}

TEST_F(MegatronTest, TheRealDriverRefusesWhatItCannotMapWithTheReason) {
  v1::TrialAssignment a = MegatronAssignment("real", 1);
  a.mutable_spec()->mutable_model()->set_attention_backend("flash");
  search::TrialResult r = Run(a, /*real_driver=*/true);
  EXPECT_EQ(r.status, TrialStatus::kInvalid) << r.message;
  EXPECT_NE(r.message.find("model.attention_backend"), std::string::npos) << r.message;
}

TEST_F(MegatronTest, TheRealDriverWithoutMegatronCoreIsFailedSayingSo) {
  search::TrialResult r = Run(MegatronAssignment("real", 1), /*real_driver=*/true,
                              dir_ / "no-megatron-here");
  EXPECT_EQ(r.status, TrialStatus::kFailed) << r.message;
  EXPECT_NE(r.message.find("no megatron/core package"), std::string::npos) << r.message;
}

}  // namespace
}  // namespace remat::worker
