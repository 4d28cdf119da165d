// `remat plan` and `remat validate` on the example specs: the control first, the architecture's
// first boundary next; invalid policies exit 2 with Megatron's reason, valid ones exit 0.
#include "cli/plan_validate.h"

#include <gtest/gtest.h>

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
