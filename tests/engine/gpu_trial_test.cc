// remat-trial on CUDA (label "gpu": built with REMAT_WITH_CUDA, run on the GPU machine with
// `ctest -L gpu`): the caching allocator's budget gives oom with exit 0, a 2-rank NCCL tensor-
// parallel run matches the 1-rank run (2 GPUs; skipped with fewer), a missing rank ends failed.

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace {

namespace fs = std::filesystem;

const std::string kTrial = REMAT_TRIAL_PATH;

fs::path TempDir() {
  static int counter = 0;
  fs::path d = fs::temp_directory_path() /
               ("remat-gpu-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::pair<int, std::string> Sh(const std::string& command) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = p != nullptr ? ::pclose(p) : -1;
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

fs::path Spec(const fs::path& dir, const std::string& name, const std::string& extra,
              const std::string& budget = "20") {
  fs::path p = dir / name;
  std::ofstream(p) << "name: gpu-tiny\n"
                      "model:\n  num_layers: 4\n  hidden_size: 256\n  num_attention_heads: 8\n"
                      "  num_query_groups: 4\n  ffn_hidden_size: 512\n  gated_linear_unit: true\n"
                      "  normalization: RMSNorm\n  seq_length: 512\n  vocab_size: 2048\n"
                      "  attention_dropout: 0.0\n  hidden_dropout: 0.0\n  add_bias_linear: false\n"
                      "  position_embedding_type: rope\n"
                   << extra
                   << "train:\n  micro_batch_size: 2\n  precision: fp32\n"
                      "search:\n  memory_budget_gib: "
                   << budget << "\n  warmup_steps: 1\n  measure_steps: 2\n  device: cuda\n";
  return p;
}

int DeviceCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

TEST(GpuTrialTest, OneRankRunsAndFullRecomputeIsLower) {
  if (DeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  const fs::path spec = Spec(TempDir(), "one.yaml", "");
  auto [c0, o0] = Sh(kTrial + " --spec " + spec.string() + " --policy 'selective:[]' --json");
  auto [c1, o1] = Sh(kTrial + " --spec " + spec.string() + " --policy 'full:uniform:1' --json");
  ASSERT_EQ(c0, 0) << o0;
  ASSERT_EQ(c1, 0) << o1;
  const auto a = nlohmann::json::parse(o0), b = nlohmann::json::parse(o1);
  ASSERT_EQ(a["status"], "ok") << o0;
  ASSERT_EQ(b["status"], "ok") << o1;
  EXPECT_LT(std::abs(a["loss"].get<double>() - b["loss"].get<double>()), 1e-5 * a["loss"].get<double>());
  EXPECT_LT(b["peak_allocated_bytes"].get<double>(), a["peak_allocated_bytes"].get<double>());
  EXPECT_GE(a["peak_reserved_bytes"].get<double>(), a["peak_allocated_bytes"].get<double>());
}

TEST(GpuTrialTest, BudgetBelowTheNeedIsOomWithExitZero) {
  if (DeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  const fs::path spec = Spec(TempDir(), "small.yaml", "", "0.02");
  auto [code, out] = Sh(kTrial + " --spec " + spec.string() + " --policy 'selective:[]' --json");
  ASSERT_EQ(code, 0) << out;
  const auto r = nlohmann::json::parse(out);
  EXPECT_EQ(r["status"], "oom") << out;
  EXPECT_GT(r["ranks"][0]["failing_request_bytes"].get<uint64_t>(), 0u);
}

TEST(GpuTrialTest, TwoRankNcclTensorParallelMatchesOneRank) {
  if (DeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  const fs::path dir = TempDir();
  const fs::path one = Spec(dir, "one.yaml", "");
  const fs::path two = Spec(dir, "tp2.yaml", "parallel:\n  tensor_model_parallel_size: 2\n  sequence_parallel: true\n");
  auto [c, base_out] = Sh(kTrial + " --spec " + one.string() + " --policy 'selective:[core_attn]' --json");
  ASSERT_EQ(c, 0) << base_out;
  const auto base = nlohmann::json::parse(base_out);
  const fs::path rendezvous = TempDir();
  std::vector<std::pair<int, std::string>> outs(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      outs[r] = Sh("CUDA_VISIBLE_DEVICES=" + std::to_string(r) + " NCCL_NVLS_ENABLE=0 " + kTrial +
                   " --spec " + two.string() + " --policy 'selective:[core_attn]' --rank " +
                   std::to_string(r) + " --world-size 2 --rendezvous " + rendezvous.string() +
                   " --collective-timeout 120 --json");
    });
  }
  for (auto& t : ranks) t.join();
  for (const auto& [code, out] : outs) {
    ASSERT_EQ(code, 0) << out;
    const auto r = nlohmann::json::parse(out);
    ASSERT_EQ(r["status"], "ok") << out;
    EXPECT_LT(std::abs(r["loss"].get<double>() - base["loss"].get<double>()),
              1e-5 * base["loss"].get<double>());
  }
}

TEST(GpuTrialTest, MissingNcclRankIsFailedNotAHang) {
  if (DeviceCount() < 1) GTEST_SKIP() << "no CUDA device";
  const fs::path dir = TempDir();
  const fs::path spec = Spec(dir, "tp2.yaml", "parallel:\n  tensor_model_parallel_size: 2\n");
  const auto start = std::chrono::steady_clock::now();
  auto [code, out] = Sh("NCCL_NVLS_ENABLE=0 " + kTrial + " --spec " + spec.string() +
                        " --policy 'selective:[]' --rank 0 --world-size 2 --rendezvous " +
                        TempDir().string() + " --collective-timeout 5 --json");
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(nlohmann::json::parse(out)["status"], "failed") << out;
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 60.0);
}

}  // namespace
