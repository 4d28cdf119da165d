// Context parallelism in remat-trial, one process per rank over the TCP collectives: every
// cp_comm_type the engine runs (p2p ring, a2a Ulysses, allgather) gives the loss and gradient norm
// of the same model without context parallelism within the contract's tolerance (1e-5 relative,
// fp32), under recompute policies that replay the attention's exchanges, alone and combined with
// data, tensor (+ sequence) and pipeline parallelism; every rank reports its own peaks.

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/engine/test_models.h"
#include "tests/engine/test_process.h"

namespace remat::engine {
namespace {

namespace fs = std::filesystem;

using testing::RelDiff;

const std::string kTrial = REMAT_TRIAL_PATH;

// The tiny dense model (4 heads in 2 query groups, RoPE), sequence 32, with its model lines
// `edits` set (a spec names each key once); `train` and `parallel` are the sections' lines.
using ModelEdits = std::vector<std::pair<std::string, std::string>>;

std::string Yaml(const ModelEdits& edits, const std::string& train, const std::string& parallel) {
  std::string model = testing::TinyRankModelYaml(4, 32);
  for (const auto& [key, value] : edits) {
    const std::string prefix = "  " + key + ": ";
    const size_t at = model.find(prefix);
    model = at == std::string::npos
                ? model + prefix + value + "\n"
                : model.replace(at, model.find('\n', at) - at, prefix + value);
  }
  return testing::TinyRankSpecYaml("tiny-cp", model, train, parallel);
}

std::vector<nlohmann::json> Run(const fs::path& spec, const std::string& policy, int world) {
  if (world == 1) return {testing::RunAlone(kTrial, spec, policy)};
  return testing::RunRanks(kTrial, spec, policy, world, 60);
}

// `cp_parallel` (a layout with context parallelism, `cp_world` ranks) against `base_parallel`
// (the same layout without it, `base_world` ranks): the same loss and gradient norm on every rank.
// Megatron runs context parallelism only with Transformer Engine's attention (the spec says
// flash); the base runs the engine's unfused attention, the same mathematics.
void ExpectMatches(const std::string& name, const std::string& base_parallel, int base_world,
                   const std::string& cp_parallel, int cp_world,
                   const std::vector<std::string>& policies,
                   const std::string& train = "  micro_batch_size: 2\n",
                   ModelEdits edits = {}) {
  const fs::path dir = testing::TempDir("remat-cp");
  const fs::path base = testing::WriteSpec(dir, "base.yaml", Yaml(edits, train, base_parallel));
  edits.emplace_back("attention_backend", "flash");
  const fs::path cp = testing::WriteSpec(dir, name + ".yaml", Yaml(edits, train, cp_parallel));
  for (const std::string& policy : policies) {
    const std::vector<nlohmann::json> want = Run(base, policy, base_world);
    ASSERT_EQ(want[0]["status"], "ok") << want[0].dump();
    const std::vector<nlohmann::json> got = Run(cp, policy, cp_world);
    for (size_t r = 0; r < got.size(); ++r) {
      const nlohmann::json& res = got[r];
      ASSERT_EQ(res["status"], "ok") << name << " " << policy << " rank " << r << ": " << res.dump();
      EXPECT_LT(RelDiff(res["loss"], want[0]["loss"]), 1e-5)
          << name << " " << policy << " rank " << r << ": " << res["loss"] << " vs "
          << want[0]["loss"];
      EXPECT_LT(RelDiff(res["grad_norm"], want[0]["grad_norm"]), 1e-5)
          << name << " " << policy << " rank " << r << ": " << res["grad_norm"] << " vs "
          << want[0]["grad_norm"];
      const nlohmann::json& mine = res["ranks"][0];
      EXPECT_EQ(mine["rank"], r);
      EXPECT_GT(mine["peak_allocated_bytes"].get<double>(), mine["static_bytes"].get<double>());
    }
  }
}

const std::vector<std::string> kPolicies = {"selective:[]", "selective:[core_attn]",
                                            "full:uniform:1"};

TEST(ContextParallelTest, RingAttentionMatchesOneRank) {
  ExpectMatches("p2p", "", 1, "  context_parallel_size: 2\n  cp_comm_type: p2p\n", 2, kPolicies);
}

TEST(ContextParallelTest, UlyssesAllToAllMatchesOneRank) {
  ExpectMatches("a2a", "", 1, "  context_parallel_size: 2\n  cp_comm_type: a2a\n", 2, kPolicies);
}

TEST(ContextParallelTest, KvAllGatherMatchesOneRank) {
  ExpectMatches("allgather", "", 1, "  context_parallel_size: 2\n  cp_comm_type: allgather\n", 2,
                kPolicies);
}

// Four CP ranks: the ring's steps of every kind (first key chunk, second query chunk) and the
// chunk reordering of a2a and allgather beyond two ranks.
TEST(ContextParallelTest, FourRanksMatchOneRank) {
  for (const char* type : {"p2p", "a2a", "allgather"}) {
    // a2a splits the heads over CP: 4 query groups (MHA) so that each rank gets one.
    const ModelEdits mha = {{"num_query_groups", "4"}};
    ExpectMatches(std::string("cp4-") + type, "", 1,
                  std::string("  context_parallel_size: 4\n  cp_comm_type: ") + type + "\n", 4,
                  {"selective:[]"}, "  micro_batch_size: 2\n",
                  std::string(type) == "a2a" ? mha : ModelEdits{});
  }
}

// Learned absolute positions (the position table is cut with the tokens) and LayerNorm/GELU/biases.
TEST(ContextParallelTest, LearnedPositionsMatchOneRank) {
  ExpectMatches("learned", "", 1, "  context_parallel_size: 2\n", 2, {"selective:[]"},
                "  micro_batch_size: 2\n",
                {{"position_embedding_type", "learned_absolute"},
                 {"normalization", "LayerNorm"},
                 {"gated_linear_unit", "false"},
                 {"add_bias_linear", "true"}});
}

// Gradients are reduced over Megatron's dp-cp group, the loss averaged over it: CP 2 x DP 2
// against DP 2 (the same tokens per data-parallel rank), with the distributed optimizer too.
TEST(ContextParallelTest, WithDataParallelMatchesDataParallelAlone) {
  ExpectMatches("cp2-dp2", "  data_parallel_size: 2\n", 2,
                "  data_parallel_size: 2\n  context_parallel_size: 2\n", 4, {"selective:[]"});
  ExpectMatches("cp2-dp2-dist", "  data_parallel_size: 2\n", 2,
                "  data_parallel_size: 2\n  context_parallel_size: 2\n", 4, {"selective:[]"},
                "  micro_batch_size: 2\n  use_distributed_optimizer: true\n");
}

// NVIDIA's large layouts combine CP with TP (+ SP) and pipelining: TP 2 x CP 2 x PP 2, 8 ranks,
// 4 micro-batches, against one rank with the same global batch.
TEST(ContextParallelTest, WithTensorAndPipelineParallelMatchesOneRank) {
  ExpectMatches("tp2-cp2-pp2", "", 1,
                "  tensor_model_parallel_size: 2\n  sequence_parallel: true\n"
                "  context_parallel_size: 2\n  pipeline_model_parallel_size: 2\n",
                8, {"selective:[core_attn]", "full:uniform:1"},
                "  micro_batch_size: 2\n  global_batch_size: 8\n");
}

}  // namespace
}  // namespace remat::engine
