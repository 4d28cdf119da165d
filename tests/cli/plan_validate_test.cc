// `remat plan` and `remat validate` on the example specs: the control first, the architecture's
// first boundary next; invalid policies exit 2 with Megatron's reason, valid ones exit 0.
#include "cli/plan_validate.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
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

// A spec file for the length of a test: llama3-8b-proxy's model with `extra` lines appended to
// the model section and `tail` (other sections) after it.
class TempSpec {
 public:
  TempSpec(const std::string& model_extra, const std::string& tail = "") {
    char path[] = "/tmp/remat-plan-XXXXXX";
    const int fd = mkstemp(path);
    ::close(fd);
    path_ = path;
    std::ofstream(path_) << "name: t\nmodel:\n  num_layers: 4\n  hidden_size: 4096\n"
                            "  num_attention_heads: 32\n  num_query_groups: 8\n"
                            "  ffn_hidden_size: 14336\n  gated_linear_unit: true\n"
                            "  normalization: RMSNorm\n  seq_length: 4096\n"
                            "  vocab_size: 128256\n  attention_dropout: 0.0\n"
                            "  hidden_dropout: 0.0\n  position_embedding_type: rope\n"
                         << (model_extra.find("add_bias_linear") == std::string::npos
                                 ? "  add_bias_linear: false\n"
                                 : "")
                         << model_extra << tail;
  }
  ~TempSpec() { std::remove(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Spec-wide rules are refused by plan and validate alike (exit 2, the field first), before any
// trial: here a grouped-GEMM MoE with linear biases.
TEST(PlanTest, SpecWideRulesExitTwoNamingTheField) {
  TempSpec spec("  num_moe_experts: 8\n  moe_grouped_gemm: true\n  add_bias_linear: true\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunPlan(spec.path(), false, out, err), 2);
  EXPECT_EQ(err.str().rfind("error: model.add_bias_linear:", 0), 0u) << err.str();
  std::ostringstream out2, err2;
  EXPECT_EQ(RunValidate(spec.path(), "none", false, out2, err2), 2);
  EXPECT_EQ(err2.str().rfind("error: model.add_bias_linear:", 0), 0u) << err2.str();
}

// Static memory over the budget: the plan says so first and names the levers, instead of a
// table of policies that all fail to fit.
TEST(PlanTest, StaticOverBudgetNamesTheLevers) {
  // 4 layers of Llama-3-8B + its vocabulary: about 2.6 B parameters, 18 bytes each: ~44 GiB.
  TempSpec spec("  attention_backend: unfused\n",
                "parallel:\n  data_parallel_size: 4\nsearch:\n  memory_budget_gib: 30\n");
  std::ostringstream out, err;
  ASSERT_EQ(RunPlan(spec.path(), false, out, err), 0) << err.str();
  const std::string text = out.str();
  EXPECT_NE(text.find("static memory alone"), std::string::npos) << text;
  EXPECT_NE(text.find("no recompute policy can fit"), std::string::npos) << text;
  EXPECT_NE(text.find("train.use_distributed_optimizer: true"), std::string::npos) << text;
  EXPECT_NE(text.find("parallel.tensor_model_parallel_size: 2"), std::string::npos) << text;
  EXPECT_EQ(text.find("selective:[core_attn]"), std::string::npos) << text;  // no table
  std::ostringstream jout, jerr;
  ASSERT_EQ(RunPlan(spec.path(), true, jout, jerr), 0);
  const auto j = nlohmann::json::parse(jout.str());
  ASSERT_TRUE(j.contains("capacity")) << j.dump(2);
  EXPECT_TRUE(j["capacity"]["static_exceeds_budget"].get<bool>());
  EXPECT_GT(j["capacity"]["predicted_static_bytes"].get<double>(), 30.0 * (1ull << 30));
  ASSERT_FALSE(j["capacity"]["levers"].empty());
  // The distributed optimizer over DP 4: 6 + 12/4 = 9 bytes per parameter, half of 18.
  bool dist = false;
  for (const auto& l : j["capacity"]["levers"]) {
    if (l["setting"] == "train.use_distributed_optimizer: true") {
      dist = true;
      EXPECT_TRUE(l["static_fits"].get<bool>());
    }
  }
  EXPECT_TRUE(dist);
  // Under the budget: no capacity finding.
  EXPECT_FALSE(PlanJson("llama3-8b-proxy.yaml").contains("capacity"));
}

TEST(PlanTest, BuiltinBackendLimitsAreANote) {
  // Hierarchical context parallelism is planned, not run by the engine.
  TempSpec spec("  attention_backend: flash\n",
                "parallel:\n  context_parallel_size: 2\n  cp_comm_type: a2a+p2p\n");
  std::ostringstream out, err;
  ASSERT_EQ(RunPlan(spec.path(), false, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("note: the builtin backend will refuse to search this spec: "
                           "parallel.cp_comm_type:"),
            std::string::npos)
      << out.str();
}

// A MoE whose router learns its routing measures step times that drift: the plan says so, in the
// table's header and in the JSON, and says nothing once routing is forced to balance.
TEST(PlanTest, LearnedRoutingIsAMeasurementNote) {
  const std::string moe = "  num_moe_experts: 8\n  moe_router_topk: 2\n  moe_grouped_gemm: true\n";
  for (bool forced : {false, true}) {
    SCOPED_TRACE(forced);
    TempSpec spec(moe + (forced ? "  moe_router_force_load_balancing: true\n" : ""));
    std::ostringstream out, err, json_out;
    ASSERT_EQ(RunPlan(spec.path(), false, out, err), 0) << err.str();
    ASSERT_EQ(RunPlan(spec.path(), true, json_out, err), 0) << err.str();
    const auto j = nlohmann::json::parse(json_out.str());
    const bool noted = out.str().find("note: measurement: the router learns its routing "
                                      "(model.moe_router_force_load_balancing is off)") !=
                       std::string::npos;
    EXPECT_EQ(noted, !forced) << out.str();
    EXPECT_EQ(j.contains("measurement_caution"), !forced);
  }
  TempSpec dense("");
  std::ostringstream out, err;
  ASSERT_EQ(RunPlan(dense.path(), false, out, err), 0) << err.str();
  EXPECT_EQ(out.str().find("note: measurement:"), std::string::npos);
  // A replayed table was measured already: no caution about measuring.
  std::ostringstream replay_out;
  ASSERT_EQ(RunPlan(Example("replay/h200-mla-moe16.yaml"), false, replay_out, err), 0) << err.str();
  EXPECT_EQ(replay_out.str().find("note: measurement:"), std::string::npos);
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
  int code = RunValidate(Example(spec), policy, false, out, err);
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

// Valid but pointless: a warning on stderr, exit 0.
TEST(ValidateTest, PointlessPoliciesWarn) {
  TempSpec flash("  attention_backend: flash\n");
  std::ostringstream out, err;
  EXPECT_EQ(RunValidate(flash.path(), "selective:[core_attn]", false, out, err), 0) << err.str();
  EXPECT_NE(out.str().find("valid: selective:[core_attn]"), std::string::npos);
  EXPECT_EQ(err.str().rfind("warning: core_attn under flash", 0), 0u) << err.str();
  std::ostringstream out2, err2;
  EXPECT_EQ(RunValidate(flash.path(), "selective:[mlp]", false, out2, err2), 0);
  EXPECT_EQ(err2.str(), "");
  // Megatron's names for the backend: local is the unfused attention, no warning there.
  TempSpec local("  attention_backend: local\n");
  std::ostringstream out3, err3;
  EXPECT_EQ(RunValidate(local.path(), "selective:[core_attn]", false, out3, err3), 0);
  EXPECT_EQ(err3.str(), "");
}

// --json: the policy's prediction as the plan gives it for the same policy (every stage, the
// fit against the budget), its warnings and its apply strings; an invalid policy is still one
// error line and exit 2.
TEST(ValidateTest, JsonGivesThePlansPredictionForThePolicy) {
  const std::string spec = "large/llama3-70b.yaml";
  const nlohmann::json plan = PlanJson(spec);
  ASSERT_FALSE(plan["candidates"].empty());
  const nlohmann::json& control = plan["candidates"][0];
  std::ostringstream out, err;
  ASSERT_EQ(RunValidate(Example(spec), control["policy"], /*json=*/true, out, err), 0)
      << err.str();
  const nlohmann::json j = nlohmann::json::parse(out.str());
  EXPECT_EQ(j["policy"], control["policy"]);
  EXPECT_EQ(j["valid"], true);
  for (const char* key : {"predicted_peak_bytes", "predicted_activation_bytes",
                          "predicted_static_bytes", "predicted_fits", "peak_stage", "stages"}) {
    EXPECT_EQ(j[key], control[key]) << key;
  }
  EXPECT_EQ(j["memory_budget_bytes"], plan["memory_budget_bytes"]);
  EXPECT_GT(j["stages"].size(), 1u);
  EXPECT_EQ(j["predicted_fits"],
            j["predicted_peak_bytes"].get<uint64_t>() <= j["memory_budget_bytes"].get<uint64_t>());
  EXPECT_TRUE(j["warnings"].is_array());
  EXPECT_NE(j["apply"]["megatron_bridge"].get<std::string>().find("recompute_granularity"),
            std::string::npos);
  std::ostringstream out2, err2;
  EXPECT_EQ(RunValidate(Example(spec), "full:block:999", true, out2, err2), 2);
  EXPECT_EQ(out2.str(), "");
  EXPECT_EQ(err2.str().rfind("error: ", 0), 0u) << err2.str();
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
