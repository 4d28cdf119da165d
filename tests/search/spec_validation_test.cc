#include <gtest/gtest.h>

#include <functional>

#include "search/spec.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

using testing::DenseSpec;
using testing::MoeSpec;

TEST(SpecValidationTest, ExamplesAreValid) {
  EXPECT_TRUE(ValidateSpec(DenseSpec()).ok());
  EXPECT_TRUE(ValidateSpec(testing::MlaSpec()).ok()) << ValidateSpec(testing::MlaSpec()).message();
  EXPECT_TRUE(ValidateSpec(MoeSpec()).ok());
}

TEST(SpecValidationTest, DefaultsAreMegatronCores) {
  ModelSpec m;
  m.hidden_size = 1024;
  m.num_attention_heads = 16;
  EXPECT_EQ(m.EffectiveFfnHiddenSize(), 4096);
  EXPECT_EQ(m.EffectiveQueryGroups(), 16);
  EXPECT_EQ(m.EffectiveKvChannels(), 64);
  EXPECT_DOUBLE_EQ(m.hidden_dropout, 0.1);
  EXPECT_DOUBLE_EQ(m.attention_dropout, 0.1);
  EXPECT_TRUE(m.add_bias_linear);
  EXPECT_TRUE(m.attention_softmax_in_fp32);
  EXPECT_EQ(m.q_lora_rank, std::optional<int>(512));  // MLATransformerConfig
  EXPECT_EQ(m.fp8_recipe, "delayed");
  EXPECT_EQ(m.cuda_graph_impl, "none");
  EXPECT_EQ(m.EffectiveNormalization(), Normalization::kLayerNorm);
  EXPECT_EQ(m.position_embedding_type, PositionEmbedding::kLearnedAbsolute);
  EXPECT_FALSE(m.gated_linear_unit);
  EXPECT_FALSE(m.moe_grouped_gemm);
  EXPECT_EQ(m.moe_layer_freq.every, 1);
}

TEST(SpecValidationTest, MoeLayerFrequencyFollowsMegatron) {
  SearchSpec s = MoeSpec();
  s.model.moe_layer_freq.every = 2;
  EXPECT_TRUE(s.model.IsMoeLayer(0));
  EXPECT_FALSE(s.model.IsMoeLayer(1));
  EXPECT_EQ(s.model.NumMoeLayers(), 2);
  s.model.moe_layer_freq.pattern = {0, 1, 1, 1};
  EXPECT_FALSE(s.model.IsMoeLayer(0));
  EXPECT_EQ(s.model.NumMoeLayers(), 3);
  EXPECT_EQ(DenseSpec().model.NumMoeLayers(), 0);
}

struct BadCase {
  const char* field;
  std::function<void(SearchSpec&)> mutate;
};

TEST(SpecValidationTest, EveryBadFieldIsNamed) {
  const BadCase cases[] = {
      {"model.num_layers", [](SearchSpec& s) { s.model.num_layers = 0; }},
      {"model.hidden_size", [](SearchSpec& s) { s.model.hidden_size = -1; }},
      {"model.num_attention_heads", [](SearchSpec& s) { s.model.num_attention_heads = 0; }},
      {"model.seq_length", [](SearchSpec& s) { s.model.seq_length = 0; }},
      {"model.vocab_size", [](SearchSpec& s) { s.model.vocab_size = 0; }},
      {"model.num_query_groups", [](SearchSpec& s) { s.model.num_query_groups = 0; }},
      {"model.num_attention_heads", [](SearchSpec& s) { s.model.num_query_groups = 5; }},
      {"model.ffn_hidden_size", [](SearchSpec& s) { s.model.ffn_hidden_size = 0; }},
      {"model.kv_channels", [](SearchSpec& s) { s.model.kv_channels = 0; }},
      {"model.hidden_size", [](SearchSpec& s) { s.model.hidden_size = 4097; }},
      {"model.attention_dropout", [](SearchSpec& s) { s.model.attention_dropout = 1.0; }},
      {"model.hidden_dropout", [](SearchSpec& s) { s.model.hidden_dropout = -0.1; }},
      {"model.kv_lora_rank",
       [](SearchSpec& s) { s.model.multi_latent_attention = true; s.model.kv_lora_rank = 0; }},
      {"model.q_lora_rank",
       [](SearchSpec& s) { s.model.multi_latent_attention = true; s.model.q_lora_rank = 0; }},
      {"model.qk_pos_emb_head_dim",
       [](SearchSpec& s) { s.model.multi_latent_attention = true; s.model.qk_pos_emb_head_dim = 63; }},
      {"model.num_moe_experts", [](SearchSpec& s) { s.model.num_moe_experts = 0; }},
      {"model.moe_router_topk",
       [](SearchSpec& s) { s.model.num_moe_experts = 4; s.model.moe_router_topk = 5; }},
      {"model.moe_layer_freq",
       [](SearchSpec& s) { s.model.num_moe_experts = 4; s.model.moe_layer_freq.pattern = {1, 0}; }},
      {"model.moe_shared_expert_intermediate_size",
       [](SearchSpec& s) { s.model.moe_shared_expert_intermediate_size = 128; }},
      // An MoE layer pattern (or frequency) on a dense model describes nothing.
      {"model.moe_layer_freq", [](SearchSpec& s) { s.model.moe_layer_freq.pattern = {1, 2, 3}; }},
      {"model.moe_layer_freq", [](SearchSpec& s) { s.model.moe_layer_freq.pattern = {0, 1, 0, 1}; }},
      {"model.moe_layer_freq", [](SearchSpec& s) { s.model.moe_layer_freq.every = 2; }},
      {"model.experimental_attention_variant",
       [](SearchSpec& s) { s.model.experimental_attention_variant = "mamba"; }},
      {"parallel.tensor_model_parallel_size",
       [](SearchSpec& s) { s.parallel.tensor_model_parallel_size = 0; }},
      {"model.num_attention_heads",
       [](SearchSpec& s) { s.parallel.tensor_model_parallel_size = 64; }},
      {"model.num_layers", [](SearchSpec& s) { s.parallel.pipeline_model_parallel_size = 3; }},
      {"parallel.sequence_parallel", [](SearchSpec& s) { s.parallel.sequence_parallel = true; }},
      {"parallel.expert_model_parallel_size",
       [](SearchSpec& s) { s.parallel.expert_model_parallel_size = 2; }},
      {"model.num_moe_experts",
       [](SearchSpec& s) { s.model.num_moe_experts = 6; s.parallel.expert_model_parallel_size = 4; s.parallel.data_parallel_size = 4; }},
      {"parallel.expert_model_parallel_size",
       [](SearchSpec& s) { s.model.num_moe_experts = 8; s.parallel.expert_model_parallel_size = 4; }},
      // Megatron's expert grid: ETP x EP divides a stage's ranks; ETP splits the expert width;
      // MoE biases need ETP 1; MoE with TP > 1 needs sequence parallelism; flex needs ETP x EP > 1.
      {"parallel.expert_tensor_parallel_size",
       [](SearchSpec& s) {
         s.model.num_moe_experts = 8;
         s.parallel.data_parallel_size = 2;
         s.parallel.expert_model_parallel_size = 2;
         s.parallel.expert_tensor_parallel_size = 2;
       }},
      {"parallel.expert_tensor_parallel_size",
       [](SearchSpec& s) { s.parallel.expert_tensor_parallel_size = 0; }},
      {"model.moe_ffn_hidden_size",
       [](SearchSpec& s) {
         s.model.num_moe_experts = 8;
         s.model.moe_ffn_hidden_size = 30;
         s.parallel.data_parallel_size = 4;
         s.parallel.expert_tensor_parallel_size = 4;
       }},
      {"parallel.expert_tensor_parallel_size",
       [](SearchSpec& s) {
         s.model.num_moe_experts = 8;
         s.model.add_bias_linear = true;
         s.parallel.data_parallel_size = 2;
         s.parallel.expert_tensor_parallel_size = 2;
       }},
      {"parallel.sequence_parallel",
       [](SearchSpec& s) {
         s.model.num_moe_experts = 8;
         s.parallel.tensor_model_parallel_size = 2;
         s.parallel.expert_tensor_parallel_size = 1;
       }},
      {"model.moe_token_dispatcher_type",
       [](SearchSpec& s) {
         s.model.num_moe_experts = 8;
         s.model.moe_token_dispatcher_type = MoeTokenDispatcher::kFlex;
       }},
      {"model.cpu_offloading",
       [](SearchSpec& s) { s.model.cpu_offloading = true; s.parallel.pipeline_model_parallel_size = 2; }},
      {"train.micro_batch_size", [](SearchSpec& s) { s.train.micro_batch_size = 0; }},
      {"search.memory_budget_gib", [](SearchSpec& s) { s.search.memory_budget_gib = 0; }},
      {"search.memory_headroom_gib", [](SearchSpec& s) { s.search.memory_headroom_gib = -1; }},
      {"search.memory_headroom_gib",
       [](SearchSpec& s) { s.search.memory_headroom_gib = s.search.memory_budget_gib; }},
      {"search.max_trials", [](SearchSpec& s) { s.search.max_trials = 0; }},
      {"search.warmup_steps", [](SearchSpec& s) { s.search.warmup_steps = -1; }},
      {"search.measure_steps", [](SearchSpec& s) { s.search.measure_steps = 0; }},
      {"search.noise_target", [](SearchSpec& s) { s.search.noise_target = 1; }},
      {"search.noise_target", [](SearchSpec& s) { s.search.noise_target = -0.1; }},
      {"search.max_measure_steps", [](SearchSpec& s) { s.search.max_measure_steps = 0; }},
      {"search.max_measure_steps", [](SearchSpec& s) { s.search.max_measure_steps = 1 << 30; }},
      {"search.replay_table", [](SearchSpec& s) { s.search.backend = Backend::kReplay; }},
      {"search.command_template", [](SearchSpec& s) { s.search.backend = Backend::kCommand; }},
      {"search.trial_timeout_s", [](SearchSpec& s) { s.search.trial_timeout_s = 0; }},
      // ValidateCompatibility: Megatron's cross-feature rules, before any trial.
      {"model.add_bias_linear",  // grouped-GEMM experts take no biases
       [](SearchSpec& s) {
         s = MoeSpec();
         s.model.add_bias_linear = true;
       }},
      {"model.add_bias_linear",  // nor do shared experts
       [](SearchSpec& s) {
         s = MoeSpec();
         s.model.moe_grouped_gemm = false;
         s.model.add_bias_linear = true;
       }},
      {"model.fp8", [](SearchSpec& s) { s.model.fp8 = "e5m2"; }},
      {"model.fp8_recipe", [](SearchSpec& s) { s.model.fp8_recipe = "linear"; }},
      {"model.cuda_graph_impl", [](SearchSpec& s) { s.model.cuda_graph_impl = "full"; }},
      {"model.cuda_graph_scope", [](SearchSpec& s) { s.model.cuda_graph_scope = {"attn"}; }},
      {"model.cuda_graph_scope",
       [](SearchSpec& s) {
         s.model.cuda_graph_impl = "full_iteration";
         s.model.cuda_graph_scope = {"attn"};
       }},
      {"model.cuda_graph_scope",
       [](SearchSpec& s) {
         s.model.cuda_graph_impl = "transformer_engine";
         s.model.cuda_graph_scope = {"moe_router"};  // a dense model
       }},
      {"model.cpu_offloading_num_layers",
       [](SearchSpec& s) {
         s.model.cpu_offloading = true;
         s.model.cpu_offloading_num_layers = s.model.num_layers;
       }},
      {"model.cpu_offloading",
       [](SearchSpec& s) {
         s.model.cpu_offloading = true;
         s.model.cuda_graph_impl = "transformer_engine";
       }},
      {"parallel.overlap_param_gather",
       [](SearchSpec& s) {
         s.parallel.overlap_grad_reduce = true;
         s.parallel.overlap_param_gather = true;
       }},
      {"parallel.overlap_param_gather",
       [](SearchSpec& s) {
         s.train.use_distributed_optimizer = true;
         s.parallel.overlap_param_gather = true;
       }},
  };
  for (const auto& c : cases) {
    SearchSpec s = DenseSpec();
    c.mutate(s);
    Status st = ValidateSpec(s);
    ASSERT_FALSE(st.ok()) << c.field;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message().rfind(std::string(c.field) + ":", 0), 0u)
        << "expected the message to start with " << c.field << ", got: " << st.message();
  }
}

TEST(SpecValidationTest, CompatibleSettingsPass) {
  SearchSpec s = MoeSpec();
  s.model.fp8 = "hybrid";
  s.model.cuda_graph_impl = "transformer_engine";
  s.model.cuda_graph_scope = {"attn", "moe_router", "moe_preprocess"};
  s.train.use_distributed_optimizer = true;
  s.parallel.overlap_grad_reduce = true;
  s.parallel.overlap_param_gather = true;
  EXPECT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  SearchSpec off = DenseSpec();
  off.model.cpu_offloading = true;
  off.model.cpu_offloading_num_layers = off.model.num_layers - 1;
  EXPECT_TRUE(ValidateSpec(off).ok()) << ValidateSpec(off).message();
  SearchSpec seq = MoeSpec();  // sequential experts without shared experts take biases
  seq.model.moe_grouped_gemm = false;
  seq.model.moe_shared_expert_intermediate_size.reset();
  seq.model.add_bias_linear = true;
  EXPECT_TRUE(ValidateSpec(seq).ok()) << ValidateSpec(seq).message();
}

// What the builtin engine cannot run is named before a trial is spent, field first.
TEST(SpecValidationTest, BuiltinBackendProblemNamesTheField) {
  EXPECT_EQ(BuiltinBackendProblem(DenseSpec()), "");
  EXPECT_EQ(BuiltinBackendProblem(MoeSpec()), "");
  // MoE with TP (and sequence parallelism), expert TP and EP runs (engine/moe_dispatch.h).
  SearchSpec moe_tp = MoeSpec();
  moe_tp.parallel.tensor_model_parallel_size = 2;
  moe_tp.parallel.sequence_parallel = true;
  moe_tp.parallel.data_parallel_size = 2;
  moe_tp.parallel.expert_model_parallel_size = 2;
  ASSERT_TRUE(ValidateSpec(moe_tp).ok()) << ValidateSpec(moe_tp).message();
  EXPECT_EQ(BuiltinBackendProblem(moe_tp), "");
  SearchSpec pipeline = DenseSpec();  // the engine runs pipelines and gradient accumulation
  pipeline.parallel.pipeline_model_parallel_size = 2;
  pipeline.train.global_batch_size = 4;
  EXPECT_EQ(BuiltinBackendProblem(pipeline), "");
  SearchSpec cp = DenseSpec();  // and context parallelism: p2p, a2a, allgather
  cp.model.attention_backend = AttentionBackend::kFlash;
  cp.model.attention_dropout = 0;
  cp.parallel.context_parallel_size = 2;
  for (CpCommType type : {CpCommType::kP2p, CpCommType::kA2a, CpCommType::kAllGather}) {
    cp.parallel.cp_comm_type = type;
    EXPECT_EQ(BuiltinBackendProblem(cp), "") << Name(type);
  }
  const std::pair<const char*, std::function<void(SearchSpec&)>> cases[] = {
      {"model.fp8:", [](SearchSpec& s) { s.model.fp8 = "e4m3"; }},
      {"model.cuda_graph_impl:", [](SearchSpec& s) { s.model.cuda_graph_impl = "local"; }},
      {"parallel.cp_comm_type:",
       [](SearchSpec& s) {
         s.model.attention_backend = AttentionBackend::kFlash;
         s.parallel.context_parallel_size = 2;
         s.parallel.cp_comm_type = CpCommType::kA2aP2p;
       }},
      {"model.attention_dropout:",
       [](SearchSpec& s) {
         s.model.attention_backend = AttentionBackend::kFlash;
         s.model.attention_dropout = 0.1;
         s.parallel.context_parallel_size = 2;
       }},
      {"model.experimental_attention_variant:",
       [](SearchSpec& s) { s.model.experimental_attention_variant = "gdn"; }},
      {"model.attention_backend:",  // Transformer Engine's own unfused attention
       [](SearchSpec& s) { s.model.transformer_impl = TransformerImpl::kTransformerEngine; }},
      {"model.masked_softmax_fusion:", [](SearchSpec& s) { s.model.masked_softmax_fusion = true; }},
      {"train.use_megatron_fsdp:", [](SearchSpec& s) { s.train.use_megatron_fsdp = true; }},
  };
  // What the engine now runs: the TE layer with a fused kernel, the fusions (TE's cross-entropy
  // included), bf16 gradients and the precision-aware optimizer.
  SearchSpec te = DenseSpec();
  te.model.transformer_impl = TransformerImpl::kTransformerEngine;
  te.model.attention_backend = AttentionBackend::kFlash;
  te.model.bias_activation_fusion = te.model.apply_rope_fusion = te.model.bias_dropout_fusion = true;
  te.model.masked_softmax_fusion = te.model.cross_entropy_loss_fusion = true;
  te.model.cross_entropy_fusion_impl = CrossEntropyFusionImpl::kTe;  // engine/te_cross_entropy.h
  te.train.grad_reduce_in_fp32 = false;
  te.train.use_precision_aware_optimizer = true;
  te.train.exp_avg_dtype = te.train.exp_avg_sq_dtype = DType::kBf16;
  EXPECT_EQ(BuiltinBackendProblem(te), "");
  for (const auto& [field, mutate] : cases) {
    SearchSpec s = DenseSpec();
    mutate(s);
    const std::string problem = BuiltinBackendProblem(s);
    EXPECT_EQ(problem.rfind(field, 0), 0u) << field << " -> '" << problem << "'";
  }
}

// Transformer Engine's Ulysses all-to-all splits each TP rank's heads over the CP group.
TEST(SpecValidationTest, UlyssesNeedsHeadsDivisibleByContextParallel) {
  SearchSpec s = DenseSpec();
  s.model.attention_backend = AttentionBackend::kFlash;
  s.parallel.context_parallel_size = 2;
  s.parallel.cp_comm_type = CpCommType::kA2a;
  s.model.num_query_groups = s.model.num_attention_heads;
  EXPECT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
  s.model.num_query_groups = 1;  // one key/value head cannot be split over 2 ranks
  const Status bad = ValidateSpec(s);
  EXPECT_EQ(bad.message().rfind("parallel.cp_comm_type:", 0), 0u) << bad.message();
  s.parallel.cp_comm_type = CpCommType::kP2p;  // the ring sends whole heads
  EXPECT_TRUE(ValidateSpec(s).ok()) << ValidateSpec(s).message();
}

// Values that took minutes of CPU, gigabytes or a segfault downstream are refused
// at once, naming the field and the limit (search/limits.h).
TEST(SpecValidationTest, LimitsAreEnforcedNamingTheField) {
  struct Case {
    std::function<void(SearchSpec&)> edit;
    std::string message_start;
  };
  const Case cases[] = {
      {[](SearchSpec& s) { s.model.num_layers = 2147483647; },
       "model.num_layers: 2147483647 is above remat's limit of 1024"},
      {[](SearchSpec& s) { s.parallel.data_parallel_size = 100000000; },
       "parallel.data_parallel_size: 100000000 is above remat's limit"},
      {[](SearchSpec& s) {
         s.parallel.tensor_model_parallel_size = 65536;
         s.parallel.data_parallel_size = 65536;
       },
       "parallel: the world size"},
      {[](SearchSpec& s) { s.search.measure_steps = 2147483647; },
       "search.measure_steps: 2147483647 is above"},
      {[](SearchSpec& s) { s.search.warmup_steps = 1000000; }, "search.warmup_steps:"},
      {[](SearchSpec& s) { s.search.trial_timeout_s = 1e300; }, "search.trial_timeout_s: above"},
      {[](SearchSpec& s) { s.model.hidden_size = 1 << 30; }, "model.hidden_size:"},
      {[](SearchSpec& s) { s.model.seq_length = 1 << 30; }, "model.seq_length:"},
      {[](SearchSpec& s) { s.train.micro_batch_size = 1 << 30; }, "train.micro_batch_size:"},
      {[](SearchSpec& s) { s.name = std::string(50 << 20, 'n'); }, "name: longer than 256 bytes"},
      {[](SearchSpec& s) { s.name = "caf\xE9"; }, "name: \"caf\\xe9\" holds control"},
      {[](SearchSpec& s) { s.name = "two\nlines"; }, "name: \"two\\nlines\" holds control"},
      {[](SearchSpec& s) { s.search.command_template = std::string(300, 't'); },
       "search.command_template: longer than"},
  };
  for (const auto& c : cases) {
    SearchSpec s = DenseSpec();
    c.edit(s);
    const Status st = ValidateSpec(s);
    ASSERT_FALSE(st.ok()) << c.message_start;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(st.message().rfind(c.message_start, 0), 0u) << st.message().substr(0, 300);
    EXPECT_LT(st.message().size(), 300u);
  }
  // At the limits themselves: accepted as far as the limits go.
  SearchSpec at = DenseSpec();
  at.model.num_layers = 1024;
  at.search.measure_steps = 100000;
  EXPECT_TRUE(ValidateSpec(at).ok()) << ValidateSpec(at).message();
}

TEST(SpecValidationTest, WorldSizeIsTensorTimesPipelineTimesData) {
  SearchSpec s = DenseSpec();
  s.parallel.tensor_model_parallel_size = 2;
  s.parallel.pipeline_model_parallel_size = 2;
  s.parallel.data_parallel_size = 3;
  EXPECT_EQ(s.parallel.WorldSize(), 12);
}

}  // namespace
}  // namespace remat::search

namespace remat::search {
namespace {

// moe_layer_freq as Megatron-LM and Megatron Bridge recipes write it: an interval, a list, or a
// Python expression of lists, repetitions and sums (read, never evaluated).
TEST(MoeLayerFreqText, IntervalsListsAndMegatronExpressions) {
  auto every = ParseMoeLayerFreq("3", "model.moe_layer_freq");
  ASSERT_TRUE(every.ok());
  EXPECT_EQ(every->every, 3);
  EXPECT_TRUE(every->pattern.empty());
  auto deepseek = ParseMoeLayerFreq("([0]*3+[1]*58)", "model.moe_layer_freq");
  ASSERT_TRUE(deepseek.ok()) << deepseek.status().message();
  ASSERT_EQ(deepseek->pattern.size(), 61u);
  EXPECT_EQ(deepseek->pattern[2], 0);
  EXPECT_EQ(deepseek->pattern[3], 1);
  auto alternating = ParseMoeLayerFreq("[1, 0] * 2", "model.moe_layer_freq");
  ASSERT_TRUE(alternating.ok());
  EXPECT_EQ(alternating->pattern, (std::vector<int>{1, 0, 1, 0}));
  const std::vector<std::string> bad_texts = {
      "[0]*", "__import__('os')", "[0]*3+", "[1]*99999999",
      std::string(100, '(') + "[1]" + std::string(100, ')')};
  for (const std::string& bad : bad_texts) {
    auto r = ParseMoeLayerFreq(bad, "model.moe_layer_freq");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message().rfind("model.moe_layer_freq: ", 0), 0u);
  }
}

}  // namespace
}  // namespace remat::search
