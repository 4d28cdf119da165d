// Expert parallelism in remat-trial, one process per rank over the CPU collectives: a tiny MoE
// with DP = 2 split into EP = 2 (two experts per rank, tokens exchanged by all-to-all) matches the
// same model with EP = 1 in loss and gradient norm, under the recompute labels that touch the MoE
// layer and full recompute, for grouped and sequential experts; each rank reports its own peak.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/engine/test_models.h"
#include "tests/engine/test_process.h"

namespace remat::engine {
namespace {

namespace fs = std::filesystem;

using testing::RelDiff;
using testing::WriteSpec;
fs::path TempDir() { return testing::TempDir("remat-ep-test"); }

const std::string kTrial = REMAT_TRIAL_PATH;

// hidden 64, 4 experts, top-2, 2 MoE layers, seq 64, fp32, dropout 0; `train` adds train: lines.
std::string MoeYaml(bool grouped, const std::string& parallel, const std::string& train = "") {
  return testing::TinyRankSpecYaml(
      "tiny-moe-ep", testing::TinyRankModelYaml(2, 64, testing::TinyRankMoeLines(grouped)),
      "  micro_batch_size: 2\n" + train, parallel, "  noise_target: 0\n");
}

std::vector<nlohmann::json> RunRanks(const fs::path& spec, const std::string& policy, int world) {
  return testing::RunRanks(kTrial, spec, policy, world);
}

void ExpectExpertParallelMatches(bool grouped, const std::vector<std::string>& policies) {
  const fs::path dir = TempDir();
  const fs::path dp2 = WriteSpec(dir, "dp2.yaml", MoeYaml(grouped, "  data_parallel_size: 2\n"));
  const fs::path ep2 = WriteSpec(
      dir, "ep2.yaml",
      MoeYaml(grouped, "  data_parallel_size: 2\n  expert_model_parallel_size: 2\n"));
  for (const std::string& policy : policies) {
    const std::vector<nlohmann::json> base = RunRanks(dp2, policy, 2);
    ASSERT_EQ(base[0]["status"], "ok") << base[0].dump();
    const std::vector<nlohmann::json> ep = RunRanks(ep2, policy, 2);
    for (int r = 0; r < 2; ++r) {
      const nlohmann::json& res = ep[r];
      ASSERT_EQ(res["status"], "ok") << policy << " " << res.dump();
      EXPECT_LT(RelDiff(res["loss"], base[0]["loss"]), 1e-5) << policy << " rank " << r;
      EXPECT_LT(RelDiff(res["grad_norm"], base[0]["grad_norm"]), 1e-5) << policy << " rank " << r;
      // Each rank reports its own peak; half the experts live on each rank, so the expert
      // weights, gradients and Adam states are halved against EP = 1.
      ASSERT_EQ(res["ranks"].size(), 1u);
      EXPECT_EQ(res["ranks"][0]["rank"], r);
      EXPECT_GT(res["ranks"][0]["peak_allocated_bytes"].get<double>(), 0);
      EXPECT_LT(res["ranks"][0]["static_bytes"].get<double>(),
                base[r]["ranks"][0]["static_bytes"].get<double>());
    }
  }
}

TEST(ExpertParallelTest, GroupedExpertsMatchOneExpertRank) {
  ExpectExpertParallelMatches(
      true, {"selective:[]", "selective:[moe_act]", "selective:[moe]", "full:uniform:1"});
}

TEST(ExpertParallelTest, SequentialExpertsMatchOneExpertRank) {
  ExpectExpertParallelMatches(false, {"selective:[]", "selective:[moe,shared_experts]"});
}

// Expert parallelism inside pipeline stages (EP 2 x DP 2 x PP 2, one MoE layer per stage, two
// micro-batches per step): the EP and expert-data-parallel groups stay within a stage, and the
// run matches DP 2 without EP or PP.
TEST(ExpertParallelTest, ExpertParallelInsidePipelineStagesMatches) {
  const fs::path dir = TempDir();
  const std::string batch = "  global_batch_size: 8\n";
  const fs::path dp2 = WriteSpec(dir, "dp2.yaml", MoeYaml(true, "  data_parallel_size: 2\n", batch));
  const fs::path ep_pp = WriteSpec(
      dir, "ep2pp2.yaml",
      MoeYaml(true, "  data_parallel_size: 2\n  expert_model_parallel_size: 2\n"
                    "  pipeline_model_parallel_size: 2\n", batch));
  for (const std::string policy : {"selective:[]", "selective:[moe]"}) {
    const std::vector<nlohmann::json> base = RunRanks(dp2, policy, 2);
    ASSERT_EQ(base[0]["status"], "ok") << base[0].dump();
    const std::vector<nlohmann::json> ranks = RunRanks(ep_pp, policy, 4);
    for (int r = 0; r < 4; ++r) {
      ASSERT_EQ(ranks[r]["status"], "ok") << policy << " " << ranks[r].dump();
      EXPECT_LT(RelDiff(ranks[r]["loss"], base[0]["loss"]), 1e-5) << policy << " rank " << r;
      EXPECT_LT(RelDiff(ranks[r]["grad_norm"], base[0]["grad_norm"]), 1e-5) << policy << " rank " << r;
    }
  }
}

}  // namespace
}  // namespace remat::engine
