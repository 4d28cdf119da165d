// `remat plan` and `remat validate` on the example specs: the control first, the architecture's
// first boundary next; invalid policies exit 2 with Megatron's reason, valid ones exit 0.
#include "cli/plan_validate.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

namespace remat::cli {
namespace {

std::string Example(const std::string& name) {
  return std::string(REMAT_SOURCE_DIR) + "/examples/" + name;
}

nlohmann::json PlanJson(const std::string& spec) {
  std::ostringstream out, err;
  EXPECT_EQ(RunPlan(Example(spec), /*json=*/true, out, err), 0) << err.str();
  return nlohmann::json::parse(out.str());
}

TEST(PlanTest, ControlFirstThenTheArchitecturesFirstBoundary) {
  const struct {
    const char* spec;
    const char* first_label;
  } cases[] = {
      {"llama3-8b-proxy.yaml", "selective:[core_attn]"},         // unfused standard attention
      {"deepseek-v2-lite-proxy.yaml", "selective:[core_attn]"},  // unfused MLA: core_attn first
      {"qwen-moe-proxy.yaml", "selective:[core_attn]"},
  };
  for (const auto& c : cases) {
    nlohmann::json plan = PlanJson(c.spec);
    const auto& cands = plan.at("candidates");
    ASSERT_GE(cands.size(), 3u) << c.spec;
    EXPECT_EQ(cands[0].at("policy"), "selective:[]") << c.spec;
    EXPECT_EQ(cands[0].at("reason"), "matched no-recompute control");
    EXPECT_EQ(cands[1].at("policy"), c.first_label) << c.spec;
    for (const auto& cand : cands) {
      EXPECT_GT(cand.at("predicted_peak_bytes").get<double>(), 0);
      EXPECT_GT(cand.at("predicted_activation_bytes").get<double>(), 0);
    }
    EXPECT_EQ(cands.back().at("policy"), "full:uniform:1") << c.spec;
  }
  // The architecture-specific boundaries follow core_attn in the contract's priority.
  EXPECT_EQ(PlanJson("deepseek-v2-lite-proxy.yaml").at("candidates")[2].at("policy"),
            "selective:[mla_up_proj]");
  EXPECT_EQ(PlanJson("qwen-moe-proxy.yaml").at("candidates")[2].at("policy"),
            "selective:[moe_act]");
}

TEST(PlanTest, EveryCandidateListsItsPipelineStages) {
  const struct {
    const char* spec;
    size_t stages;
    int first_layers, last_layers, first_in_flight;
  } cases[] = {
      {"llama3-8b-proxy.yaml", 1, 4, 4, 1},
      // PP 4, VPP 5, M = 128: stage 0 holds (4 - 0 - 1) x 2 + (5 - 1) x 4 + 1 chunk-forwards.
      {"large/llama3-70b.yaml", 4, 20, 20, 23},
      // (126 + embedding + loss) / 16 = 8 places: 7 layers on the first and last stages.
      {"large/llama31-405b.yaml", 16, 7, 7, 15 * 2 + 3 * 16 + 1},
      {"large/mixtral-8x22b.yaml", 8, 6, 8, 8},  // uneven split, 1F1B: PP in flight
  };
  for (const auto& c : cases) {
    const nlohmann::json plan = PlanJson(c.spec);
    for (const auto& cand : plan.at("candidates")) {
      const auto& stages = cand.at("stages");
      ASSERT_EQ(stages.size(), c.stages) << c.spec;
      uint64_t most = 0;
      for (size_t p = 0; p < stages.size(); ++p) {
        EXPECT_EQ(stages[p].at("stage"), static_cast<int>(p));
        EXPECT_GT(stages[p].at("predicted_activation_bytes").get<uint64_t>(), 0u);
        most = std::max(most, stages[p].at("predicted_peak_bytes").get<uint64_t>());
      }
      EXPECT_EQ(cand.at("predicted_peak_bytes").get<uint64_t>(), most) << c.spec;
      EXPECT_EQ(stages[0].at("layers"), c.first_layers) << c.spec;
      EXPECT_EQ(stages.back().at("layers"), c.last_layers) << c.spec;
      if (cand.at("policy") == "selective:[]") {
        EXPECT_EQ(stages[0].at("in_flight_microbatches"), c.first_in_flight) << c.spec;
      }
    }
  }
  std::ostringstream out, err;
  EXPECT_EQ(RunPlan(Example("large/llama3-70b.yaml"), false, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("PP 4 (VPP 5)"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("per pipeline stage"), std::string::npos) << out.str();
}

TEST(PlanTest, TableNamesTheSpecAndBadSpecsExitTwo) {
  std::ostringstream out, err;
  EXPECT_EQ(RunPlan(Example("tiny-dense.yaml"), false, out, err), 0);
  EXPECT_NE(out.str().find("plan for tiny-dense"), std::string::npos);
  std::ostringstream out2, err2;
  EXPECT_EQ(RunPlan("/nonexistent.yaml", false, out2, err2), 2);
  EXPECT_EQ(err2.str().rfind("error: ", 0), 0u);
}

int Validate(const std::string& spec, const std::string& policy, std::string* message) {
  std::ostringstream out, err;
  int code = RunValidate(Example(spec), policy, out, err);
  *message = out.str() + err.str();
  return code;
}

TEST(ValidateTest, InvalidPoliciesExitTwoWithTheReason) {
  const struct {
    const char* spec;
    const char* policy;
    const char* reason;
  } cases[] = {
      {"llama3-8b-proxy.yaml", "selective:[moe_act]", "no experts"},
      {"llama3-8b-proxy.yaml", "selective:[mla_up_proj]", "only supported with multi_latent_attention"},
      {"llama3-8b-proxy.yaml", "selective:[gdn_norm_out]", "experimental_attention_variant"},
      {"llama3-8b-proxy.yaml", "full:block:5", "between 1 and the layers per pipeline stage (4)"},
      {"llama3-8b-proxy.yaml", "selective:[attn]", "unknown recompute module"},
      {"qwen-moe-proxy.yaml", "selective:[mlp]", "every layer's MLP is a mixture of experts"},
  };
  for (const auto& c : cases) {
    std::string message;
    EXPECT_EQ(Validate(c.spec, c.policy, &message), 2) << c.policy;
    EXPECT_EQ(message.rfind("error: ", 0), 0u) << message;
    EXPECT_NE(message.find(c.reason), std::string::npos) << message;
  }
}

TEST(ValidateTest, ValidPoliciesExitZeroWithTheSettings) {
  std::string message;
  EXPECT_EQ(Validate("deepseek-v2-lite-proxy.yaml", "selective:[mla_up_proj, core_attn]", &message), 0);
  EXPECT_NE(message.find("valid: selective:[core_attn,mla_up_proj]"), std::string::npos);
  EXPECT_NE(message.find("model.recompute_modules=[core_attn,mla_up_proj]"), std::string::npos);
  EXPECT_EQ(Validate("qwen-moe-proxy.yaml", "none", &message), 0);
  EXPECT_EQ(Validate("qwen-moe-proxy.yaml", "full:uniform:4", &message), 0);
}

}  // namespace
}  // namespace remat::cli
