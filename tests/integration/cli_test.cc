// The remat command line end to end: `remat search` (embedded coordinator and worker) on the
// replay example and, when the engine is built, on the tiny CPU example; watch / get / list
// against a running coordinator.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "search/frontier.h"
#include "specfile/spec_file.h"
#include "tests/integration/harness.h"

namespace remat::integration {
namespace {

using nlohmann::json;

std::string Example(const std::string& name) {
  return std::string(REMAT_SOURCE_DIR) + "/examples/" + name;
}

json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str(), nullptr, false);
}

class CliTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (HasFailure()) std::cerr << cluster_.LogTails();
  }
  Cluster cluster_;
};

TEST_F(CliTest, SearchRunsTheReplayExampleEndToEnd) {
  const std::string json_path = cluster_.dir() + "/out.json";
  const std::string svg_path = cluster_.dir() + "/out.svg";
  CommandResult r = cluster_.Remat(
      {"search", Example("replay/llama3-8b-h100.yaml"), "--json", json_path, "--svg", svg_path},
      /*with_coordinator=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("frontier ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recommendation: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("apply with Megatron Bridge:  model.recompute_granularity="),
            std::string::npos);
  json result = ReadJson(json_path);
  ASSERT_TRUE(result.is_object());
  EXPECT_EQ(result["state"], "succeeded");
  // Replayed figures were measured on a GPU: the plan keeps the spec's device (auto).
  EXPECT_EQ(result["spec"]["search"]["device"], "auto");

  // The frontier is the contract's frontier of the replayed results of the trials that ran.
  auto spec = spec::LoadSpecFile(Example("replay/llama3-8b-h100.yaml"));
  ASSERT_TRUE(spec.ok());
  auto table = spec::LoadReplayTableFile(spec->search.replay_table);
  ASSERT_TRUE(table.ok());
  std::vector<search::TrialResult> ran;
  for (const auto& t : result["trials"]) {
    auto it = table->find(t["policy"].get<std::string>());
    if (it == table->end()) continue;
    search::TrialResult r = it->second.result;
    r.tokens_per_s = search::TokensPerSecond(*spec, r.step_time_s);
    ran.push_back(r);
  }
  std::vector<std::string> expected;
  for (const auto& p :
       search::ComputeFrontier(ran, spec->search.memory_metric, spec->search.MemoryBudgetBytes())) {
    expected.push_back(p.policy.ToString());
  }
  ASSERT_FALSE(expected.empty());
  EXPECT_EQ(result["frontier"].get<std::vector<std::string>>(), expected);
  EXPECT_EQ(result["recommendation"], expected.back());
  EXPECT_FALSE(result["apply"]["megatron_bridge"].get<std::string>().empty());

  std::ifstream svg(svg_path);
  std::string head;
  std::getline(svg, head);
  EXPECT_EQ(head.rfind("<svg", 0), 0u);
}

TEST_F(CliTest, SearchRefusesABadSpecNamingTheField) {
  const std::string path = cluster_.dir() + "/bad.yaml";
  std::ofstream(path) << "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n"
                         "  seq_length: 128\n  vocab_size: -5\n";
  CommandResult r = cluster_.Remat({"search", path}, /*with_coordinator=*/false);
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_EQ(r.err.rfind("error: model.vocab_size", 0), 0u) << r.err;
}

TEST_F(CliTest, SubmitWatchGetList) {
  cluster_.StartCoordinator();
  cluster_.StartWorker(2);
  json table = MakeReplayTable(/*seed=*/60, /*wall_s=*/0.05);
  const std::string spec = cluster_.WriteReplaySpec("cli", table, "guided");
  CommandResult submit = cluster_.Remat({"submit", spec});
  ASSERT_EQ(submit.exit_code, 0) << submit.err;
  std::string id = submit.out.substr(0, submit.out.find('\n'));
  ASSERT_EQ(id.rfind("s-", 0), 0u) << submit.out;

  CommandResult watch = cluster_.Remat({"watch", id});
  EXPECT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_NE(watch.out.find("progress: "), std::string::npos) << watch.out;
  EXPECT_NE(watch.out.find("search " + id), std::string::npos) << watch.out;
  EXPECT_NE(watch.out.find("recommendation: "), std::string::npos) << watch.out;

  const std::string svg_path = cluster_.dir() + "/get.svg";
  CommandResult get = cluster_.Remat({"get", id, "--svg", svg_path});
  EXPECT_EQ(get.exit_code, 0);
  EXPECT_NE(get.out.find("succeeded"), std::string::npos) << get.out;
  std::ifstream svg(svg_path);
  std::string head;
  std::getline(svg, head);
  EXPECT_EQ(head.rfind("<svg", 0), 0u);
  CommandResult list = cluster_.Remat({"list"});
  EXPECT_EQ(list.exit_code, 0);
  EXPECT_NE(list.out.find(id), std::string::npos) << list.out;

  CommandResult missing = cluster_.Remat({"get", "s-does-not-exist"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_EQ(missing.err.rfind("error: ", 0), 0u);
}

#ifdef REMAT_TRIAL_BIN
// The real engine on CPU: the README's main job.
TEST_F(CliTest, SearchRunsTheTinyDenseExampleOnTheCpuEngine) {
  const std::string json_path = cluster_.dir() + "/tiny.json";
  CommandResult r = cluster_.Remat({"search", Example("tiny-dense.yaml"), "--json", json_path},
                                   /*with_coordinator=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("frontier ("), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recommendation: "), std::string::npos) << r.out;
  json result = ReadJson(json_path);
  ASSERT_TRUE(result.is_object());
  EXPECT_EQ(result["state"], "succeeded");
  EXPECT_FALSE(result["frontier"].empty()) << result.dump(1);
  EXPECT_TRUE(result["recommendation"].is_string()) << result.dump(1);
  int ok = 0;
  for (const auto& t : result["trials"]) {
    if (t["status"] != "ok") continue;
    ++ok;
    EXPECT_GT(t["peak_allocated_bytes"].get<uint64_t>(), 0u) << t.dump();
    EXPECT_GT(t["tokens_per_s"].get<double>(), 0) << t.dump();
    EXPECT_GT(t["loss"].get<double>(), 0) << t.dump();
  }
  EXPECT_GE(ok, 3) << result.dump(1);
}

// search.device auto with the builtin engine on a machine without a GPU: the trials run on the
// CPU, and the search plans for it (no CUDA workspaces in its predictions) and says so.
TEST_F(CliTest, AutoDeviceWithoutAGpuIsPlannedAsTheCpu) {
  if (std::system("nvidia-smi -L > /dev/null 2>&1") == 0) GTEST_SKIP() << "this machine has a GPU";
  std::ifstream in(Example("tiny-dense.yaml"));
  std::stringstream text;
  text << in.rdbuf();
  std::string spec = text.str();
  const size_t at = spec.find("  device: cpu");
  ASSERT_NE(at, std::string::npos);
  spec.replace(at, spec.find('\n', at) - at, "  device: auto");
  const std::string spec_path = cluster_.dir() + "/tiny-auto.yaml";
  std::ofstream(spec_path) << spec;
  const std::string json_path = cluster_.dir() + "/tiny-auto.json";
  CommandResult r = cluster_.Remat({"search", spec_path, "--json", json_path},
                                   /*with_coordinator=*/false);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  json result = ReadJson(json_path);
  EXPECT_EQ(result["state"], "succeeded");
  EXPECT_EQ(result["spec"]["search"]["device"], "cpu");
  EXPECT_FALSE(result["frontier"].empty()) << result.dump(1);
}
#endif

}  // namespace
}  // namespace remat::integration
