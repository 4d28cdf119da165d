// Equivalence classes of recompute policies (search/equivalence.h), and that the measured H200
// tables agree: every member of a class peaks exactly where its representative does.
#include "search/equivalence.h"

#include <gtest/gtest.h>

#include <set>

#include "search/planner.h"
#include "search/rules.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

Policy P(const char* text) { return *ParsePolicy(text); }

TEST(Equivalence, MoeWrapsMoeActAndSharedExperts) {
  const SearchSpec s = testing::MoeSpec();
  for (const char* member : {"selective:[moe,moe_act]", "selective:[moe,shared_experts]",
                             "selective:[moe,moe_act,shared_experts]"}) {
    const ClassOf c = EquivalenceClassOf(s, P(member));
    EXPECT_EQ(c.representative, P("selective:[moe]")) << member;
    EXPECT_NE(c.reason.find("MoELayer.forward"), std::string::npos) << c.reason;
  }
  const ClassOf c = EquivalenceClassOf(s, P("selective:[core_attn,layernorm,moe,moe_act]"));
  EXPECT_EQ(c.representative, P("selective:[core_attn,layernorm,moe]"));
  // Without moe the labels are their own classes.
  EXPECT_TRUE(IsRepresentative(s, P("selective:[moe_act,shared_experts]")));
  EXPECT_TRUE(IsRepresentative(s, P("selective:[moe]")));
}

TEST(Equivalence, LocalCudaGraphsClaimNothingForMoe) {
  SearchSpec s = testing::MoeSpec();
  s.model.cuda_graph_impl = "local";
  EXPECT_TRUE(IsRepresentative(s, P("selective:[moe,moe_act]")));
}

TEST(Equivalence, BlockOverEveryLayerOfAChunkIsUniformOne) {
  SearchSpec s = testing::DenseSpec();  // 4 layers, one stage
  EXPECT_EQ(EquivalenceClassOf(s, P("full:block:4")).representative, P("full:uniform:1"));
  EXPECT_TRUE(IsRepresentative(s, P("full:block:3")));
  EXPECT_TRUE(IsRepresentative(s, P("full:uniform:4")));  // one checkpoint over 4 layers
  s.parallel.pipeline_model_parallel_size = 2;             // 2 layers a stage
  EXPECT_EQ(EquivalenceClassOf(s, P("full:block:2")).representative, P("full:uniform:1"));
  EXPECT_TRUE(IsRepresentative(s, P("full:block:1")));
}

TEST(Equivalence, ClassesPartitionTheValidPolicies) {
  const SearchSpec s = testing::MoeSpec();
  const auto all = EnumerateValidPolicies(s);
  std::set<std::string> seen;
  size_t members = 0;
  for (const auto& c : EquivalenceClasses(s)) {
    EXPECT_TRUE(seen.insert(c.representative.ToString()).second);
    ++members;
    for (const auto& o : c.others) {
      EXPECT_TRUE(seen.insert(o.representative.ToString()).second);
      EXPECT_EQ(EquivalenceClassOf(s, o.representative).representative, c.representative);
      ++members;
    }
  }
  EXPECT_EQ(members, all.size());
  EXPECT_LT(EquivalenceClasses(s).size(), all.size());
}

TEST(Equivalence, GuidedSearchProposesOneSelectivePolicyPerClass) {
  SearchSpec s = testing::MoeSpec();
  s.search.memory_budget_gib = 1000;
  s.search.max_trials = 1000;
  auto strategy = MakeGuidedStrategy(s);
  for (int guard = 0; guard < 200 && !strategy->Done(); ++guard) {
    const auto batch = strategy->Propose(4);
    if (batch.empty()) break;
    for (const auto& c : batch) {
      if (!c.policy.IsFull()) EXPECT_TRUE(IsRepresentative(s, c.policy)) << c.policy.ToString();
      TrialResult r;
      r.policy = c.policy;
      r.status = TrialStatus::kFailed;
      strategy->Observe(r);
    }
  }
  for (const auto& c : InitialPlan(s)) EXPECT_TRUE(IsRepresentative(s, c.policy));
}

}  // namespace
}  // namespace remat::search
