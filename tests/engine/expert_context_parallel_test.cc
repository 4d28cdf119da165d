// Expert parallelism together with context parallelism in remat-trial (Mixtral 8x22B's published
// layout combines them: TP 2, CP 2, EP 8), one process per rank over the CPU collectives.
//
// Megatron lays the expert grid etp-ep-edp-pp over the same ranks as the dense grid tp-cp-dp-pp
// (Megatron-LM megatron/core/parallel_state.py at d98e8a6), so an expert group may hold ranks of
// different CP positions: their tokens are different parts of the same sequences, which the MoE
// layer (per token) does not mind. Checked here: the loss and gradient norm of CP 2 x EP 2 (the
// EP group is the CP pair), TP 2 + SP x CP 2 x EP 2 with ETP 1 (the EP group is the TP pair) and
// ETP 2 (the ETP x EP block spans both CP ranks), and TP 2 + SP x CP 2 x DP 2 x EP 4 (the EP
// group spans CP and DP) equal those of the same model on one rank (on DP 2 ranks for the last,
// each data-parallel rank drawing its own tokens) within 1e-5 (fp32), under both
// dispatchers and policies that replay the exchanges; and every rank run alone with the stand-in
// collectives (a layout proxy) within 2% of its allocated peak in the real trial.

#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/trial_runner.h"
#include "search/policy.h"
#include "search/spec.h"
#include "specfile/spec_file.h"
#include "tests/engine/proxy_check.h"
#include "tests/engine/test_models.h"
#include "tests/engine/test_process.h"

namespace remat::engine {
namespace {

namespace fs = std::filesystem;

using testing::RelDiff;

const std::string kTrial = REMAT_TRIAL_PATH;

// The tiny dense model with 4 experts (top-2, 64 wide, grouped GEMM) and a shared expert on both
// of its 2 layers, sequence `seq`, fp32, micro-batches of 2, global batch 4. Megatron runs CP
// only with Transformer Engine's attention (flash); the one-rank base runs the engine's unfused
// attention, the same mathematics (as tests/engine/context_parallel_test.cc).
std::string Yaml(int seq, const std::string& dispatcher, const std::string& attention,
                 const std::string& parallel) {
  return "name: tiny-ep-cp\n" +
         testing::TinyRankModelYaml(
             2, seq,
             "  num_moe_experts: 4\n  moe_router_topk: 2\n  moe_ffn_hidden_size: 64\n"
             "  moe_shared_expert_intermediate_size: 32\n  moe_grouped_gemm: true\n"
             "  moe_token_dispatcher_type: " + dispatcher + "\n  attention_backend: " +
                 attention + "\n") +
         "train:\n  micro_batch_size: 2\n  global_batch_size: 4\n  precision: fp32\n"
         "parallel:\n" + (parallel.empty() ? "  tensor_model_parallel_size: 1\n" : parallel) +
         "search:\n  memory_budget_gib: 1\n  warmup_steps: 1\n  warmup_max_steps: 1\n"
         "  steady_window: 1\n  measure_steps: 1\n  noise_target: 0\n  device: cpu\n";
}

const std::string kCp2Ep2 = "  context_parallel_size: 2\n  expert_model_parallel_size: 2\n";

std::string TpCpEp(int etp) {
  return "  tensor_model_parallel_size: 2\n  sequence_parallel: true\n"
         "  context_parallel_size: 2\n  expert_model_parallel_size: 2\n"
         "  expert_tensor_parallel_size: " + std::to_string(etp) + "\n";
}

// One rank (DP ranks) with the same global batch under `policy`: without expert parallelism both
// dispatchers run the same operations, so one run serves them all (the tests share it).
// With DP > 1 the base has the same DP: each data-parallel rank draws its own tokens.
const nlohmann::json& Base(const std::string& policy, int dp) {
  static std::map<std::string, nlohmann::json> cache;
  const std::string key = policy + " dp " + std::to_string(dp);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const std::string parallel = "  data_parallel_size: " + std::to_string(dp) + "\n";
  const fs::path spec = testing::WriteSpec(testing::TempDir("remat-ep-cp"), "base.yaml",
                                           Yaml(32, "alltoall", "unfused", parallel));
  return cache[key] = testing::RunRanks(kTrial, spec, policy, dp)[0];
}

// The layout `parallel` (`world` ranks) against one rank with the same global batch: the same
// loss and gradient norm on every rank, for each policy.
void ExpectMatchesOneRank(const std::string& name, const std::string& dispatcher,
                          const std::string& parallel, int world,
                          const std::vector<std::string>& policies) {
  const std::string yaml = Yaml(32, dispatcher, "flash", parallel);
  // The layout is one the builtin engine accepts (no refusal left for EP with CP).
  auto parsed = spec::ParseSpecYaml(yaml);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_EQ(search::BuiltinBackendProblem(*parsed), "") << name;
  const fs::path grid = testing::WriteSpec(testing::TempDir("remat-ep-cp"), name + ".yaml", yaml);
  for (const std::string& policy : policies) {
    const nlohmann::json& base = Base(policy, parsed->parallel.data_parallel_size);
    const std::vector<nlohmann::json> want = {base};
    ASSERT_EQ(want[0]["status"], "ok") << want[0].dump();
    const std::vector<nlohmann::json> got = testing::RunRanks(kTrial, grid, policy, world);
    for (int r = 0; r < world; ++r) {
      const nlohmann::json& res = got[r];
      ASSERT_EQ(res["status"], "ok")
          << name << " " << policy << " rank " << r << ": " << res.dump();
      EXPECT_LT(RelDiff(res["loss"], want[0]["loss"]), 1e-5)
          << name << " " << policy << " rank " << r << ": " << res["loss"] << " vs "
          << want[0]["loss"];
      EXPECT_LT(RelDiff(res["grad_norm"], want[0]["grad_norm"]), 1e-5)
          << name << " " << policy << " rank " << r << ": " << res["grad_norm"] << " vs "
          << want[0]["grad_norm"];
      EXPECT_GT(res["ranks"][0]["peak_allocated_bytes"].get<double>(),
                res["ranks"][0]["static_bytes"].get<double>());
    }
  }
}

TEST(ExpertContextParallelTest, Cp2Ep2MatchesOneRank) {
  ExpectMatchesOneRank("cp2-ep2-a2a", "alltoall", kCp2Ep2, 2,
                       {"selective:[moe]", "full:uniform:1"});
  ExpectMatchesOneRank("cp2-ep2-ag", "allgather", kCp2Ep2, 2, {"selective:[moe_act,core_attn]"});
}

TEST(ExpertContextParallelTest, TensorParallelEtp1MatchesOneRank) {
  ExpectMatchesOneRank("tp2-cp2-ep2-etp1", "alltoall", TpCpEp(1), 4, {"selective:[moe_act]"});
  ExpectMatchesOneRank("tp2-cp2-ep2-etp1-ag", "allgather", TpCpEp(1), 4, {"full:uniform:1"});
}

TEST(ExpertContextParallelTest, TensorParallelEtp2MatchesOneRank) {
  ExpectMatchesOneRank("tp2-cp2-ep2-etp2", "alltoall", TpCpEp(2), 4, {"selective:[moe]"});
  ExpectMatchesOneRank("tp2-cp2-ep2-etp2-ag", "allgather", TpCpEp(2), 4, {"selective:[]"});
}

// Mixtral's shape in small: the EP group crosses CP and DP ranks (expert-DP groups of 2).
TEST(ExpertContextParallelTest, ExpertGroupAcrossContextAndDataParallelMatchesOneRank) {
  ExpectMatchesOneRank("tp2-cp2-dp2-ep4", "alltoall",
                       "  tensor_model_parallel_size: 2\n  sequence_parallel: true\n"
                       "  context_parallel_size: 2\n  data_parallel_size: 2\n"
                       "  expert_model_parallel_size: 4\n  expert_tensor_parallel_size: 1\n",
                       8, {"selective:[moe_act]"});
}

// Layout proxies: each rank of the real trial run alone with the stand-in collectives
// (tests/engine/proxy_check.h); 512 tokens per rank and micro-batch or more, so that a
// stand-in's routing (its peers route as it does, shifted over the expert ranks) is within the
// routing's noise (docs/layout-proxies.md).
void ExpectProxiesMatch(const std::string& name, const std::string& dispatcher, int seq,
                        const std::string& parallel, const std::string& text) {
  testing::ExpectStandInsMatchRealTrial(kTrial, Yaml(seq, dispatcher, "flash", parallel), text,
                                        {name, 0.02, {}});
}

TEST(ExpertContextParallelTest, LayoutProxiesMatchTheRealTrial) {
  ExpectProxiesMatch("cp2-ep2", "alltoall", 512, kCp2Ep2, "selective:[]");
  ExpectProxiesMatch("tp2-cp2-ep2-etp1", "alltoall", 1024, TpCpEp(1), "selective:[moe_act]");
}

// With ETP 2 the ETP x EP block is all four ranks: in the real trial each rank's experts see the
// block's gathered tokens. Were a stand-in's peers copies of it, its own experts would carry its
// routing noise four times over (4.3% above the real peak, measured); with the peers' routing
// shifted over the expert ranks (engine/collectives.h AllGatherRouting) every expert rank gets
// an even share.
TEST(ExpertContextParallelTest, LayoutProxiesWithExpertTensorParallelMatchTheRealTrial) {
  ExpectProxiesMatch("tp2-cp2-ep2-etp2", "allgather", 2048, TpCpEp(2), "selective:[]");
}

}  // namespace
}  // namespace remat::engine
