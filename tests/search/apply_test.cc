// The apply strings apply cleanly: every valid policy's Megatron Bridge overrides, applied over
// recipes that already set recompute (full from a recipe, selective, none), and its Megatron-LM
// flags, added to command lines after removing what the policy says to remove, leave a
// configuration that remat's copy of the Megatron rules (search/rules.h CheckRecomputeFields)
// accepts and that says exactly the policy. The issue's failure is reproduced first.
#include <gtest/gtest.h>

#include <algorithm>

#include "search/policy.h"
#include "search/rules.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

RecomputeFields Recipe(std::optional<std::string> granularity, std::optional<std::string> method,
                       std::optional<int> layers,
                       std::optional<std::vector<std::string>> modules) {
  RecomputeFields f;
  f.granularity = std::move(granularity);
  f.method = std::move(method);
  f.num_layers = layers;
  f.modules = std::move(modules);
  return f;
}

// The recipes a user may start from.
std::vector<RecomputeFields> BridgeRecipes() {
  return {Recipe(std::nullopt, std::nullopt, std::nullopt, std::nullopt),
          Recipe("full", "uniform", 1, std::nullopt),
          Recipe("full", "block", 4, std::vector<std::string>{"core_attn"}),
          Recipe("selective", std::nullopt, std::nullopt,
                 std::vector<std::string>{"core_attn", "mlp"}),
          Recipe("selective", std::nullopt, std::nullopt, std::nullopt)};
}

// What the policy means, field by field (modules only matter under selective).
void ExpectSays(const RecomputeFields& got, const Policy& policy, const std::string& where) {
  const RecomputeFields want = FieldsOf(policy);
  std::optional<std::string> granularity = got.granularity;
  if (got.recompute_activations) granularity = "selective";
  EXPECT_EQ(granularity, want.granularity) << where;
  EXPECT_EQ(got.method, want.method) << where;
  EXPECT_EQ(got.num_layers, want.num_layers) << where;
  if (!policy.IsFull()) {
    EXPECT_EQ(got.modules, want.modules) << where;
  }
}

std::vector<Policy> EveryPolicy() {
  std::vector<Policy> all;
  for (const SearchSpec& spec : {testing::DenseSpec(), testing::MoeSpec(), testing::MlaSpec()}) {
    for (const Policy& p : EnumerateValidPolicies(spec)) all.push_back(p);
  }
  return all;
}

TEST(ApplyStrings, TheIssuesFailureWithoutTheResets) {
  // A recipe with full recompute plus the selective overrides alone is refused by Megatron Core.
  auto fields = ApplyBridgeOverrides(
      Recipe("full", "uniform", 1, std::nullopt),
      "model.recompute_granularity=selective model.recompute_modules=[core_attn]");
  ASSERT_TRUE(fields.ok());
  const Status s = CheckRecomputeFields(*fields, /*megatron_lm=*/false);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("recompute_num_layers must be None"), std::string::npos);
  // And Megatron-LM with the selective flags appended to a full command line.
  auto lm = MegatronLmRecomputeFields(
      {"--recompute-granularity", "full", "--recompute-method", "uniform",
       "--recompute-num-layers", "1", "--recompute-granularity", "selective",
       "--recompute-modules", "core_attn"});
  ASSERT_TRUE(lm.ok());
  EXPECT_FALSE(CheckRecomputeFields(*lm, /*megatron_lm=*/true).ok());
}

TEST(ApplyStrings, BridgeOverridesApplyOverAnyRecipe) {
  const std::vector<Policy> policies = EveryPolicy();
  ASSERT_GT(policies.size(), 20u);
  for (const Policy& p : policies) {
    for (const RecomputeFields& recipe : BridgeRecipes()) {
      const std::string where = p.ToString() + " over recipe " +
                                recipe.granularity.value_or("null") + "/" +
                                recipe.method.value_or("null");
      auto fields = ApplyBridgeOverrides(recipe, p.MegatronBridgeOverrides());
      ASSERT_TRUE(fields.ok()) << where << ": " << fields.status().message();
      const Status s = CheckRecomputeFields(*fields, /*megatron_lm=*/false);
      EXPECT_TRUE(s.ok()) << where << ": " << s.message();
      ExpectSays(*fields, p, where);
    }
  }
}

TEST(ApplyStrings, MegatronLmFlagsAfterRemovingTheStaleOnes) {
  const std::vector<std::vector<std::string>> command_lines = {
      {"--num-layers", "32", "--bf16"},
      {"--num-layers", "32", "--recompute-granularity", "full", "--recompute-method", "block",
       "--recompute-num-layers", "4", "--bf16"},
      {"--recompute-granularity", "full", "--recompute-method", "uniform",
       "--recompute-num-layers", "1", "--distribute-saved-activations",
       "--tensor-model-parallel-size", "8"},
      {"--recompute-activations", "--seq-length", "4096"},
      {"--recompute-granularity", "selective", "--recompute-modules", "core_attn", "mlp",
       "--hidden-size", "4096"}};
  for (const Policy& p : EveryPolicy()) {
    for (const auto& line : command_lines) {
      const std::vector<std::string> edited =
          EditMegatronLmArgs(line, p.MegatronLmFlagsToRemove(), p.MegatronLmFlags());
      std::string where = p.ToString() + " over";
      for (const auto& a : line) where += " " + a;
      auto fields = MegatronLmRecomputeFields(edited);
      ASSERT_TRUE(fields.ok()) << where << ": " << fields.status().message();
      const Status s = CheckRecomputeFields(*fields, /*megatron_lm=*/true);
      EXPECT_TRUE(s.ok()) << where << ": " << s.message();
      if (p.IsNone()) {
        // No recompute: no recompute flag left at all.
        EXPECT_FALSE(fields->granularity.has_value()) << where;
        EXPECT_FALSE(fields->recompute_activations) << where;
      } else {
        ExpectSays(*fields, p, where);
      }
      // The other flags stay as they were.
      for (const std::string& keep : {"--num-layers", "--bf16", "--seq-length", "--hidden-size",
                                      "--tensor-model-parallel-size"}) {
        const bool before = std::find(line.begin(), line.end(), keep) != line.end();
        const bool after = std::find(edited.begin(), edited.end(), keep) != edited.end();
        EXPECT_EQ(before, after) << where << ": " << keep;
      }
    }
  }
}

TEST(ApplyStrings, OurCopyOfTheRulesRefusesWhatMegatronRefuses) {
  EXPECT_FALSE(CheckRecomputeFields(Recipe("full", std::nullopt, 1, std::nullopt), false).ok());
  EXPECT_FALSE(CheckRecomputeFields(Recipe("full", "uniform", std::nullopt, std::nullopt), false)
                   .ok());
  EXPECT_FALSE(CheckRecomputeFields(Recipe("partial", std::nullopt, std::nullopt, std::nullopt),
                                    false).ok());
  EXPECT_FALSE(CheckRecomputeFields(Recipe("full", "random", 1, std::nullopt), false).ok());
  EXPECT_FALSE(CheckRecomputeFields(
      Recipe("selective", std::nullopt, std::nullopt, std::vector<std::string>{"attn"}), false)
                   .ok());
  // Selective with a method: Megatron Core accepts it, Megatron-LM's arguments.py does not.
  const RecomputeFields sel_method =
      Recipe("selective", "uniform", std::nullopt, std::vector<std::string>{"core_attn"});
  EXPECT_TRUE(CheckRecomputeFields(sel_method, false).ok());
  EXPECT_FALSE(CheckRecomputeFields(sel_method, true).ok());
  RecomputeFields dsa = Recipe("selective", std::nullopt, std::nullopt, std::nullopt);
  dsa.distribute_saved_activations = true;
  EXPECT_FALSE(CheckRecomputeFields(dsa, true).ok());
  EXPECT_TRUE(CheckRecomputeFields(Recipe(std::nullopt, "uniform", 3, std::nullopt), false).ok());
}

}  // namespace
}  // namespace remat::search
