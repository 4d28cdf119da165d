// Megatron's explicit pipeline layout (parallel.pipeline_model_parallel_layout): the grammar as
// Megatron Core unrolls it, its validation rules, the stages search/pipeline.h takes from it, and
// multi-token prediction's place and cost in the memory model.
#include "search/pipeline_layout.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "search/memory_model.h"
#include "search/mtp_model.h"
#include "search/pipeline.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

using Stages = std::vector<std::string>;

Stages Unroll(const std::string& text) {
  auto r = UnrollLayout(text);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : Stages{};
}

TEST(LayoutGrammar, UnrollsLikeMegatron) {
  // parse_str_to_list's own docstring example (pipeline_parallel_layer_layout.py at d98e8a6).
  Stages want{"Ettt"};
  for (int i = 0; i < 29; ++i) want.push_back("tt");
  want.push_back("m");
  want.push_back("L");
  EXPECT_EQ(Unroll("Ettt|(tt|)*29,m|L"), want);
  // Its regex comments: groups are unrolled first, then single characters.
  EXPECT_EQ(Unroll("(t*2|)*2L"), (Stages{"tt", "tt", "L"}));
  EXPECT_EQ(Unroll("(|t)*2,t"), (Stages{"", "t", "tt"}));
  EXPECT_EQ(Unroll("Et*3|t*0L"), (Stages{"Ettt", "L"}));
  // NVIDIA's Llama-3 70B FP8 layout: 40 stages, 80 layers.
  const Stages llama = Unroll("Et*2|(t*2|)*34,t*3|(t*2|)*3,tL");
  ASSERT_EQ(llama.size(), 40u);
  int t = 0;
  for (const std::string& s : llama) t += static_cast<int>(std::count(s.begin(), s.end(), 't'));
  EXPECT_EQ(t, 80);
  EXPECT_EQ(llama[35], "ttt");
}

TEST(LayoutGrammar, RefusesWhatMegatronRefusesInOneLine) {
  for (const std::string bad : {"Etx|L", "(Et|L", "Et|tL)", "((t)*2)*2|L", "", "t*99999999|L"}) {
    auto r = UnrollLayout(bad);
    if (bad.empty()) {
      ASSERT_TRUE(r.ok());  // one empty stage; the item rules refuse it
      continue;
    }
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message().rfind("parallel.pipeline_model_parallel_layout: ", 0), 0u)
        << r.status().message();
    EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  }
}

// DeepSeek-V3's published layout on a small dense stand-in: 61 layers, one MTP layer.
SearchSpec DeepSeekShape() {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = 61;
  s.model.mtp_num_layers = 1;
  s.parallel.pipeline_model_parallel_size = 8;
  s.parallel.virtual_pipeline_model_parallel_size = 4;
  s.parallel.pipeline_model_parallel_layout = "Et|(tt|)*30mL";
  s.train.global_batch_size = 16;
  return s;
}

TEST(LayoutStages, DeepSeekV3LayoutGivesEachRankItsChunks) {
  SearchSpec s = DeepSeekShape();
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  // Stage k is chunk k / 8 of rank k % 8: rank 0 chunk 0 holds E + 1 layer, every other stage 2,
  // the last (rank 7, chunk 3) the MTP layer and the loss with no decoder layer.
  EXPECT_EQ(ChunkOf(s, 0, 0).num_layers, 1);
  EXPECT_TRUE(ChunkOf(s, 0, 0).has_embedding);
  EXPECT_EQ(ChunkOf(s, 1, 0).first_layer, 1);
  EXPECT_EQ(ChunkOf(s, 0, 1).first_layer, 1 + 7 * 2);
  EXPECT_EQ(ChunkOf(s, 6, 3).first_layer, 59);
  EXPECT_EQ(ChunkOf(s, 6, 3).num_layers, 2);
  const StageChunk last = ChunkOf(s, 7, 3);
  EXPECT_EQ(last.num_layers, 0);
  EXPECT_EQ(last.mtp_layers, 1);
  EXPECT_TRUE(last.has_loss);
  EXPECT_EQ(StageLayerCount(s, 0), 7);
  EXPECT_EQ(StageLayerCount(s, 7), 6);
  int total = 0;
  for (int r = 0; r < 8; ++r) total += StageLayerCount(s, r);
  EXPECT_EQ(total, 61);
  EXPECT_EQ(MaxChunkLayers(s), 2);
}

TEST(LayoutStages, WithoutALayoutMtpSitsOnTheLastChunk) {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = 8;
  s.model.mtp_num_layers = 2;
  s.parallel.pipeline_model_parallel_size = 2;
  s.parallel.virtual_pipeline_model_parallel_size = 2;
  s.train.global_batch_size = 2;
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  EXPECT_EQ(ChunkOf(s, 1, 1).mtp_layers, 2);
  EXPECT_EQ(ChunkOf(s, 1, 0).mtp_layers, 0);
  EXPECT_EQ(ChunkOf(s, 0, 1).mtp_layers, 0);
}

struct Bad {
  std::string layout;
  void (*edit)(SearchSpec&);
  std::string field, says;
};

TEST(LayoutRules, RefusesMegatronsRefusalsNamingTheField) {
  const std::string kField = "parallel.pipeline_model_parallel_layout";
  const std::vector<Bad> cases = {
      {"Et|(tt|)*30mL", [](SearchSpec& s) { s.parallel.virtual_pipeline_model_parallel_size = 2; },
       kField, "set parallel.virtual_pipeline_model_parallel_size to 4"},
      {"Et|(tt|)*30mL",
       [](SearchSpec& s) {
         s.parallel.pipeline_model_parallel_size = 3;
         s.train.global_batch_size = 15;
       },
       kField, "32 stages, not a multiple of pipeline_model_parallel_size (3)"},
      {"tE|(tt|)*30mL", nullptr, kField, "first item must be the embedding"},
      {"Et|(tt|)*30Lm", nullptr, kField, "last item must be the loss"},
      {"Et|(tt|)*30tmL", nullptr, kField, "62 transformer layers"},
      {"Et|(tt|)*30mL", [](SearchSpec& s) { s.model.mtp_num_layers = 2; }, kField,
       "1 MTP layers m, model.mtp_num_layers is 2"},
      {"Et|(tt|)*30mL", [](SearchSpec& s) { s.model.mtp_num_layers.reset(); }, kField,
       "model.mtp_num_layers is 0"},
      {"Et|(tt|)*29,tm|tL", nullptr, kField, "before the MTP layers"},
      {"Et|(tt|)*29,mt|tL", nullptr, kField, "before the MTP layers"},
      // m in chunk 2 of rank 7 (stage 23), not its last chunk.
      {"Et|(tt|)*22,t*16m|(|)*7L", nullptr, kField, "last virtual chunk"},
      {"Et|(tt|)*30mL",
       [](SearchSpec& s) { s.parallel.account_for_loss_in_pipeline_split = true; }, kField,
       "cannot be set with"},
      {"Et|(tt|)*30mL",
       [](SearchSpec& s) { s.parallel.num_layers_in_first_pipeline_stage = 1; }, kField,
       "cannot be set with"},
      {"|Et|(tt|)*28,ttttm|L", nullptr, kField, "first stage"},
  };
  for (const Bad& c : cases) {
    SearchSpec s = DeepSeekShape();
    s.parallel.pipeline_model_parallel_layout = c.layout;
    if (c.edit) c.edit(s);
    const Status st = ValidateSpec(s);
    ASSERT_FALSE(st.ok()) << c.layout;
    EXPECT_EQ(st.message().rfind(c.field + ": ", 0), 0u) << st.message();
    EXPECT_NE(st.message().find(c.says), std::string::npos) << c.layout << ": " << st.message();
  }
}

TEST(LayoutRules, MtpOnTheFirstRankIsRefused) {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = 4;
  s.model.mtp_num_layers = 1;
  s.parallel.pipeline_model_parallel_size = 2;
  s.parallel.virtual_pipeline_model_parallel_size = 2;
  s.train.global_batch_size = 2;
  s.parallel.pipeline_model_parallel_layout = "Et|tt|tm|L";  // m: rank 0, chunk 1
  const Status st = ValidateSpec(s);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("first pipeline rank"), std::string::npos) << st.message();
}

TEST(LayoutMemory, AnUnevenLayoutMovesTheMemoryWithTheLayers) {
  // 6 layers on 2 ranks: "Et|tttttL" puts one layer on rank 0 and five on rank 1.
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = 6;
  s.parallel.pipeline_model_parallel_size = 2;
  s.train.global_batch_size = 1;
  const MemoryEstimate even = EstimateMemory(s, Policy::None());
  s.parallel.pipeline_model_parallel_layout = "Et|tttttL";
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  const MemoryEstimate uneven = EstimateMemory(s, Policy::None());
  EXPECT_EQ(uneven.stages[0].layers, 1);
  EXPECT_EQ(uneven.stages[1].layers, 5);
  EXPECT_LT(uneven.stages[0].static_bytes, even.stages[0].static_bytes);
  EXPECT_GT(uneven.stages[1].layer_activation_bytes, even.stages[1].layer_activation_bytes);
  // The same layout written as the uneven-split fields gives the same plan.
  SearchSpec fields = s;
  fields.parallel.pipeline_model_parallel_layout.clear();
  fields.parallel.num_layers_in_first_pipeline_stage = 1;
  ASSERT_TRUE(ValidateSpec(fields).ok()) << ValidateSpec(fields).message();
  const MemoryEstimate same = EstimateMemory(fields, Policy::None());
  for (int r = 0; r < 2; ++r) EXPECT_DOUBLE_EQ(same.stages[r].peak_bytes, uneven.stages[r].peak_bytes);
}

TEST(MtpMemory, AnMtpLayerCostsALayerItsProjectionAndASecondHead) {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = 4;
  s.parallel.pipeline_model_parallel_size = 2;
  s.train.global_batch_size = 1;
  const MemoryEstimate base = EstimateMemory(s, Policy::None());
  s.model.mtp_num_layers = 1;
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  const MemoryEstimate mtp = EstimateMemory(s, Policy::None());
  // Rank 0 is untouched; rank 1 gains one layer's parameters, eh_proj, three norms and the
  // embedding it builds for the shifted tokens.
  EXPECT_DOUBLE_EQ(mtp.stages[0].peak_bytes, base.stages[0].peak_bytes);
  const double h = s.model.hidden_size;
  const double layer_params = (ParameterCount(s) - PaddedVocabSize(s) * h) / 2;  // rank 0: 2 layers
  const double extra = mtp.stages[1].parameters - base.stages[1].parameters;
  EXPECT_NEAR(extra, layer_params + MtpExtraParams(s) + PaddedVocabSize(s) * h, 1.0);
  EXPECT_GT(MtpExtraParams(s), 2 * h * h);  // eh_proj alone is 2h x h
  // Its activations: one more layer's and a second fp32 logits.
  const double layer_acts = EstimateLayerActivations(s, 3).Total();
  EXPECT_GT(mtp.stages[1].activation_bytes - base.stages[1].activation_bytes,
            layer_acts + base.stages[1].logits_bytes);
  EXPECT_DOUBLE_EQ(mtp.stages[1].logits_bytes, 2 * base.stages[1].logits_bytes);
  // Selective recompute of the MLP applies inside the MTP layer too.
  const MemoryEstimate mlp = EstimateMemory(s, Policy::Selective({Label::kMlp}));
  const MemoryEstimate base_mlp = [&] {
    SearchSpec b = s;
    b.model.mtp_num_layers.reset();
    return EstimateMemory(b, Policy::Selective({Label::kMlp}));
  }();
  EXPECT_LT(mlp.stages[1].activation_bytes - base_mlp.stages[1].activation_bytes,
            mtp.stages[1].activation_bytes - base.stages[1].activation_bytes);
}

TEST(MtpFlops, FollowsMegatronLmsFormula) {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = 4;
  const double base = ModelFlopsPerStep(s);
  s.model.mtp_num_layers = 1;
  const double with = ModelFlopsPerStep(s);
  // One more layer (a quarter of the layers' share), the eh_proj and norms, a second logits pass.
  const double h = s.model.hidden_size;
  const double tokens = 1.0 * s.model.seq_length * s.train.micro_batch_size;
  const double logits = tokens * 6 * h * PaddedVocabSize(s);
  const double layers = (base - logits) / 4;
  EXPECT_NEAR(with - base, layers + logits + tokens * 6 * (3 * h + 2 * h * h), 1e-6 * base);
}

// The builtin engine runs MTP (engine/mtp_block.h) except with CP, which it refuses by name.
TEST(MtpEngine, TheBuiltinBackendRunsMtpExceptWithContextParallelism) {
  SearchSpec s = testing::DenseSpec();
  s.model.mtp_num_layers = 1;
  ASSERT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  EXPECT_EQ(BuiltinBackendProblem(s), "");
  s.parallel.context_parallel_size = 2;
  EXPECT_EQ(BuiltinBackendProblem(s).rfind("model.mtp_num_layers: ", 0), 0u)
      << BuiltinBackendProblem(s);
  s.model.mtp_num_layers = 0;  // Megatron's None and 0 alike: no MTP
  EXPECT_EQ(BuiltinBackendProblem(s).find("mtp"), std::string::npos);
}

TEST(LayoutRules, DepthProxiesRefuseALayout) {
  SearchSpec s = testing::DenseSpec();
  s.model.num_layers = 8;
  s.parallel.pipeline_model_parallel_size = 2;
  s.parallel.pipeline_model_parallel_layout = "Ettt|tttttL";
  s.search.proxy_layers = {2, 4};
  const Status st = ValidateSpec(s);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("search.proxy_layers: ", 0), 0u) << st.message();
}

}  // namespace
}  // namespace remat::search
