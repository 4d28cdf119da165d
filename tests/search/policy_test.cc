#include "search/policy.h"

#include <gtest/gtest.h>

namespace remat::search {
namespace {

TEST(PolicyTest, ParsesAndPrintsCanonicalForms) {
  for (const char* s : {"selective:[]", "selective:[core_attn]", "selective:[core_attn,moe_act]",
                        "full:uniform:2", "full:block:3"}) {
    auto p = ParsePolicy(s);
    ASSERT_TRUE(p.ok()) << s << ": " << p.status().message();
    EXPECT_EQ(p->ToString(), s);
  }
}

TEST(PolicyTest, NoneIsTheEmptySelectiveControl) {
  auto p = ParsePolicy("none");
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->IsNone());
  EXPECT_EQ(p->ToString(), "selective:[]");
}

TEST(PolicyTest, LabelsAreCanonicallyOrderedWhateverTheInput) {
  auto p = ParsePolicy(" selective:[ shared_experts, mlp,core_attn , gdn_norm_out,layernorm] ");
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->ToString(), "selective:[core_attn,layernorm,mlp,shared_experts,gdn_norm_out]");
}

TEST(PolicyTest, AllEightLabelsRoundTrip) {
  auto p = ParsePolicy(
      "selective:[gdn_norm_out,shared_experts,moe,mlp,mla_up_proj,layernorm,moe_act,core_attn]");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ToString(),
            "selective:[core_attn,moe_act,layernorm,mla_up_proj,mlp,moe,shared_experts,"
            "gdn_norm_out]");
}

TEST(PolicyTest, RejectsBadInputWithAReason) {
  struct Case {
    const char* text;
    const char* fragment;
  } cases[] = {
      {"", "empty"},
      {"selective:[attn]", "unknown recompute module 'attn'"},
      {"selective:[core_attn,core_attn]", "listed twice"},
      {"selective:core_attn", "brackets"},
      {"full:uniform", "method and a layer count"},
      {"full:ring:2", "must be \"block\" or \"uniform\""},
      {"full:block:0", "at least 1"},
      {"full:block:-1", "positive integer"},
      {"full:block:x", "positive integer"},
      {"partial:[core_attn]", "\"full\" or \"selective\""},
      {"selective:[core_attn,]", "missing after the last ','"},
      {"selective:[core_attn]\nerror: x", "not a policy string"},
      {"selective:[\xFF]", "not a policy string"},
  };
  for (const auto& c : cases) {
    auto p = ParsePolicy(c.text);
    ASSERT_FALSE(p.ok()) << c.text;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.fragment), std::string::npos)
        << c.text << " -> " << p.status().message();
  }
}

TEST(PolicyTest, ALongPolicyIsRefusedWithoutEchoingIt) {
  auto p = ParsePolicy("selective:[" + std::string(50 << 20, 'x') + "]");
  ASSERT_FALSE(p.ok());
  EXPECT_LT(p.status().message().size(), 200u);
  EXPECT_NE(p.status().message().find("longer than"), std::string::npos) << p.status().message();
}

TEST(PolicyTest, WithAndWithoutKeepCanonicalOrder) {
  Policy p = Policy::Selective({Label::kMoeAct});
  EXPECT_EQ(p.With(Label::kCoreAttn).ToString(), "selective:[core_attn,moe_act]");
  EXPECT_EQ(p.With(Label::kMoeAct).ToString(), "selective:[moe_act]");
  EXPECT_EQ(p.With(Label::kCoreAttn).Without(Label::kMoeAct).ToString(), "selective:[core_attn]");
  EXPECT_TRUE(p.Has(Label::kMoeAct));
  EXPECT_FALSE(Policy::Full(RecomputeMethod::kBlock, 1).Has(Label::kMoeAct));
}

TEST(PolicyTest, ApplyStringsForBridgeAndMegatronLm) {
  Policy sel = Policy::Selective({Label::kMoeAct, Label::kCoreAttn});
  EXPECT_EQ(sel.MegatronBridgeOverrides(),
            "model.recompute_granularity=selective model.recompute_method=null "
            "model.recompute_num_layers=null model.recompute_modules=[core_attn,moe_act]");
  EXPECT_EQ(sel.MegatronLmFlags(),
            "--recompute-granularity selective --recompute-modules core_attn moe_act");
  Policy full = Policy::Full(RecomputeMethod::kUniform, 1);
  EXPECT_EQ(full.MegatronBridgeOverrides(),
            "model.recompute_granularity=full model.recompute_method=uniform "
            "model.recompute_num_layers=1 model.recompute_modules=null");
  EXPECT_EQ(full.MegatronLmFlags(),
            "--recompute-granularity full --recompute-method uniform --recompute-num-layers 1");
  EXPECT_EQ(Policy::None().MegatronBridgeOverrides(),
            "model.recompute_granularity=selective model.recompute_method=null "
            "model.recompute_num_layers=null model.recompute_modules=[]");
  EXPECT_EQ(sel.MegatronLmFlagsToRemove(),
            "--recompute-method --recompute-num-layers --recompute-activations "
            "--distribute-saved-activations");
  EXPECT_EQ(full.MegatronLmFlagsToRemove(), "--recompute-modules --recompute-activations");
}

}  // namespace
}  // namespace remat::search
