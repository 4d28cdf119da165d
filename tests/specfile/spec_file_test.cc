#include "specfile/spec_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "search/limits.h"

namespace remat::spec {
namespace {

const char* kMinimal = R"(
model:
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 4
  seq_length: 128
  vocab_size: 512
)";

TEST(SpecFileTest, OmittedFieldsTakeMegatronDefaults) {
  auto s = ParseSpecYaml(kMinimal);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->model.EffectiveFfnHiddenSize(), 256);
  EXPECT_EQ(s->model.EffectiveQueryGroups(), 4);
  EXPECT_DOUBLE_EQ(s->model.hidden_dropout, 0.1);
  EXPECT_TRUE(s->model.add_bias_linear);
  EXPECT_EQ(s->model.EffectiveNormalization(), search::Normalization::kLayerNorm);
  EXPECT_EQ(s->search.memory_metric, search::MemoryMetric::kReserved);
  EXPECT_EQ(s->search.max_trials, 40);
  EXPECT_EQ(s->search.objective, search::Objective::kFrontier);
  EXPECT_DOUBLE_EQ(s->search.memory_headroom_gib, 0);
  EXPECT_EQ(s->train.precision, search::Precision::kBf16);
}

TEST(SpecFileTest, ObjectiveAndHeadroom) {
  auto s = ParseSpecYaml(std::string(kMinimal) +
                         "search:\n  objective: recommend\n  memory_headroom_gib: 2.5\n");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->search.objective, search::Objective::kRecommend);
  EXPECT_DOUBLE_EQ(s->search.memory_headroom_gib, 2.5);
  EXPECT_EQ(s->search.RecommendBudgetBytes(), static_cast<uint64_t>(77.5 * (1ull << 30)));
}

TEST(SpecFileTest, ReadsEveryExample) {
  const std::string dir = std::string(REMAT_SOURCE_DIR) + "/examples";
  int n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".yaml") continue;
    // examples/recipes holds Megatron Bridge configurations, the importer's input
    // (tests/cli/import_test.cc), not specs.
    if (e.path().parent_path().filename() == "recipes") continue;
    auto s = LoadSpecFile(e.path().string());
    EXPECT_TRUE(s.ok()) << e.path() << ": " << s.status().message();
    // A step time from one or two steps is a draw, not a figure (MoE steps scatter by 15-50%):
    // what a user copies measures at least three.
    if (s.ok()) EXPECT_GE(s->search.measure_steps, 3) << e.path();
    ++n;
  }
  EXPECT_GE(n, 4);
}

TEST(SpecFileTest, MlaAndMoeFields) {
  auto s = LoadSpecFile(std::string(REMAT_SOURCE_DIR) + "/examples/deepseek-v2-lite-proxy.yaml");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->model.multi_latent_attention);
  EXPECT_FALSE(s->model.q_lora_rank.has_value());  // the example writes null
  EXPECT_EQ(s->model.kv_lora_rank, 512);
  EXPECT_EQ(*s->model.num_moe_experts, 64);
  EXPECT_EQ(s->model.moe_layer_freq.pattern, (std::vector<int>{0, 1, 1, 1}));
  EXPECT_FALSE(s->model.IsMoeLayer(0));
  EXPECT_TRUE(s->model.IsMoeLayer(3));
}

// MLATransformerConfig's q_lora_rank is 512 when the key is absent; an explicit null means no q
// compression (DeepSeek-V2-Lite). Its normalization default is RMSNorm.
TEST(SpecFileTest, QLoraRankDefaultsTo512AndNullMeansNone) {
  const std::string mla = std::string(kMinimal) + "  multi_latent_attention: true\n";
  auto absent = ParseSpecYaml(mla);
  ASSERT_TRUE(absent.ok()) << absent.status().message();
  EXPECT_EQ(absent->model.q_lora_rank, std::optional<int>(512));
  auto null = ParseSpecYaml(mla + "  q_lora_rank: null\n");
  ASSERT_TRUE(null.ok()) << null.status().message();
  EXPECT_FALSE(null->model.q_lora_rank.has_value());
  auto set = ParseSpecYaml(mla + "  q_lora_rank: 1536\n");
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->model.q_lora_rank, std::optional<int>(1536));
  // MLATransformerConfig's normalization too: RMSNorm when absent, what is written otherwise.
  EXPECT_EQ(absent->model.EffectiveNormalization(), search::Normalization::kRMSNorm);
  auto layer_norm = ParseSpecYaml(mla + "  normalization: LayerNorm\n");
  ASSERT_TRUE(layer_norm.ok());
  EXPECT_EQ(layer_norm->model.EffectiveNormalization(), search::Normalization::kLayerNorm);
  auto dense = ParseSpecYaml(kMinimal);
  EXPECT_EQ(dense->model.EffectiveNormalization(), search::Normalization::kLayerNorm);
}

// Megatron Core's AttnBackend names are read as the kernel class they stand for.
TEST(SpecFileTest, AttentionBackendTakesMegatronNames) {
  const std::pair<const char*, search::AttentionBackend> cases[] = {
      {"unfused", search::AttentionBackend::kUnfused}, {"local", search::AttentionBackend::kUnfused},
      {"flash", search::AttentionBackend::kFlash},     {"fused", search::AttentionBackend::kFlash}};
  for (const auto& [name, want] : cases) {
    auto s = ParseSpecYaml(std::string(kMinimal) + "  attention_backend: " + name + "\n");
    ASSERT_TRUE(s.ok()) << name << ": " << s.status().message();
    EXPECT_EQ(s->model.attention_backend, want) << name;
  }
  // Megatron's auto, also when the field is absent or null, follows the layer implementation:
  // the local layer's own attention is unfused, Transformer Engine picks a fused kernel.
  for (const char* line : {"", "  attention_backend: auto\n", "  attention_backend: null\n"}) {
    auto local = ParseSpecYaml(std::string(kMinimal) + line);
    ASSERT_TRUE(local.ok()) << line << local.status().message();
    EXPECT_EQ(local->model.attention_backend, search::AttentionBackend::kUnfused) << line;
    auto te = ParseSpecYaml(std::string(kMinimal) + line + "  transformer_impl: transformer_engine\n");
    ASSERT_TRUE(te.ok()) << line << te.status().message();
    EXPECT_EQ(te->model.attention_backend, search::AttentionBackend::kFlash) << line;
  }
  auto explicit_unfused = ParseSpecYaml(std::string(kMinimal) +
                                        "  attention_backend: unfused\n  transformer_impl: transformer_engine\n");
  ASSERT_TRUE(explicit_unfused.ok());
  EXPECT_EQ(explicit_unfused->model.attention_backend, search::AttentionBackend::kUnfused);
  auto bad = ParseSpecYaml(std::string(kMinimal) + "  attention_backend: sdpa\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("model.attention_backend: must be one of", 0), 0u);
}

TEST(SpecFileTest, Fp8CudaGraphOffloadAndOverlapFields) {
  auto s = ParseSpecYaml(std::string(kMinimal) + R"(
  fp8: hybrid
  fp8_recipe: tensorwise
  cuda_graph_impl: transformer_engine
  cuda_graph_scope: [attn, mlp]
  attention_dropout: 0.0
  hidden_dropout: 0.0
train:
  use_distributed_optimizer: true
parallel:
  overlap_grad_reduce: true
  overlap_param_gather: true
)");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->model.fp8, "hybrid");
  EXPECT_EQ(s->model.fp8_recipe, "tensorwise");
  EXPECT_EQ(s->model.cuda_graph_impl, "transformer_engine");
  EXPECT_EQ(s->model.cuda_graph_scope, (std::vector<std::string>{"attn", "mlp"}));
  EXPECT_TRUE(s->parallel.overlap_grad_reduce);
  EXPECT_TRUE(s->parallel.overlap_param_gather);
  // Megatron Core's defaults when absent.
  auto d = ParseSpecYaml(kMinimal);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->model.fp8, "");
  EXPECT_EQ(d->model.fp8_recipe, "delayed");
  EXPECT_EQ(d->model.cuda_graph_impl, "none");
  EXPECT_TRUE(d->model.cuda_graph_scope.empty());
  EXPECT_EQ(d->model.cpu_offloading_num_layers, 0);
  EXPECT_FALSE(d->parallel.overlap_grad_reduce);
}

TEST(SpecFileTest, PipelineLayoutFields) {
  auto s = ParseSpecYaml(std::string(kMinimal) + R"(
  attention_backend: flash
train:
  global_batch_size: 16
parallel:
  pipeline_model_parallel_size: 2
  virtual_pipeline_model_parallel_size: null
  context_parallel_size: 2
  num_layers_in_first_pipeline_stage: 1
  num_layers_in_last_pipeline_stage: 1
  account_for_embedding_in_pipeline_split: false
  account_for_loss_in_pipeline_split: false
)");
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(*s->train.global_batch_size, 16);
  EXPECT_FALSE(s->parallel.virtual_pipeline_model_parallel_size.has_value());
  EXPECT_EQ(s->parallel.context_parallel_size, 2);
  EXPECT_EQ(*s->parallel.num_layers_in_first_pipeline_stage, 1);
  EXPECT_EQ(s->NumMicrobatches(), 16);
  auto bad = ParseSpecYaml(std::string(kMinimal) + "parallel:\n  context_parallel_size: two\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("parallel.context_parallel_size:", 0), 0u)
      << bad.status().message();
}

TEST(SpecFileTest, ReplayTablePathIsRelativeToTheSpec) {
  const std::string path = std::string(REMAT_SOURCE_DIR) + "/examples/replay/llama3-8b-h100.yaml";
  auto s = LoadSpecFile(path);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(std::filesystem::exists(s->search.replay_table)) << s->search.replay_table;
  auto table = LoadReplayTableFile(s->search.replay_table);
  ASSERT_TRUE(table.ok()) << table.status().message();
  ASSERT_TRUE(table->count("selective:[]"));
  EXPECT_EQ(table->at("selective:[]").result.ranks.at(0).peak_reserved_bytes, 64424509440u);
  EXPECT_DOUBLE_EQ(table->at("selective:[]").wall_s, 0.2);
}

struct BadYaml {
  std::string yaml;
  std::string message_start;
};

TEST(SpecFileTest, BadInputNamesTheKey) {
  const std::string base = kMinimal;
  const BadYaml cases[] = {
      {"model:\n  hidden_size: 64\n", "model.num_layers: required"},
      {"name: x\n", "model: required"},
      {"", "spec: must be a YAML mapping"},
      {"model: [1, 2]\n", "model: must be a mapping"},
      {"model:\n  num_layers: two\n  hidden_size: 64\n  num_attention_heads: 4\n  seq_length: 8\n  vocab_size: 8\n",
       "model.num_layers: must be an integer, got \"two\""},
      {"model:\n  num_layers: 2.5\n  hidden_size: 64\n  num_attention_heads: 4\n  seq_length: 8\n  vocab_size: 8\n",
       "model.num_layers: must be an integer"},
      {"model:\n  num_layers: 99999999999\n  hidden_size: 64\n  num_attention_heads: 4\n  seq_length: 8\n  vocab_size: 8\n",
       "model.num_layers: 99999999999 is out of range"},
      {base + "  kv_lora_rank: 0\n  multi_latent_attention: true\n",
       "model.kv_lora_rank: must be a positive integer"},
      {base + "  hidden_sise: 64\n", "model.hidden_sise: unknown key"},
      {base + "extra: 1\n", "extra: unknown key"},
      {base + "search:\n  memory_metric: peak\n",
       "search.memory_metric: must be one of reserved, allocated, got \"peak\""},
      {base + "search:\n  objective: fastest\n",
       "search.objective: must be one of frontier, recommend, got \"fastest\""},
      {base + "search:\n  memory_budget_gib: lots\n",
       "search.memory_budget_gib: must be a number"},
      {base + "  gated_linear_unit: maybe\n",
       "model.gated_linear_unit: must be true or false"},
      {base + "  normalization: BatchNorm\n", "model.normalization: must be one of"},
      {base + "parallel:\n  tensor_model_parallel_size: 3\n",
       "model.num_attention_heads: 4 must be divisible by parallel.tensor_model_parallel_size"},
      {base + "train:\n  micro_batch_size: 0\n", "train.micro_batch_size: must be"},
      {base + "train:\n  warmup: 3\n", "train.warmup: unknown key"},
      {base + "search:\n  backend: replay\n", "search.replay_table: required"},
      {base + "search:\n  warmup_max_steps: 1\n",
       "search.warmup_max_steps: must be at least search.warmup_steps (2)"},
      {base + "search:\n  steady_window: 0\n", "search.steady_window: must be"},
      {base + "search:\n  steady_window: 9\n", "search.steady_window: must be at most"},
      {base + "search:\n  steady_tolerance: high\n", "search.steady_tolerance: must be a number"},
      {base + "search:\n  steady_tolerance: 0\n", "search.steady_tolerance: must be a fraction"},
      {"model: {num_layers: 2\n", "spec: not valid YAML"},
      // Spec-wide compatibility (search::ValidateCompatibility), refused at read time.
      {base + "  num_moe_experts: 4\n  moe_grouped_gemm: true\n", "model.add_bias_linear:"},
      {base + "  fp8: e5m2\n", "model.fp8: must be null, e4m3 or hybrid"},
      {base + "  fp8_recipe: fast\n", "model.fp8_recipe: must be one of"},
      {base + "  cuda_graph_impl: yes\n", "model.cuda_graph_impl: must be one of"},
      {base + "  cuda_graph_impl: local\n  cuda_graph_scope: [attn, lm_head]\n",
       "model.cuda_graph_scope: unknown module 'lm_head'"},
      {base + "  cuda_graph_scope: [attn]\n", "model.cuda_graph_scope: has no effect"},
      {base + "  cpu_offloading: true\n  cpu_offloading_num_layers: 2\n",
       "model.cpu_offloading_num_layers: CPU offloading can be done only for layers less than"},
      {base + "  cpu_offloading: true\n  cuda_graph_impl: local\n",
       "model.cpu_offloading: CUDA graphs are not supported with CPU offloading"},
      {base + "parallel:\n  overlap_param_gather: true\n  overlap_grad_reduce: true\n",
       "parallel.overlap_param_gather: only supported with the distributed optimizer"},
      {base + "train:\n  use_distributed_optimizer: true\nparallel:\n  overlap_param_gather: true\n",
       "parallel.overlap_param_gather: needs parallel.overlap_grad_reduce"},
  };
  for (const auto& c : cases) {
    auto s = ParseSpecYaml(c.yaml);
    ASSERT_FALSE(s.ok()) << c.yaml;
    EXPECT_EQ(s.status().message().rfind(c.message_start, 0), 0u)
        << "yaml:\n" << c.yaml << "\nmessage: " << s.status().message();
  }
}

TEST(SpecFileTest, SteadyStateKeysAndDefaults) {
  const std::string base =
      "model:\n  num_layers: 2\n  hidden_size: 64\n  num_attention_heads: 4\n  seq_length: 8\n"
      "  vocab_size: 8\n";
  auto defaults = ParseSpecYaml(base);
  ASSERT_TRUE(defaults.ok()) << defaults.status().message();
  EXPECT_EQ(defaults->search.warmup_steps, 2);
  EXPECT_EQ(defaults->search.warmup_max_steps, 8);
  EXPECT_EQ(defaults->search.steady_window, 3);
  EXPECT_DOUBLE_EQ(defaults->search.steady_tolerance, 0.05);
  auto set = ParseSpecYaml(base + "search:\n  warmup_steps: 1\n  warmup_max_steps: 12\n"
                                  "  steady_window: 4\n  steady_tolerance: 0.02\n");
  ASSERT_TRUE(set.ok()) << set.status().message();
  EXPECT_EQ(set->search.warmup_steps, 1);
  EXPECT_EQ(set->search.warmup_max_steps, 12);
  EXPECT_EQ(set->search.steady_window, 4);
  EXPECT_DOUBLE_EQ(set->search.steady_tolerance, 0.02);
}

// Strict YAML: what yaml-cpp accepts but a spec must not be.
TEST(SpecFileTest, DuplicateAndNonScalarKeysAreRefused) {
  const std::string base = kMinimal;
  const BadYaml cases[] = {
      {base + "model:\n  num_layers: 4\n", "model: duplicate key"},
      {base + "  num_layers: 3\n", "model.num_layers: duplicate key"},
      {base + "search:\n  max_trials: 3\n  max_trials: 4\n", "search.max_trials: duplicate key"},
      {base + "{[a, b]: 1}: 2\n", "spec: a key must be a plain string"},
      {"? [a, b]\n: 1\n" + base, "spec: a key must be a plain string"},
      {base + "  ? {x: 1}\n  : 2\n", "model: a key must be a plain string"},
      {base + "search:\n  ? [a]\n  : 1\n", "search: a key must be a plain string"},
  };
  for (const auto& c : cases) {
    auto s = ParseSpecYaml(c.yaml);
    ASSERT_FALSE(s.ok()) << c.yaml;
    EXPECT_EQ(s.status().message().rfind(c.message_start, 0), 0u)
        << "yaml:\n" << c.yaml << "\nmessage: " << s.status().message();
  }
}

TEST(SpecFileTest, TextMustBeUtf8AndUtf16WithABomIsRead) {
  auto bad = ParseSpecYaml("name: \"caf\xE9\"\n" + std::string(kMinimal));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("spec: not valid UTF-8 at line 1", 0), 0u)
      << bad.status().message();
  // YAML allows UTF-16 with a byte-order mark: read as the same spec.
  const std::string utf8 = "name: caf\xC3\xA9\n" + std::string(kMinimal);
  std::string utf16 = "\xFF\xFE";
  for (char c : std::string("name: caf")) utf16 += std::string{c, '\0'};
  utf16 += std::string("\xE9\0", 2);
  for (char c : std::string("\n") + kMinimal) utf16 += std::string{c, '\0'};
  auto s = ParseSpecYaml(utf16);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->name, "caf\xC3\xA9");
  EXPECT_EQ(s->model.num_layers, 2);
}

TEST(SpecFileTest, ErrorsAreOneLineWithValuesQuotedAndCut) {
  const std::string base = kMinimal;
  for (const std::string& yaml :
       {base + "  normalization: \"" + std::string(4 << 20, 'N') + "\"\n",
        base + "  normalization: \"Layer\\nerror: Norm\"\n",
        base + "  hidden_dropout: \"" + std::string(1 << 20, '9') + "x\"\n",
        base + "search:\n  strategy: \"a\\u0000b\\rc\"\n"}) {
    auto s = ParseSpecYaml(yaml);
    ASSERT_FALSE(s.ok());
    EXPECT_LT(s.status().message().size(), 400u) << s.status().message().substr(0, 400);
    EXPECT_EQ(s.status().message().find_first_of("\n\r"), std::string::npos)
        << s.status().message();
  }
  // An alias bomb is refused, not expanded.
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (int i = 0; i < 12; ++i) {
    const std::string prev(1, static_cast<char>('a' + i)), next(1, static_cast<char>('b' + i));
    bomb += next + ": &" + next + " [*" + prev + ", *" + prev + ", *" + prev + ", *" + prev +
            ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + ", *" + prev + "]\n";
  }
  auto s = ParseSpecYaml(bomb + base);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().message().rfind("spec: ", 0), 0u) << s.status().message();
}

TEST(SpecFileTest, MissingFileIsAClearError) {
  auto s = LoadSpecFile("/nonexistent/spec.yaml");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("cannot be read"), std::string::npos);
}

TEST(SpecFileTest, ReplayTableErrors) {
  EXPECT_FALSE(ParseReplayTableJson("{").ok());
  EXPECT_FALSE(ParseReplayTableJson("{\"x\": 1}").ok());
  auto bad_policy = ParseReplayTableJson(R"({"trials": {"selective:[attn]": {"status": "ok"}}})");
  ASSERT_FALSE(bad_policy.ok());
  EXPECT_NE(bad_policy.status().message().find("unknown recompute module"), std::string::npos);
  auto bad_status = ParseReplayTableJson(R"({"trials": {"none": {"status": "great"}}})");
  ASSERT_FALSE(bad_status.ok());
  auto dup = ParseReplayTableJson(
      R"({"trials": {"none": {"status": "oom"}, "selective:[]": {"status": "oom"}}})");
  ASSERT_FALSE(dup.ok());
  EXPECT_NE(dup.status().message().find("twice"), std::string::npos);
  // Types and ranges are checked by name; a negative peak is not 2^64 - 1.
  const std::pair<const char*, const char*> bad[] = {
      {R"({"trials": {"none": {"status": "oom", "ranks": [{"peak_allocated_bytes": -5}]}}})",
       "replay table: trials[\"none\"].ranks[0].peak_allocated_bytes: must be a non-negative"},
      {R"({"trials": {"none": {"status": "oom", "ranks": [{"peak_reserved_bytes": 1.5}]}}})",
       "replay table: trials[\"none\"].ranks[0].peak_reserved_bytes: must be a non-negative"},
      {R"({"trials": {"none": {"status": "oom", "ranks": [{"rank": -1}]}}})",
       "replay table: trials[\"none\"].ranks[0].rank: must be a non-negative"},
      {R"({"trials": {"none": {"status": 3}}})", "replay table: trials[\"none\"].status: must be"},
      {R"({"trials": {"none": {"status": "ok", "step_time_s": "fast"}}})",
       "replay table: trials[\"none\"].step_time_s: must be a non-negative number"},
      {R"({"trials": {"none": {"status": "oom", "wall_s": -1}}})",
       "replay table: trials[\"none\"].wall_s: must be a non-negative number"},
      {R"({"trials": {"none": {"status": "oom", "ranks": [7]}}})",
       "replay table: trials[\"none\"].ranks[0]: must be an object"},
  };
  for (const auto& [json, start] : bad) {
    auto t = ParseReplayTableJson(json);
    ASSERT_FALSE(t.ok()) << json;
    EXPECT_EQ(t.status().message().rfind(start, 0), 0u) << t.status().message();
  }
  auto long_message = ParseReplayTableJson(
      R"({"trials": {"none": {"status": "failed", "message": ")" + std::string(1 << 20, 'm') +
      "\"}}}");
  ASSERT_TRUE(long_message.ok()) << long_message.status().message();
  EXPECT_LE(long_message->at("selective:[]").result.message.size(),
            search::limits::kMaxTrialMessageBytes);
  auto ok = ParseReplayTableJson(R"({"trials": {"none": {"status": "oom"}}})");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->count("selective:[]"));
}

}  // namespace
}  // namespace remat::spec
