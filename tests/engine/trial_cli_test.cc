// remat-trial as the worker runs it: one process per rank. Tensor parallelism across two
// processes matches the 1-rank run, an OOM is a result with exit code 0, a missing rank ends in
// status failed instead of a hang, a crashing rank reports its stack and releases its peers, and
// the binary request/result files round-trip.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tests/engine/test_process.h"
#include "proto/convert.h"
#include "tests/engine/test_models.h"

namespace remat::engine {
namespace {

namespace fs = std::filesystem;

using testing::Output;
using testing::RelDiff;
using testing::Sh;
fs::path TempDir() { return testing::TempDir("remat-trial-cli"); }

const std::string kTrial = REMAT_TRIAL_PATH;

constexpr const char* kDenseYaml = R"(name: tiny-dense
model:
  num_layers: 4
  hidden_size: 64
  num_attention_heads: 4
  num_query_groups: 2
  ffn_hidden_size: 128
  gated_linear_unit: true
  normalization: RMSNorm
  seq_length: 64
  vocab_size: 256
  attention_dropout: 0.0
  hidden_dropout: 0.0
  add_bias_linear: false
  position_embedding_type: rope
train:
  micro_batch_size: 2
  precision: fp32
search:
  memory_budget_gib: 1
  warmup_steps: 1
  warmup_max_steps: 1
  steady_window: 1
  measure_steps: 1
  noise_target: 0
  device: cpu
)";


nlohmann::json RunOne(const fs::path& spec, const std::string& policy) {
  Output o = Sh(kTrial + " --spec " + spec.string() + " --policy '" + policy + "' --json");
  EXPECT_EQ(o.exit_code, 0) << o.out;
  return nlohmann::json::parse(o.out);
}

// The tiny dense spec with a parallel section and a budget (GiB), written to dir/name.
fs::path WriteSpec(const fs::path& dir, const std::string& name, const std::string& parallel,
                   const std::string& budget = "1") {
  std::string yaml = kDenseYaml;
  yaml.replace(yaml.find("train:"), 0, parallel);
  yaml.replace(yaml.find("memory_budget_gib: 1"), 20, "memory_budget_gib: " + budget);
  return testing::WriteSpec(dir, name, yaml);
}

std::vector<nlohmann::json> RunRanks(const fs::path& spec, const std::string& policy, int world,
                                     double timeout_s = 60) {
  return testing::RunRanks(kTrial, spec, policy, world, timeout_s);
}


TEST(TrialCliTest, TensorParallelMatchesOneRank) {
  const fs::path dir = TempDir();
  const fs::path one = WriteSpec(dir, "one.yaml", "");
  const fs::path tp2 = WriteSpec(dir, "tp2.yaml", "parallel:\n  tensor_model_parallel_size: 2\n");
  const fs::path sp2 = WriteSpec(
      dir, "sp2.yaml", "parallel:\n  tensor_model_parallel_size: 2\n  sequence_parallel: true\n");
  // Every dense label and full recompute: under TP and SP the replays run collectives too
  // (the MLP's all-gather and reduce-scatter, whole layers' worth under full recompute).
  for (const std::string policy :
       {"selective:[]", "selective:[core_attn,layernorm]", "selective:[core_attn,mlp]",
        "selective:[layernorm,mlp]", "full:uniform:1", "full:block:2"}) {
    const nlohmann::json base = RunOne(one, policy);
    ASSERT_EQ(base["status"], "ok") << base.dump();
    for (const fs::path& spec : {tp2, sp2}) {
      for (const nlohmann::json& r : RunRanks(spec, policy, 2)) {
        ASSERT_EQ(r["status"], "ok") << r.dump();
        EXPECT_LT(RelDiff(r["loss"], base["loss"]), 1e-5) << spec << " " << policy;
        EXPECT_LT(RelDiff(r["grad_norm"], base["grad_norm"]), 1e-5) << spec << " " << policy;
        // Half the weights and (roughly) half the activations per rank.
        EXPECT_LT(r["peak_allocated_bytes"].get<double>(),
                  0.75 * base["peak_allocated_bytes"].get<double>());
      }
    }
  }
}

// The Transformer Engine layer with Megatron's fusions under TP 2 + SP (the fused norm's mlp
// checkpoint replays the norm and the sequence gather) trains as the unfused local layer on one
// rank.
TEST(TrialCliTest, TransformerEngineLayerUnderSequenceParallelMatchesOneRank) {
  const fs::path dir = TempDir();
  const fs::path one = WriteSpec(dir, "one.yaml", "");
  const fs::path te = WriteSpec(
      dir, "te-sp2.yaml",
      "  transformer_impl: transformer_engine\n  bias_activation_fusion: true\n"
      "  apply_rope_fusion: true\n  bias_dropout_fusion: true\n"
      "parallel:\n  tensor_model_parallel_size: 2\n  sequence_parallel: true\n");
  for (const std::string policy : {"selective:[]", "selective:[core_attn,mlp]", "full:uniform:1"}) {
    const nlohmann::json base = RunOne(one, policy);
    ASSERT_EQ(base["status"], "ok") << base.dump();
    for (const nlohmann::json& r : RunRanks(te, policy, 2)) {
      ASSERT_EQ(r["status"], "ok") << r.dump();
      EXPECT_LT(RelDiff(r["loss"], base["loss"]), 1e-5) << policy;
      EXPECT_LT(RelDiff(r["grad_norm"], base["grad_norm"]), 1e-5) << policy;
    }
  }
}

TEST(TrialCliTest, DataParallelRanksAgree) {
  const fs::path dir = TempDir();
  const fs::path dp2 = WriteSpec(dir, "dp2.yaml", "parallel:\n  data_parallel_size: 2\n");
  const std::vector<nlohmann::json> r = RunRanks(dp2, "full:uniform:2", 2);
  ASSERT_EQ(r[0]["status"], "ok") << r[0].dump();
  ASSERT_EQ(r[1]["status"], "ok") << r[1].dump();
  // Averaged gradients: both ranks hold the same weights, hence report the same loss and norm.
  EXPECT_EQ(r[0]["loss"], r[1]["loss"]);
  EXPECT_EQ(r[0]["grad_norm"], r[1]["grad_norm"]);
  // tokens/s counts both ranks' micro-batches.
  EXPECT_NEAR(r[0]["tokens_per_s"].get<double>() * r[0]["step_time_s"].get<double>(), 2 * 2 * 64,
              1e-6);
  // Each rank lists its measured steps (one here; warm-up excluded); the median is that step.
  for (const nlohmann::json& rank : {r[0]["ranks"][0], r[1]["ranks"][0]}) {
    ASSERT_EQ(rank["step_times_s"].size(), 1u) << rank.dump();
    EXPECT_EQ(rank["step_times_s"][0], rank["step_time_s"]);
  }
}

TEST(TrialCliTest, BudgetBelowTheNeedIsOomWithExitZero) {
  const fs::path dir = TempDir();
  const fs::path spec = WriteSpec(dir, "small.yaml", "", "0.002");
  Output o = Sh(kTrial + " --spec " + spec.string() + " --policy 'selective:[]' --json");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  const nlohmann::json r = nlohmann::json::parse(o.out);
  EXPECT_EQ(r["status"], "oom");
  EXPECT_GT(r["ranks"][0]["failing_request_bytes"].get<uint64_t>(), 0u);
}

TEST(TrialCliTest, MissingRankIsFailedNotAHang) {
  const fs::path dir = TempDir();
  const fs::path spec = WriteSpec(dir, "tp2.yaml", "parallel:\n  tensor_model_parallel_size: 2\n");
  const fs::path rendezvous = TempDir();
  const auto start = std::chrono::steady_clock::now();
  Output o = Sh(kTrial + " --spec " + spec.string() + " --policy 'selective:[]' --rank 0" +
                " --world-size 2 --rendezvous " + rendezvous.string() +
                " --collective-timeout 2 --json");
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(o.exit_code, 0) << o.out;
  const nlohmann::json r = nlohmann::json::parse(o.out);
  EXPECT_EQ(r["status"], "failed");
  EXPECT_NE(r["message"].get<std::string>().find("timed out"), std::string::npos) << r.dump();
  EXPECT_LT(took, 30.0);
}

// A rank that crashes (here: SIGSEGV sent from outside, mid-trial) prints the signal and its
// stack to stderr for the worker's report, and leaves the rendezvous marker that tells its peers
// to give up at once: the other rank ends failed long before its 60 s collective timeout.
TEST(TrialCliTest, CrashPrintsTheStackAndReleasesThePeers) {
  const fs::path dir = TempDir();
  std::string yaml = kDenseYaml;
  yaml.replace(yaml.find("measure_steps: 1"), 16, "measure_steps: 100000");
  yaml.replace(yaml.find("train:"), 0, "parallel:\n  tensor_model_parallel_size: 2\n");
  const fs::path spec = testing::WriteSpec(dir, "long.yaml", yaml);
  const fs::path rendezvous = dir / "rendezvous";
  auto command = [&](int rank) {
    return kTrial + " --spec " + spec.string() + " --policy 'selective:[]' --rank " +
           std::to_string(rank) + " --world-size 2 --rendezvous " + rendezvous.string() +
           " --collective-timeout 60 --json";
  };
  const fs::path pid_file = dir / "pid", stderr_file = dir / "stderr-0";
  const auto start = std::chrono::steady_clock::now();
  Output crashed, peer;
  std::thread rank0([&] {
    crashed = Sh("(" + command(0) + " >/dev/null 2>" + stderr_file.string() + " & echo $! > " +
                 pid_file.string() + "; wait $!; echo exit=$?)");
  });
  std::thread rank1([&] { peer = Sh(command(1)); });
  // Both ranks are stepping once the TCP hub is up and a few steps went by.
  while (!fs::exists(rendezvous / "hub") &&
         std::chrono::steady_clock::now() - start < std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  std::string pid;
  std::ifstream(pid_file) >> pid;
  ASSERT_FALSE(pid.empty());
  Sh("kill -SEGV " + pid);
  rank0.join();
  rank1.join();
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(crashed.out.find("exit=139"), std::string::npos) << crashed.out;  // 128 + SIGSEGV
  std::stringstream err;
  err << std::ifstream(stderr_file).rdbuf();
  EXPECT_NE(err.str().find("fatal signal 11"), std::string::npos) << err.str();
  EXPECT_NE(err.str().find("remat-trial"), std::string::npos) << err.str();  // stack frames
  EXPECT_TRUE(fs::exists(rendezvous / "left-0"));
  const nlohmann::json r = nlohmann::json::parse(peer.out);
  EXPECT_EQ(r["status"], "failed") << r.dump();
  EXPECT_LT(took, 40.0);
}

TEST(TrialCliTest, RequestAndResultFilesRoundTrip) {
  const fs::path dir = TempDir();
  v1::TrialRequest request;
  *request.mutable_spec() = proto::ToProto(testing::TinyMla());
  request.mutable_policy()->set_canonical("selective:[mla_up_proj]");
  request.set_rank(0);
  request.set_world_size(1);
  {
    std::ofstream out(dir / "request.pb", std::ios::binary);
    ASSERT_TRUE(request.SerializeToOstream(&out));
  }
  Output o = Sh(kTrial + " --request " + (dir / "request.pb").string() + " --result " +
                (dir / "result.pb").string() + " 2>&1");
  ASSERT_EQ(o.exit_code, 0) << o.out;
  v1::TrialResult msg;
  std::ifstream in(dir / "result.pb", std::ios::binary);
  ASSERT_TRUE(msg.ParseFromIstream(&in));
  auto result = proto::FromProto(msg);
  ASSERT_TRUE(result.ok()) << result.status().message();
  EXPECT_EQ(result->status, search::TrialStatus::kOk) << result->message;
  EXPECT_EQ(result->policy.ToString(), "selective:[mla_up_proj]");
  ASSERT_EQ(result->ranks.size(), 1u);
  EXPECT_GT(result->ranks[0].peak_allocated_bytes, result->ranks[0].static_bytes);
  EXPECT_GT(result->step_time_s, 0);
  EXPECT_GT(result->tokens_per_s, 0);
  EXPECT_GT(result->setup_s, 0);
}

TEST(TrialCliTest, BadInputExitsTwoWithAnErrorLine) {
  const fs::path dir = TempDir();
  const fs::path spec = WriteSpec(dir, "one.yaml", "");
  Output o = Sh(kTrial + " --spec " + spec.string() + " --policy 'selective:[bogus]' 2>&1");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.out.rfind("error: --policy", 0), 0u) << o.out;
  o = Sh(kTrial + " --request /nonexistent/request.pb --result /tmp/x 2>&1");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.out.rfind("error: --request", 0), 0u) << o.out;
}

TEST(TrialCliTest, VersionListsTheBuild) {
  Output o = Sh(kTrial + " --version");
  EXPECT_EQ(o.exit_code, 0);
  for (const char* key : {"remat=", "torch=", "cuda=", "nccl=", "driver=", "gpu=", "device="}) {
    EXPECT_NE(o.out.find(key), std::string::npos) << key << " missing in\n" << o.out;
  }
}

// The steady-state warm-up (search/steady_state.h) as the engine applies it: at least
// warmup_steps, then until the last steady_window steps agree, at most warmup_max_steps; the
// result says how many it took, lists them, and every rank of a trial takes the same number.
TEST(TrialCliTest, WarmupLastsUntilTheStepsSettle) {
  const fs::path dir = TempDir();
  auto spec_with = [&](const std::string& name, const std::string& tolerance,
                       const std::string& parallel) {
    std::string yaml = kDenseYaml;
    yaml.replace(yaml.find("  warmup_steps: 1\n  warmup_max_steps: 1\n  steady_window: 1\n"
                           "  measure_steps: 1\n"),
                 std::string("  warmup_steps: 1\n  warmup_max_steps: 1\n  steady_window: 1\n"
                             "  measure_steps: 1\n")
                     .size(),
                 "  warmup_steps: 2\n  warmup_max_steps: 6\n  steady_window: 3\n"
                 "  steady_tolerance: " + tolerance + "\n  measure_steps: 2\n");
    yaml.replace(yaml.find("train:"), 0, parallel);
    return testing::WriteSpec(dir, name, yaml);
  };
  // A loose tolerance settles as soon as the window is full or soon after; within the bounds.
  const nlohmann::json loose = RunOne(spec_with("loose.yaml", "0.9", ""), "selective:[]");
  ASSERT_EQ(loose["status"], "ok") << loose.dump();
  const int taken = loose["warmup_steps_taken"];
  EXPECT_GE(taken, 3);  // the minimum is 2, but a window of 3 needs three steps to judge
  EXPECT_LE(taken, 6);
  EXPECT_EQ(loose["warmup_settled"], true);
  EXPECT_EQ(loose["ranks"][0]["warmup_steps_taken"], taken);
  EXPECT_EQ(loose["ranks"][0]["warmup_step_times_s"].size(), static_cast<size_t>(taken));
  EXPECT_EQ(loose["ranks"][0]["step_times_s"].size(), 2u);  // measure_steps, after the warm-up
  // No CPU step is steady to a part in 10^12: the bound ends the warm-up, and the result says so.
  const nlohmann::json tight = RunOne(spec_with("tight.yaml", "1e-12", ""), "selective:[]");
  ASSERT_EQ(tight["status"], "ok") << tight.dump();
  EXPECT_EQ(tight["warmup_steps_taken"], 6);
  EXPECT_EQ(tight["warmup_settled"], false);
  EXPECT_EQ(tight["ranks"][0]["step_times_s"].size(), 2u);
  // The loss is step index warmup_steps's, whatever the warm-up took: the same in both runs.
  EXPECT_EQ(loose["loss"], tight["loss"]);
  EXPECT_EQ(loose["grad_norm"], tight["grad_norm"]);
  // Two ranks agree on when to stop warming up (their collectives pair up; no hang).
  const std::vector<nlohmann::json> ranks = RunRanks(
      spec_with("tp2.yaml", "0.2", "parallel:\n  tensor_model_parallel_size: 2\n"),
      "selective:[]", 2);
  ASSERT_EQ(ranks[0]["status"], "ok") << ranks[0].dump();
  ASSERT_EQ(ranks[1]["status"], "ok") << ranks[1].dump();
  EXPECT_EQ(ranks[0]["warmup_steps_taken"], ranks[1]["warmup_steps_taken"]);
  EXPECT_LE(ranks[0]["warmup_steps_taken"].get<int>(), 6);
}

// Adaptive measurement (search/noise.h) as the engine applies it: at least measure_steps, then
// until the median's 90% interval is within search.noise_target or max_measure_steps; the
// result carries the interval, and the ranks of a trial stop at the same step.
TEST(TrialCliTest, MeasuresUntilTheMedianIsKnownOrTheCap) {
  const fs::path dir = TempDir();
  auto spec_with = [&](const std::string& name, const std::string& target,
                       const std::string& parallel) {
    std::string yaml = kDenseYaml;
    const std::string fixed = "  measure_steps: 1\n  noise_target: 0\n";
    yaml.replace(yaml.find(fixed), fixed.size(),
                 "  measure_steps: 3\n  noise_target: " + target + "\n  max_measure_steps: 7\n");
    yaml.replace(yaml.find("train:"), 0, parallel);
    return testing::WriteSpec(dir, name, yaml);
  };
  // A loose target is met as soon as a 90% interval exists: five steps.
  const nlohmann::json loose = RunOne(spec_with("loose.yaml", "0.9", ""), "selective:[]");
  ASSERT_EQ(loose["status"], "ok") << loose.dump();
  EXPECT_EQ(loose["ranks"][0]["step_times_s"].size(), 5u);
  EXPECT_EQ(loose["measured_steps"], 5);
  EXPECT_EQ(loose["noise_target_met"], true);
  const double median = loose["step_time_s"], low = loose["step_time_low_s"],
               high = loose["step_time_high_s"];
  EXPECT_LE(low, median);
  EXPECT_GE(high, median);
  EXPECT_GT(high, 0);
  // No CPU step is steady to a part in 10^9: the cap ends it, on both ranks at the same step.
  const std::vector<nlohmann::json> ranks = RunRanks(
      spec_with("tp2.yaml", "1e-9", "parallel:\n  tensor_model_parallel_size: 2\n"),
      "selective:[]", 2);
  for (const nlohmann::json& r : ranks) {
    ASSERT_EQ(r["status"], "ok") << r.dump();
    EXPECT_EQ(r["ranks"][0]["step_times_s"].size(), 7u);
    EXPECT_EQ(r["noise_target_met"], false);
  }
}

// model.moe_router_force_load_balancing: random router logits (Megatron's RandomSTE), recorded
// in the result; the routing differs from the trained router's, so the loss does too, and a
// recomputed MoE layer routes as its first forward did (full recompute runs and agrees).
TEST(TrialCliTest, ForcedLoadBalancingRoutesAtRandomAndSaysSo) {
  const fs::path dir = TempDir();
  auto moe = [&](const std::string& name, bool forced) {
    std::string yaml = kDenseYaml;
    yaml.replace(yaml.find("train:"), 0,
                 std::string("  num_moe_experts: 4\n  moe_router_topk: 2\n"
                             "  moe_ffn_hidden_size: 64\n") +
                     (forced ? "  moe_router_force_load_balancing: true\n" : ""));
    return testing::WriteSpec(dir, name, yaml);
  };
  const nlohmann::json learned = RunOne(moe("learned.yaml", false), "selective:[]");
  const nlohmann::json forced = RunOne(moe("forced.yaml", true), "selective:[]");
  const nlohmann::json forced_moe = RunOne(moe("forced.yaml", true), "selective:[moe]");
  ASSERT_EQ(learned["status"], "ok") << learned.dump();
  ASSERT_EQ(forced["status"], "ok") << forced.dump();
  ASSERT_EQ(forced_moe["status"], "ok") << forced_moe.dump();
  EXPECT_EQ(learned["forced_load_balancing"], false);
  EXPECT_EQ(forced["forced_load_balancing"], true);
  EXPECT_NE(learned["loss"], forced["loss"]);
  // Recompute replays the same random routing: the same loss and gradient as without it.
  EXPECT_NEAR(forced["loss"].get<double>(), forced_moe["loss"].get<double>(), 1e-5);
  EXPECT_NEAR(forced["grad_norm"].get<double>(), forced_moe["grad_norm"].get<double>(), 1e-4);
}

// What a trial ran with, recorded by the engine at run time; on the CPU the CUDA side is "none".
TEST(TrialCliTest, ResultRecordsTheVersionsItRanWith) {
  const fs::path dir = TempDir();
  const nlohmann::json r = RunOne(WriteSpec(dir, "one.yaml", ""), "selective:[]");
  ASSERT_EQ(r["status"], "ok") << r.dump();
  const nlohmann::json& v = r["versions"];
  EXPECT_FALSE(v["remat"].get<std::string>().empty()) << v.dump();
  EXPECT_FALSE(v["torch"].get<std::string>().empty()) << v.dump();
  for (const char* key : {"cuda", "nccl", "driver", "gpu"}) EXPECT_EQ(v[key], "none") << key;
  EXPECT_EQ(v["device"], "cpu");
  // search.allocator_conf's default, set by remat-trial before LibTorch's allocator reads it.
  EXPECT_EQ(v["allocator_conf"], "expandable_segments:True") << v.dump();
}

}  // namespace
}  // namespace remat::engine
