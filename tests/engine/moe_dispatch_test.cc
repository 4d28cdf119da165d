// MoE with tensor parallelism and expert tensor parallelism in remat-trial, one process per rank
// over the CPU collectives: TP 2 (sequence parallel) x EP 2 x PP 2 with ETP 1 and ETP 2 (8
// ranks, Megatron's expert grid decoupled from the dense one), under the allgather and the
// alltoall dispatcher, matches the same model on TP 1 / EP 1 / PP 1 (DP 2, the same global
// batch) in loss and gradient norm within 1e-5 (fp32), for the control, moe_act, moe and full
// recompute, each under each dispatcher and each ETP.

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
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

const std::string kTrial = REMAT_TRIAL_PATH;

// hidden 64, 4 experts (top-2, 64 wide) with a shared expert, 2 MoE layers, seq 32, fp32,
// dropout 0, 8 sequences a step in micro-batches of 2.
std::string MoeYaml(bool grouped, const std::string& dispatcher, const std::string& parallel) {
  const std::string moe = testing::TinyRankMoeLines(grouped, dispatcher);
  return testing::TinyRankSpecYaml("tiny-moe-etp", testing::TinyRankModelYaml(2, 32, moe),
      "  micro_batch_size: 2\n  global_batch_size: 8\n", parallel);
}

// The TP 1 / EP 1 / PP 1 run of a policy: without expert or tensor parallelism both dispatchers
// run the same operations, so one run serves them all (the tests share it).
const nlohmann::json& Base(bool grouped, const std::string& policy) {
  static std::map<std::string, nlohmann::json> cache;
  const std::string key = (grouped ? "grouped " : "sequential ") + policy;
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const fs::path spec = WriteSpec(testing::TempDir("remat-etp-test"), "base.yaml",
                                  MoeYaml(grouped, "allgather", "  data_parallel_size: 2\n"));
  return cache[key] = testing::RunRanks(kTrial, spec, policy, 2)[0];
}

void ExpectMatchesOneRankLayout(bool grouped, const std::string& dispatcher, int etp,
                                const std::vector<std::string>& policies) {
  const fs::path grid_spec = WriteSpec(testing::TempDir("remat-etp-test"), "grid.yaml",
                                       MoeYaml(grouped, dispatcher, testing::ExpertGridYaml(etp)));
  for (const std::string& policy : policies) {
    const nlohmann::json& base = Base(grouped, policy);
    ASSERT_EQ(base["status"], "ok") << base.dump();
    const std::vector<nlohmann::json> ranks = testing::RunRanks(kTrial, grid_spec, policy, 8);
    for (int r = 0; r < 8; ++r) {
      ASSERT_EQ(ranks[r]["status"], "ok") << policy << " " << ranks[r].dump();
      EXPECT_LT(RelDiff(ranks[r]["loss"], base["loss"]), 1e-5)
          << dispatcher << " ETP " << etp << " " << policy << " rank " << r;
      EXPECT_LT(RelDiff(ranks[r]["grad_norm"], base["grad_norm"]), 1e-5)
          << dispatcher << " ETP " << etp << " " << policy << " rank " << r;
      EXPECT_GT(ranks[r]["ranks"][0]["peak_allocated_bytes"].get<double>(), 0);
    }
  }
}

// Each policy runs under each dispatcher and each ETP once (8 ranks are slow on 2 cores); every
// policy under every (dispatcher, ETP) was checked too (engine/README.md).
TEST(MoeDispatchTest, AllgatherEtp1MatchesOneRank) {
  ExpectMatchesOneRankLayout(true, "allgather", 1, {"selective:[]", "selective:[moe]"});
}

TEST(MoeDispatchTest, AllgatherEtp2MatchesOneRank) {
  ExpectMatchesOneRankLayout(true, "allgather", 2, {"selective:[moe_act]", "full:uniform:1"});
}

TEST(MoeDispatchTest, AlltoallEtp1MatchesOneRank) {
  ExpectMatchesOneRankLayout(true, "alltoall", 1, {"selective:[moe_act]", "full:uniform:1"});
}

TEST(MoeDispatchTest, AlltoallEtp2MatchesOneRank) {
  ExpectMatchesOneRankLayout(true, "alltoall", 2, {"selective:[]", "selective:[moe]"});
}

// Sequential experts (one MLP per expert, each split over ETP) under both dispatchers.
TEST(MoeDispatchTest, SequentialExpertsMatchOneRank) {
  ExpectMatchesOneRankLayout(false, "alltoall", 2, {"selective:[]"});
  ExpectMatchesOneRankLayout(false, "allgather", 1, {"selective:[moe]"});
}

// Megatron refuses MoE with TP > 1 and no sequence parallelism in training: a spec error (exit 2)
// naming the field.
TEST(MoeDispatchTest, TensorParallelWithoutSequenceParallelIsRefused) {
  const fs::path dir = testing::TempDir("remat-etp-test");
  const fs::path spec = WriteSpec(
      dir, "tp2.yaml",
      MoeYaml(true, "alltoall", "  tensor_model_parallel_size: 2\n  expert_model_parallel_size: 2\n"
                                "  expert_tensor_parallel_size: 1\n"));
  const testing::Output o =
      testing::Sh(kTrial + " --spec " + spec.string() + " --policy 'selective:[]' --rank 0" +
                  " --world-size 2 --rendezvous " + dir.string() + " --json 2>&1");
  EXPECT_EQ(o.exit_code, 2) << o.out;
  EXPECT_NE(o.out.find("error: parallel.sequence_parallel:"), std::string::npos) << o.out;
}

}  // namespace
}  // namespace remat::engine
