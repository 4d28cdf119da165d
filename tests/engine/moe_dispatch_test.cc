// MoE with tensor parallelism and expert tensor parallelism in remat-trial, one process per rank
// over the CPU collectives: TP 2 (sequence parallel) x EP 2 x PP 2 with ETP 1 and ETP 2 (8
// ranks, Megatron's expert grid decoupled from the dense one), under the allgather and the
// alltoall dispatcher, matches the same model on TP 1 / EP 1 / PP 1 (DP 2, the same global
// batch) in loss and gradient norm within 1e-5 (fp32), for the control, moe_act, moe and full
// recompute.

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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
  return std::string(R"(name: tiny-moe-etp
model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  num_query_groups: 2
  ffn_hidden_size: 128
  gated_linear_unit: true
  normalization: RMSNorm
  seq_length: 32
  vocab_size: 256
  attention_dropout: 0.0
  hidden_dropout: 0.0
  add_bias_linear: false
  position_embedding_type: rope
  num_moe_experts: 4
  moe_router_topk: 2
  moe_ffn_hidden_size: 64
  moe_shared_expert_intermediate_size: 32
  moe_token_dispatcher_type: )") +
         dispatcher + "\n  moe_grouped_gemm: " + (grouped ? "true" : "false") + "\nparallel:\n" +
         parallel + R"(train:
  micro_batch_size: 2
  global_batch_size: 8
  precision: fp32
search:
  memory_budget_gib: 1
  warmup_steps: 1
  measure_steps: 1
  device: cpu
)";
}

std::string ExpertGrid(int etp) {
  return "  tensor_model_parallel_size: 2\n  sequence_parallel: true\n"
         "  pipeline_model_parallel_size: 2\n  data_parallel_size: 2\n"
         "  expert_model_parallel_size: 2\n  expert_tensor_parallel_size: " +
         std::to_string(etp) + "\n";
}

void ExpectMatchesOneRankLayout(bool grouped, const std::string& dispatcher, int etp,
                                const std::vector<std::string>& policies) {
  const fs::path dir = testing::TempDir("remat-etp-test");
  const fs::path base_spec =
      WriteSpec(dir, "base.yaml", MoeYaml(grouped, dispatcher, "  data_parallel_size: 2\n"));
  const fs::path grid_spec =
      WriteSpec(dir, "grid.yaml", MoeYaml(grouped, dispatcher, ExpertGrid(etp)));
  for (const std::string& policy : policies) {
    const std::vector<nlohmann::json> base = testing::RunRanks(kTrial, base_spec, policy, 2);
    ASSERT_EQ(base[0]["status"], "ok") << base[0].dump();
    const std::vector<nlohmann::json> ranks = testing::RunRanks(kTrial, grid_spec, policy, 8);
    for (int r = 0; r < 8; ++r) {
      ASSERT_EQ(ranks[r]["status"], "ok") << policy << " " << ranks[r].dump();
      EXPECT_LT(RelDiff(ranks[r]["loss"], base[0]["loss"]), 1e-5)
          << dispatcher << " ETP " << etp << " " << policy << " rank " << r;
      EXPECT_LT(RelDiff(ranks[r]["grad_norm"], base[0]["grad_norm"]), 1e-5)
          << dispatcher << " ETP " << etp << " " << policy << " rank " << r;
      EXPECT_GT(ranks[r]["ranks"][0]["peak_allocated_bytes"].get<double>(), 0);
    }
  }
}

const std::vector<std::string> kPolicies = {"selective:[]", "selective:[moe_act]",
                                            "selective:[moe]", "full:uniform:1"};

TEST(MoeDispatchTest, AllgatherEtp1MatchesOneRank) {
  ExpectMatchesOneRankLayout(true, "allgather", 1, kPolicies);
}

TEST(MoeDispatchTest, AllgatherEtp2MatchesOneRank) {
  ExpectMatchesOneRankLayout(true, "allgather", 2, kPolicies);
}

TEST(MoeDispatchTest, AlltoallEtp1MatchesOneRank) {
  ExpectMatchesOneRankLayout(true, "alltoall", 1, kPolicies);
}

TEST(MoeDispatchTest, AlltoallEtp2MatchesOneRank) {
  ExpectMatchesOneRankLayout(true, "alltoall", 2, kPolicies);
}

// Sequential experts (one MLP per expert, each split over ETP) under both dispatchers.
TEST(MoeDispatchTest, SequentialExpertsMatchOneRank) {
  ExpectMatchesOneRankLayout(false, "alltoall", 2, {"selective:[]"});
  ExpectMatchesOneRankLayout(false, "allgather", 1, {"selective:[moe]"});
}

// Megatron refuses MoE with TP > 1 and no sequence parallelism in training; the trial names it.
TEST(MoeDispatchTest, TensorParallelWithoutSequenceParallelIsInvalid) {
  const fs::path dir = testing::TempDir("remat-etp-test");
  const fs::path spec = WriteSpec(
      dir, "tp2.yaml",
      MoeYaml(true, "alltoall", "  tensor_model_parallel_size: 2\n  expert_model_parallel_size: 2\n"
                                "  expert_tensor_parallel_size: 1\n"));
  const std::vector<nlohmann::json> r = testing::RunRanks(kTrial, spec, "selective:[]", 2, 10);
  EXPECT_EQ(r[0]["status"], "invalid");
  EXPECT_NE(r[0]["message"].get<std::string>().find("parallel.sequence_parallel"),
            std::string::npos)
      << r[0].dump();
}

}  // namespace
}  // namespace remat::engine
