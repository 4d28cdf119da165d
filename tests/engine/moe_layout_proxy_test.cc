// Layout proxies of MoE with tensor and expert tensor parallelism on CPU ranks: the real 8-rank
// trial of TP 2 (sequence parallel) x EP 2 x PP 2 with ETP 1 and ETP 2, under each dispatcher,
// against every one of its ranks run alone with the stand-in collectives (RunStandInRank):
// every rank's allocated peak within 2% and its static bytes equal,
// and the expert grid's groups recorded; and the memory model's per-layer activations against
// the real trial's first stage at 2 and 4 layers.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/trial_runner.h"
#include "search/layout_proxy.h"
#include "search/memory_model.h"
#include "search/policy.h"
#include "specfile/spec_file.h"
#include "tests/engine/proxy_check.h"
#include "tests/engine/test_models.h"
#include "tests/engine/test_process.h"

namespace remat::engine {
namespace {

namespace fs = std::filesystem;

const std::string kTrial = REMAT_TRIAL_PATH;

// 512 tokens per rank and micro-batch: a stand-in rank routes like its peers only up to the routing's
// noise, which shrinks as the tokens grow (docs/layout-proxies.md). One warm-up step and exactly
// one measured step (noise_target 0) on both sides: the stand-in ranks and the real ones measure
// the same step, and a real 8-rank trial on two cores stays short.
std::string Yaml(const std::string& dispatcher, int etp, int layers = 2) {
  return testing::TinyRankSpecYaml(
      "tiny-moe-etp-proxy",
      testing::TinyRankModelYaml(layers, 512, testing::TinyRankMoeLines(true, dispatcher, false)),
      "  micro_batch_size: 2\n  global_batch_size: 8\n", testing::ExpertGridYaml(etp),
      "  warmup_max_steps: 1\n  steady_window: 1\n  noise_target: 0\n");
}

// The real 8-rank trial of `dispatcher` and `etp` with `layers` layers under `policy`, run once
// per test process (the proxy and the layer checks of one grid share it).
const std::vector<nlohmann::json>& RealRun(const std::string& dispatcher, int etp, int layers,
                                           const std::string& policy) {
  static std::map<std::string, std::vector<nlohmann::json>> runs;
  const std::string key =
      dispatcher + " " + std::to_string(etp) + " " + std::to_string(layers) + " " + policy;
  auto it = runs.find(key);
  if (it != runs.end()) return it->second;
  const fs::path file = testing::WriteSpec(testing::TempDir("remat-etp-proxy"),
                                           dispatcher + std::to_string(etp) + "-" +
                                               std::to_string(layers) + ".yaml",
                                           Yaml(dispatcher, etp, layers));
  return runs[key] = testing::RunRanks(kTrial, file, policy, 8);
}

void ExpectProxiesMatch(const std::string& dispatcher, int etp, const std::string& text,
                        const std::vector<std::string>& groups, double tolerance = 0.02) {
  auto spec = spec::ParseSpecYaml(Yaml(dispatcher, etp));
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  ASSERT_EQ(spec->parallel.WorldSize(), 8);
  testing::ExpectStandInsMatchReal(*spec, text, RealRun(dispatcher, etp, 2, text),
                                   {dispatcher + " ETP " + std::to_string(etp), tolerance, groups});
}

// The memory model's per-layer activations under TP, ETP and each dispatcher
// (search::EstimateLayerActivations, no recompute) against the engine: one MoE layer more per
// stage (2 -> 4 layers) adds, on the first stage, its activations for each of the 2 micro-batches
// in flight (1F1B) to the peak above the static bytes.
void ExpectLayerActivationsFollow(const std::string& dispatcher, int etp, double tolerance) {
  double measured[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    const std::vector<nlohmann::json>& real = RealRun(dispatcher, etp, 2 + 2 * k, "selective:[]");
    ASSERT_EQ(real[0]["status"], "ok") << real[0].dump();
    const nlohmann::json& r0 = real[0]["ranks"][0];
    measured[k] = r0["peak_allocated_bytes"].get<double>() - r0["static_bytes"].get<double>();
  }
  auto deep = spec::ParseSpecYaml(Yaml(dispatcher, etp, 4));
  ASSERT_TRUE(deep.ok()) << deep.status().message();
  const double per_layer = (measured[1] - measured[0]) / 2;  // 2 micro-batches in flight
  const double predicted = search::EstimateLayerActivations(*deep, 0).Total();
  std::printf("%s ETP %d: per MoE layer measured %.0f bytes, memory model %.0f (%.4f)\n",
              dispatcher.c_str(), etp, per_layer, predicted, predicted / per_layer);
  EXPECT_LT(testing::RelDiff(predicted, per_layer), tolerance)
      << dispatcher << " ETP " << etp << ": predicted " << predicted << " bytes a layer, measured "
      << per_layer;
}

// Each grid's test checks its proxies and, on the same process's real runs (the 2-layer trial
// under selective:[] is both checks' run), the memory model's per-layer activations.
//
// With ETP 2 the two ranks of an expert-TP pair process the same gathered tokens in the real
// trial (equal peaks). Were a stand-in's peers copies of it, its expert load would carry the
// routing noise of half the tokens (rank 1 was 2.5% above the real peak under both dispatchers);
// the peers' routing shifted over the expert ranks (engine/collectives.h AllGatherRouting)
// spreads it evenly.
TEST(MoeLayoutProxyTest, AllgatherEtp2) {
  ExpectProxiesMatch("allgather", 2, "selective:[]", {"tp", "pp", "expert_tp_ep"});
  ExpectLayerActivationsFollow("allgather", 2, 0.05);
}

TEST(MoeLayoutProxyTest, AlltoallEtp1) {
  ExpectProxiesMatch("alltoall", 1, "selective:[moe_act]", {"tp", "pp", "ep", "expert_dp"});
  ExpectLayerActivationsFollow("alltoall", 1, 0.05);
}

TEST(MoeLayoutProxyTest, AlltoallEtp2) {
  ExpectProxiesMatch("alltoall", 2, "selective:[]", {"tp", "pp", "ep", "expert_tp"});
  ExpectLayerActivationsFollow("alltoall", 2, 0.05);
}

}  // namespace
}  // namespace remat::engine
