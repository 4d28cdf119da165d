#include "search/rules.h"

#include <gtest/gtest.h>

#include <set>

#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

using testing::DenseSpec;
using testing::MlaSpec;
using testing::MoeSpec;

Policy P(const std::string& s) {
  auto p = ParsePolicy(s);
  EXPECT_TRUE(p.ok()) << s;
  return *p;
}

void ExpectInvalid(const SearchSpec& spec, const std::string& policy, const std::string& why) {
  Status st = ValidatePolicy(spec, P(policy));
  ASSERT_FALSE(st.ok()) << policy << " should be invalid";
  EXPECT_NE(st.message().find(why), std::string::npos) << policy << " -> " << st.message();
}

void ExpectValid(const SearchSpec& spec, const std::string& policy) {
  Status st = ValidatePolicy(spec, P(policy));
  EXPECT_TRUE(st.ok()) << policy << " -> " << st.message();
}

TEST(RulesTest, ControlAndCommonPoliciesAreValidOnDense) {
  SearchSpec s = DenseSpec();
  ExpectValid(s, "selective:[]");
  ExpectValid(s, "selective:[core_attn]");
  ExpectValid(s, "selective:[core_attn,layernorm,mlp]");
  ExpectValid(s, "full:uniform:1");
  ExpectValid(s, "full:block:4");
}

TEST(RulesTest, FullNeedsLayerCountWithinTheStage) {
  SearchSpec s = DenseSpec();
  ExpectInvalid(s, "full:block:5", "between 1 and the layers per pipeline stage (4)");
  s.parallel.pipeline_model_parallel_size = 2;
  ExpectValid(s, "full:uniform:2");
  ExpectInvalid(s, "full:uniform:3", "(2)");
  EXPECT_EQ(LayersPerStage(s), 2);
}

TEST(RulesTest, MoeActNeedsGroupedGemmExperts) {
  ExpectInvalid(DenseSpec(), "selective:[moe_act]", "no experts");
  SearchSpec s = MoeSpec();
  s.model.moe_grouped_gemm = false;
  ExpectInvalid(s, "selective:[moe_act]", "only supported with moe_grouped_gemm");
  ExpectValid(MoeSpec(), "selective:[moe_act]");
}

TEST(RulesTest, MlaUpProjNeedsMla) {
  ExpectInvalid(DenseSpec(), "selective:[mla_up_proj]", "only supported with multi_latent_attention");
  ExpectValid(MlaSpec(), "selective:[mla_up_proj]");
  ExpectValid(MlaSpec(), "selective:[core_attn,mla_up_proj]");
}

TEST(RulesTest, GdnNormOutNeedsGdn) {
  ExpectInvalid(DenseSpec(), "selective:[gdn_norm_out]", "experimental_attention_variant");
  SearchSpec s = DenseSpec();
  s.model.experimental_attention_variant = "gdn";
  ExpectValid(s, "selective:[gdn_norm_out]");
}

TEST(RulesTest, SharedExpertsConflictsWithSharedExpertOverlap) {
  SearchSpec s = MoeSpec();
  ExpectValid(s, "selective:[shared_experts]");
  s.model.moe_shared_expert_overlap = true;
  ExpectInvalid(s, "selective:[shared_experts]", "cannot work with moe_shared_expert_overlap");
  SearchSpec no_shared = MoeSpec();
  no_shared.model.moe_shared_expert_intermediate_size.reset();
  ExpectInvalid(no_shared, "selective:[shared_experts]", "no shared experts");
}

TEST(RulesTest, MoeAndFullConflictWithExpertParallelOverlap) {
  SearchSpec s = MoeSpec();
  s.model.overlap_moe_expert_parallel_comm = true;
  ExpectInvalid(s, "selective:[moe]", "overlap_moe_expert_parallel_comm");
  ExpectInvalid(s, "full:uniform:1", "overlap_moe_expert_parallel_comm");
  ExpectValid(s, "selective:[moe_act]");
}

TEST(RulesTest, DistributeSavedActivationsConflictsWithSequenceParallel) {
  SearchSpec s = DenseSpec();
  s.model.distribute_saved_activations = true;
  ExpectValid(s, "full:uniform:1");
  s.parallel.tensor_model_parallel_size = 2;
  s.parallel.sequence_parallel = true;
  ExpectInvalid(s, "full:uniform:1", "sequence parallel");
  ExpectInvalid(s, "selective:[]", "sequence parallel");
}

TEST(RulesTest, CpuOffloadingConflictsWithAnyRecomputeIncludingTheControl) {
  SearchSpec s = DenseSpec();
  s.model.cpu_offloading = true;
  ExpectInvalid(s, "selective:[]", "CPU offloading does not work");
  ExpectInvalid(s, "full:block:1", "CPU offloading does not work");
  EXPECT_TRUE(EnumerateValidPolicies(s).empty());
}

TEST(RulesTest, NoOpLabelsAreRefusedWithTheReason) {
  ExpectInvalid(DenseSpec(), "selective:[moe]", "no experts");
  ExpectInvalid(DenseSpec(), "selective:[shared_experts]", "no shared experts");
  ExpectInvalid(MoeSpec(), "selective:[mlp]", "every layer's MLP is a mixture of experts");
  SearchSpec mixed = MoeSpec();
  mixed.model.moe_layer_freq.every = 2;  // dense layers exist: mlp has an effect there
  ExpectValid(mixed, "selective:[mlp]");
}

// The decision guide's FP8 and CUDA-graph constraints (Megatron Core's rules): refused per
// policy, with the reason, and never proposed.
TEST(RulesTest, Fp8DelayedScalingRefusesMoeActAndLayernorm) {
  SearchSpec s = MoeSpec();
  s.model.fp8 = "hybrid";  // fp8_recipe defaults to delayed
  ExpectInvalid(s, "selective:[moe_act]", "FP8 delayed scaling");
  ExpectInvalid(s, "selective:[layernorm]", "FP8 delayed scaling");
  ExpectValid(s, "selective:[core_attn]");
  s.model.fp8_recipe = "tensorwise";
  ExpectValid(s, "selective:[layernorm,moe_act]");
}

TEST(RulesTest, CudaGraphsConstrainRecompute) {
  SearchSpec s = DenseSpec();
  s.model.cuda_graph_impl = "transformer_engine";
  ExpectInvalid(s, "full:uniform:1", "full-iteration CUDA graphs");
  ExpectValid(s, "selective:[core_attn,mlp]");  // no dropout in the graphed regions
  s.model.attention_dropout = 0.1;
  s.model.hidden_dropout = 0.1;
  ExpectInvalid(s, "selective:[core_attn]", "attention dropout");
  ExpectInvalid(s, "selective:[mlp]", "hidden dropout");
  s.model.cuda_graph_scope = {"mlp"};  // attention runs eagerly: its checkpoint is fine
  ExpectValid(s, "selective:[core_attn]");
  ExpectInvalid(s, "selective:[mlp]", "hidden dropout");
  s.model.cuda_graph_impl = "full_iteration";
  s.model.cuda_graph_scope.clear();
  ExpectValid(s, "full:uniform:1");
  for (const Policy& p : EnumerateValidPolicies(s)) {
    EXPECT_FALSE(p.Has(Label::kCoreAttn) || p.Has(Label::kMlp)) << p.ToString();
  }

  SearchSpec moe = MoeSpec();
  moe.model.cuda_graph_impl = "transformer_engine";
  moe.model.cuda_graph_scope = {"attn", "moe_router"};
  ExpectInvalid(moe, "selective:[moe]", "moe_router CUDA graph");
  ExpectValid(moe, "selective:[moe_act]");
}

TEST(RulesTest, WarningsForValidButPointlessPolicies) {
  SearchSpec flash = DenseSpec();
  flash.model.attention_backend = AttentionBackend::kFlash;
  ASSERT_EQ(PolicyWarnings(flash, P("selective:[core_attn]")).size(), 1u);
  EXPECT_NE(PolicyWarnings(flash, P("selective:[core_attn]"))[0].find("flash"), std::string::npos);
  EXPECT_TRUE(PolicyWarnings(DenseSpec(), P("selective:[core_attn]")).empty());  // unfused
  EXPECT_TRUE(PolicyWarnings(flash, P("selective:[mlp]")).empty());
  const auto nested = PolicyWarnings(MoeSpec(), P("selective:[moe_act,moe,shared_experts]"));
  EXPECT_EQ(nested.size(), 2u);
  SearchSpec graphs = DenseSpec();
  graphs.model.cuda_graph_impl = "local";
  graphs.model.cuda_graph_scope = {"attn"};
  EXPECT_EQ(PolicyWarnings(graphs, P("selective:[core_attn]")).size(), 1u);
  EXPECT_TRUE(PolicyWarnings(graphs, P("selective:[mlp]")).empty());
}

TEST(RulesTest, ValidLabelsPerArchitecture) {
  auto names = [](const SearchSpec& s) {
    std::string out;
    for (Label l : ValidLabels(s)) out += std::string(LabelName(l)) + " ";
    return out;
  };
  EXPECT_EQ(names(DenseSpec()), "core_attn layernorm mlp ");
  EXPECT_EQ(names(MlaSpec()), "core_attn layernorm mla_up_proj mlp ");
  EXPECT_EQ(names(MoeSpec()), "core_attn moe_act layernorm moe shared_experts ");
}

TEST(RulesTest, EnumerationIsCompleteUniqueAndValid) {
  SearchSpec s = MoeSpec();
  auto all = EnumerateValidPolicies(s);
  std::set<std::string> seen;
  for (const auto& p : all) {
    EXPECT_TRUE(ValidatePolicy(s, p).ok()) << p.ToString();
    EXPECT_TRUE(seen.insert(p.ToString()).second) << "duplicate " << p.ToString();
  }
  // 5 valid labels -> 32 subsets; 4 layers -> 4 uniform + 4 block.
  EXPECT_EQ(all.size(), 32u + 8u);
  EXPECT_EQ(all.front().ToString(), "selective:[]");
}

}  // namespace
}  // namespace remat::search
