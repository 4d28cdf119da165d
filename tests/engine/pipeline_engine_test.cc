// Several micro-batches per step and pipeline parallelism in remat-trial, one process per rank
// over the TCP collectives: gradient accumulation matches one big micro-batch, and every
// pipeline layout (1F1B, interleaved, with TP) matches the 1-rank run's loss and gradient norm
// within the contract's tolerance (1e-5 relative, fp32), every rank reporting its own peaks.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "search/memory_model.h"
#include "search/policy.h"
#include "search/spec.h"
#include "specfile/spec_file.h"
#include "tests/engine/test_models.h"
#include "tests/engine/test_process.h"

namespace remat::engine {
namespace {

namespace fs = std::filesystem;

using testing::RelDiff;

const std::string kTrial = REMAT_TRIAL_PATH;

// A tiny dense model; `train` and `parallel` are YAML lines added to their sections.
std::string Yaml(const std::string& train, const std::string& parallel, int layers = 4) {
  return testing::TinyRankSpecYaml("tiny-pp", testing::TinyRankModelYaml(layers, 32), train,
                                   parallel, "  noise_target: 0\n");
}

nlohmann::json RunOne(const fs::path& spec, const std::string& policy) {
  return testing::RunAlone(kTrial, spec, policy);
}

// Gradient accumulation: 4 micro-batches of 2 sequences give the loss and gradient norm of one
// micro-batch of 8 (the same tokens: a step's tokens are drawn at once), within fp32 tolerance.
TEST(PipelineEngineTest, GradientAccumulationMatchesOneBigMicrobatch) {
  const fs::path dir = testing::TempDir("remat-pipeline");
  const fs::path big = testing::WriteSpec(dir, "big.yaml", Yaml("  micro_batch_size: 8\n", ""));
  const fs::path acc = testing::WriteSpec(
      dir, "acc.yaml", Yaml("  micro_batch_size: 2\n  global_batch_size: 8\n", ""));
  for (const std::string policy : {"selective:[]", "full:uniform:1"}) {
    const nlohmann::json one = RunOne(big, policy);
    const nlohmann::json four = RunOne(acc, policy);
    ASSERT_EQ(one["status"], "ok") << one.dump();
    ASSERT_EQ(four["status"], "ok") << four.dump();
    EXPECT_LT(RelDiff(four["loss"], one["loss"]), 1e-5) << policy;
    EXPECT_LT(RelDiff(four["grad_norm"], one["grad_norm"]), 1e-5) << policy;
    // A quarter of the activations in flight: the accumulated step peaks lower.
    EXPECT_LT(four["peak_allocated_bytes"].get<double>(), one["peak_allocated_bytes"].get<double>());
    // tokens/s counts the whole global batch.
    EXPECT_NEAR(four["tokens_per_s"].get<double>() * four["step_time_s"].get<double>(), 8 * 32,
                1e-6);
  }
}

std::vector<nlohmann::json> RunRanks(const fs::path& spec, const std::string& policy, int world) {
  return testing::RunRanks(kTrial, spec, policy, world, 60);
}

// Pipeline layouts against the 1-rank run with the same global batch (4 micro-batches): the same
// loss and gradient norm on every rank (the last stage's loss, the norm over all stages), and
// every rank's own peaks. `stages` is the pipeline size; ranks are TP-major (Megatron's order).
void ExpectPipelineMatchesOneRank(const std::string& name, const std::string& parallel, int world,
                                  int stages, const std::vector<std::string>& policies,
                                  bool tied = false, int layers = 4) {
  const fs::path dir = testing::TempDir("remat-pipeline");
  std::string train = "  micro_batch_size: 2\n  global_batch_size: 8\n";
  std::string yaml_one = Yaml(train, "", layers), yaml_pp = Yaml(train, parallel, layers);
  if (tied) {
    for (std::string* y : {&yaml_one, &yaml_pp}) {
      y->replace(y->find("train:"), 0, "  share_embeddings_and_output_weights: true\n");
    }
  }
  const fs::path one = testing::WriteSpec(dir, "one.yaml", yaml_one);
  const fs::path pp = testing::WriteSpec(dir, name + ".yaml", yaml_pp);
  for (const std::string& policy : policies) {
    const nlohmann::json base = RunOne(one, policy);
    ASSERT_EQ(base["status"], "ok") << base.dump();
    const std::vector<nlohmann::json> ranks = RunRanks(pp, policy, world);
    double static_sum = 0;
    for (size_t r = 0; r < ranks.size(); ++r) {
      const nlohmann::json& res = ranks[r];
      ASSERT_EQ(res["status"], "ok") << name << " " << policy << " rank " << r << ": " << res.dump();
      EXPECT_LT(RelDiff(res["loss"], base["loss"]), 1e-5) << name << " " << policy;
      EXPECT_LT(RelDiff(res["grad_norm"], base["grad_norm"]), 1e-5) << name << " " << policy;
      const nlohmann::json& mine = res["ranks"][0];
      EXPECT_EQ(mine["rank"], r);
      EXPECT_GT(mine["peak_allocated_bytes"].get<double>(), mine["static_bytes"].get<double>());
      if (static_cast<int>(r) % (world / stages) == 0) static_sum += mine["static_bytes"].get<double>();
    }
    // The stages split the weights: untied and without TP they add up to the 1-rank model (tied,
    // the last stage adds its copy of the embedding).
    if (!tied && world == stages) {
      EXPECT_EQ(static_sum, base["ranks"][0]["static_bytes"].get<double>()) << name;
    }
  }
}

const std::vector<std::string> kAllDensePolicies = {
    "selective:[]", "selective:[core_attn,layernorm,mlp]", "full:uniform:1", "full:block:1"};

TEST(PipelineEngineTest, OneFOneBWithTwoStagesMatchesOneRank) {
  ExpectPipelineMatchesOneRank("pp2", "  pipeline_model_parallel_size: 2\n", 2, 2,
                               kAllDensePolicies);
}

TEST(PipelineEngineTest, TiedEmbeddingsAcrossTheFirstAndLastStage) {
  ExpectPipelineMatchesOneRank("pp2-tied", "  pipeline_model_parallel_size: 2\n", 2, 2,
                               {"selective:[]", "full:uniform:2"}, /*tied=*/true);
}

TEST(PipelineEngineTest, TensorTimesPipelineParallelMatchesOneRank) {
  ExpectPipelineMatchesOneRank(
      "tp2-pp2",
      "  tensor_model_parallel_size: 2\n  pipeline_model_parallel_size: 2\n"
      "  sequence_parallel: true\n",
      4, 2, {"selective:[]", "selective:[core_attn,mlp]", "full:block:2"}, /*tied=*/true);
}

TEST(PipelineEngineTest, FourStagesMatchOneRank) {
  ExpectPipelineMatchesOneRank("pp4", "  pipeline_model_parallel_size: 4\n", 4, 4,
                               {"selective:[]", "full:uniform:1"});
}

TEST(PipelineEngineTest, UnevenStagesMatchOneRank) {
  ExpectPipelineMatchesOneRank(
      "pp2-uneven", "  pipeline_model_parallel_size: 2\n  num_layers_in_first_pipeline_stage: 1\n",
      2, 2, {"selective:[]", "full:block:2"});
}

// Megatron's explicit layouts (parallel.pipeline_model_parallel_layout): PP 2 with the embedding
// and one layer on the first rank; PP 2 x VPP 2 with the embedding and the loss each alone on
// their own stage (chunks of no transformer layer).
TEST(PipelineEngineTest, LayoutStringStagesMatchOneRank) {
  ExpectPipelineMatchesOneRank(
      "pp2-layout",
      "  pipeline_model_parallel_size: 2\n  pipeline_model_parallel_layout: \"Et|tttL\"\n", 2, 2,
      {"selective:[]", "full:uniform:1"});
  ExpectPipelineMatchesOneRank("pp2-vpp2-layout",
                               "  pipeline_model_parallel_size: 2\n"
                               "  virtual_pipeline_model_parallel_size: 2\n"
                               "  pipeline_model_parallel_layout: \"E|tt|tt|L\"\n",
                               2, 2, {"selective:[core_attn]", "full:block:1"},
                               /*tied=*/true);
}

// The interleaved schedule: each rank runs two chunks (PP 2: layers {0, 2} and {1, 3}; PP 4 of
// an 8-layer model: {p, p + 4}); activations wrap from the last rank to the first between chunks.
TEST(PipelineEngineTest, InterleavedScheduleMatchesOneRank) {
  ExpectPipelineMatchesOneRank(
      "pp2-vpp2",
      "  pipeline_model_parallel_size: 2\n  virtual_pipeline_model_parallel_size: 2\n", 2, 2,
      {"selective:[]", "selective:[core_attn]", "full:uniform:1"});
  ExpectPipelineMatchesOneRank(
      "pp4-vpp2",
      "  pipeline_model_parallel_size: 4\n  virtual_pipeline_model_parallel_size: 2\n", 4, 4,
      {"selective:[]", "full:block:1"}, /*tied=*/true, /*layers=*/8);
}

// Depth proxies of a pipeline layout: every stage runs the model cut to 2 and to 4 layers (one and
// two per stage) and predicts its own peak at 8 layers; the prediction matches the real run.
TEST(PipelineEngineTest, DepthProxiesPredictEveryStage) {
  const fs::path dir = testing::TempDir("remat-pipeline");
  const std::string train = "  micro_batch_size: 2\n  global_batch_size: 8\n";
  const std::string parallel = "  pipeline_model_parallel_size: 2\n";
  std::string proxy_yaml = Yaml(train, parallel, 8);
  proxy_yaml.replace(proxy_yaml.find("  device: cpu"), 0, "  proxy_layers: [2, 4]\n");
  const fs::path full = testing::WriteSpec(dir, "full.yaml", Yaml(train, parallel, 8));
  const fs::path proxy = testing::WriteSpec(dir, "proxy.yaml", proxy_yaml);
  const std::vector<nlohmann::json> measured = RunRanks(full, "selective:[core_attn]", 2);
  const std::vector<nlohmann::json> predicted = RunRanks(proxy, "selective:[core_attn]", 2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(measured[r]["status"], "ok") << measured[r].dump();
    ASSERT_EQ(predicted[r]["status"], "ok") << predicted[r].dump();
    EXPECT_TRUE(predicted[r]["predicted"].get<bool>());
    EXPECT_LT(RelDiff(predicted[r]["ranks"][0]["peak_allocated_bytes"],
                      measured[r]["ranks"][0]["peak_allocated_bytes"]),
              0.01)
        << "rank " << r;
  }
}

// The schedules under NCCL's point-to-point semantics, emulated by the TCP collectives
// (REMAT_TCP_NCCL_P2P: no tags, transfers between two ranks matched in posting order, an exchange
// done only once its sends were received): 1F1B and interleaving with PP 4 neither deadlock nor
// mismatch, so they are safe over NCCL; interleaving with PP 2 deadlocks, which is why the
// engine refuses it on NCCL.
class NcclPointToPoint {
 public:
  NcclPointToPoint() { ::setenv("REMAT_TCP_NCCL_P2P", "1", 1); }
  ~NcclPointToPoint() { ::unsetenv("REMAT_TCP_NCCL_P2P"); }
};

TEST(PipelineEngineTest, SchedulesAreSafeUnderNcclPointToPointSemantics) {
  NcclPointToPoint nccl;
  ExpectPipelineMatchesOneRank("pp4-nccl", "  pipeline_model_parallel_size: 4\n", 4, 4,
                               {"selective:[]"});
  ExpectPipelineMatchesOneRank(
      "tp2-pp2-nccl",
      "  tensor_model_parallel_size: 2\n  pipeline_model_parallel_size: 2\n"
      "  sequence_parallel: true\n",
      4, 2, {"selective:[core_attn]"}, /*tied=*/true);
  ExpectPipelineMatchesOneRank(
      "pp4-vpp2-nccl",
      "  pipeline_model_parallel_size: 4\n  virtual_pipeline_model_parallel_size: 2\n", 4, 4,
      {"full:uniform:1"}, /*tied=*/true, /*layers=*/8);

  const fs::path dir = testing::TempDir("remat-pipeline");
  const fs::path pp2_vpp2 = testing::WriteSpec(
      dir, "pp2-vpp2.yaml",
      Yaml("  micro_batch_size: 2\n  global_batch_size: 8\n",
           "  pipeline_model_parallel_size: 2\n  virtual_pipeline_model_parallel_size: 2\n"));
  // The first rank to time out leaves, and the other learns it from the hub.
  int timed_out = 0;
  for (const nlohmann::json& r : testing::RunRanks(kTrial, pp2_vpp2, "selective:[]", 2, 3)) {
    EXPECT_EQ(r["status"], "failed") << r.dump();
    timed_out += r["message"].get<std::string>().find("timed out") != std::string::npos;
  }
  EXPECT_GE(timed_out, 1);
}

// Each rank's measured peak against search::EstimateMemory's prediction for its stage (the plan's
// per-stage figure), on bench/engine/specs/pipeline-cpu.yaml's model (bf16, seq 256, PP 4, 8
// micro-batches): 1F1B keeps 4 - p micro-batches in flight on stage p, so the peaks fall from the
// first stage on, and the model follows within 5% (bench/engine/pipeline_peaks.py prints the
// table; docs/memory-model.md, "Engine pipeline").
const char* kStagePeakModel = R"(name: pipeline-cpu
model:
  num_layers: 8
  hidden_size: 128
  num_attention_heads: 4
  num_query_groups: 2
  ffn_hidden_size: 344
  gated_linear_unit: true
  normalization: RMSNorm
  seq_length: 256
  vocab_size: 1024
  attention_backend: unfused
  attention_dropout: 0.0
  hidden_dropout: 0.0
  add_bias_linear: false
  position_embedding_type: rope
train:
  micro_batch_size: 1
  global_batch_size: 8
  precision: bf16
search:
  memory_budget_gib: 4
  warmup_steps: 1
  measure_steps: 1
  noise_target: 0
  device: cpu
parallel:
)";

TEST(PipelineEngineTest, StagePeaksFollowTheMemoryModel) {
  const std::string yaml = std::string(kStagePeakModel) + "  pipeline_model_parallel_size: 4\n";
  auto spec = spec::ParseSpecYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  const fs::path file = testing::WriteSpec(testing::TempDir("remat-pipeline"), "pp4.yaml", yaml);
  const std::string policy = "selective:[core_attn]";
  auto parsed = search::ParsePolicy(policy);
  ASSERT_TRUE(parsed.ok());
  const search::MemoryEstimate estimate = search::EstimateMemory(*spec, *parsed);
  ASSERT_EQ(estimate.stages.size(), 4u);
  const std::vector<nlohmann::json> ranks = RunRanks(file, policy, 4);
  double previous = 0;
  for (int r = 0; r < 4; ++r) {
    ASSERT_EQ(ranks[r]["status"], "ok") << ranks[r].dump();
    const double measured = ranks[r]["ranks"][0]["peak_allocated_bytes"].get<double>();
    const search::StageMemory& stage = estimate.stages[r];
    EXPECT_EQ(stage.in_flight, 4 - r);
    EXPECT_LT(RelDiff(stage.peak_bytes, measured), 0.05)
        << "stage " << r << ": predicted " << stage.peak_bytes << ", measured " << measured;
    if (r > 0 && r < 3) {
      EXPECT_LT(measured, previous) << "stage " << r;  // fewer in flight
    }
    previous = measured;
  }
}

// An uneven interleaved layout (the embedding alone on rank 0's first chunk, 4, 3 and 1 layers
// after it): every rank's measured peak within 5% of the plan's for its stage.
TEST(PipelineEngineTest, LayoutStringStagePeaksFollowTheMemoryModel) {
  const std::string yaml = std::string(kStagePeakModel) +
                           "  pipeline_model_parallel_size: 2\n"
                           "  virtual_pipeline_model_parallel_size: 2\n"
                           "  pipeline_model_parallel_layout: \"E|tttt|ttt|tL\"\n";
  auto spec = spec::ParseSpecYaml(yaml);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  ASSERT_TRUE(search::ValidateSpec(*spec).ok()) << search::ValidateSpec(*spec).message();
  const fs::path file =
      testing::WriteSpec(testing::TempDir("remat-pipeline"), "pp2-vpp2-layout.yaml", yaml);
  for (const std::string policy : {"selective:[core_attn]", "full:uniform:1"}) {
    auto parsed = search::ParsePolicy(policy);
    ASSERT_TRUE(parsed.ok());
    const search::MemoryEstimate estimate = search::EstimateMemory(*spec, *parsed);
    ASSERT_EQ(estimate.stages.size(), 2u);
    EXPECT_EQ(estimate.stages[0].layers, 3);
    EXPECT_EQ(estimate.stages[1].layers, 5);
    const std::vector<nlohmann::json> ranks = RunRanks(file, policy, 2);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(ranks[r]["status"], "ok") << ranks[r].dump();
      const double measured = ranks[r]["ranks"][0]["peak_allocated_bytes"].get<double>();
      std::printf("%s stage %d: predicted %.0f, measured %.0f bytes\n", policy.c_str(), r,
                  estimate.stages[r].peak_bytes, measured);
      EXPECT_LT(RelDiff(estimate.stages[r].peak_bytes, measured), 0.05)
          << policy << " stage " << r << ": predicted " << estimate.stages[r].peak_bytes
          << ", measured " << measured;
    }
  }
}

}  // namespace
}  // namespace remat::engine
