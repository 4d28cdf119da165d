#include "proto/convert.h"

#include <gtest/gtest.h>

namespace remat::proto {
namespace {

TEST(ConvertTest, UnsetFieldsTakeMegatronDefaults) {
  v1::SearchSpec msg;
  msg.mutable_model()->set_num_layers(2);
  msg.mutable_model()->set_hidden_size(64);
  msg.mutable_model()->set_num_attention_heads(4);
  msg.mutable_model()->set_seq_length(16);
  msg.mutable_model()->set_vocab_size(32);
  auto spec = FromProto(msg);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_DOUBLE_EQ(spec->model.hidden_dropout, 0.1);
  EXPECT_TRUE(spec->model.add_bias_linear);
  EXPECT_EQ(spec->search.max_trials, 40);
  EXPECT_DOUBLE_EQ(spec->search.memory_budget_gib, 80);
  EXPECT_EQ(spec->parallel.tensor_model_parallel_size, 1);
}

TEST(ConvertTest, SpecRoundTripsWithDefaultsResolved) {
  search::SearchSpec s;
  s.name = "x";
  s.model.num_layers = 4;
  s.model.hidden_size = 128;
  s.model.num_attention_heads = 8;
  s.model.seq_length = 32;
  s.model.vocab_size = 100;
  s.model.multi_latent_attention = true;
  s.model.q_lora_rank = 64;
  s.model.num_moe_experts = 4;
  s.model.moe_layer_freq.pattern = {0, 1, 1, 1};
  s.model.moe_shared_expert_intermediate_size = 256;
  s.model.normalization = search::Normalization::kRMSNorm;
  s.parallel.tensor_model_parallel_size = 2;
  s.search.strategy = search::StrategyKind::kExhaustive;
  s.search.backend = search::Backend::kReplay;
  s.search.replay_table = "t.json";
  auto back = FromProto(ToProto(s));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(ToProto(*back).SerializeAsString(), ToProto(s).SerializeAsString());
  EXPECT_EQ(*back->model.q_lora_rank, 64);
  EXPECT_EQ(back->model.moe_layer_freq.pattern, s.model.moe_layer_freq.pattern);
  EXPECT_EQ(*back->model.ffn_hidden_size, 512);  // resolved default travels explicitly
  EXPECT_EQ(back->search.strategy, search::StrategyKind::kExhaustive);
}

// q_lora_rank: unset is MLATransformerConfig's 512, 0 is null (no q compression); the FP8,
// CUDA-graph, offloading and overlap fields travel.
TEST(ConvertTest, QLoraNullAndCompatibilityFieldsRoundTrip) {
  search::SearchSpec s;
  s.model.num_layers = 4;
  s.model.hidden_size = 128;
  s.model.num_attention_heads = 8;
  s.model.seq_length = 32;
  s.model.vocab_size = 100;
  s.model.multi_latent_attention = true;
  s.model.q_lora_rank.reset();
  s.model.fp8 = "hybrid";
  s.model.fp8_recipe = "tensorwise";
  s.model.cuda_graph_impl = "local";
  s.model.cuda_graph_scope = {"attn", "mlp"};
  s.model.cpu_offloading_num_layers = 2;
  s.parallel.overlap_grad_reduce = true;
  s.parallel.overlap_param_gather = true;
  auto back = FromProto(ToProto(s));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_FALSE(back->model.q_lora_rank.has_value());
  EXPECT_EQ(back->model.fp8, "hybrid");
  EXPECT_EQ(back->model.fp8_recipe, "tensorwise");
  EXPECT_EQ(back->model.cuda_graph_impl, "local");
  EXPECT_EQ(back->model.cuda_graph_scope, s.model.cuda_graph_scope);
  EXPECT_EQ(back->model.cpu_offloading_num_layers, 2);
  EXPECT_TRUE(back->parallel.overlap_grad_reduce);
  EXPECT_TRUE(back->parallel.overlap_param_gather);
  v1::SearchSpec unset = ToProto(s);
  unset.mutable_model()->clear_q_lora_rank();  // a client that sends only what it changes
  auto defaulted = FromProto(unset);
  ASSERT_TRUE(defaulted.ok());
  EXPECT_EQ(defaulted->model.q_lora_rank, std::optional<int>(512));
  unset.mutable_model()->clear_normalization();  // MLATransformerConfig's RMSNorm
  EXPECT_EQ(FromProto(unset)->model.EffectiveNormalization(), search::Normalization::kRMSNorm);
}

TEST(ConvertTest, PipelineLayoutFieldsRoundTrip) {
  search::SearchSpec s;
  s.model.num_layers = 14;
  s.model.hidden_size = 128;
  s.model.num_attention_heads = 8;
  s.model.seq_length = 32;
  s.model.vocab_size = 100;
  s.train.global_batch_size = 64;
  s.parallel.pipeline_model_parallel_size = 4;
  s.parallel.virtual_pipeline_model_parallel_size = 2;
  s.parallel.context_parallel_size = 2;
  s.parallel.account_for_embedding_in_pipeline_split = true;
  s.parallel.account_for_loss_in_pipeline_split = true;
  auto back = FromProto(ToProto(s));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back->train.global_batch_size, 64);
  EXPECT_EQ(*back->parallel.virtual_pipeline_model_parallel_size, 2);
  EXPECT_EQ(back->parallel.context_parallel_size, 2);
  EXPECT_TRUE(back->parallel.account_for_embedding_in_pipeline_split);
  EXPECT_TRUE(back->parallel.account_for_loss_in_pipeline_split);
  EXPECT_FALSE(back->parallel.num_layers_in_first_pipeline_stage.has_value());
  s.parallel.account_for_embedding_in_pipeline_split = false;
  s.parallel.account_for_loss_in_pipeline_split = false;
  s.parallel.num_layers_in_first_pipeline_stage = 2;
  s.parallel.num_layers_in_last_pipeline_stage = 4;
  s.train.global_batch_size.reset();  // unset stays unset: its default depends on DP
  back = FromProto(ToProto(s));
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(*back->parallel.num_layers_in_first_pipeline_stage, 2);
  EXPECT_EQ(*back->parallel.num_layers_in_last_pipeline_stage, 4);
  EXPECT_FALSE(back->train.global_batch_size.has_value());
}

TEST(ConvertTest, UnknownEnumNamesTheField) {
  v1::SearchSpec msg;
  msg.mutable_model()->set_normalization("BatchNorm");
  auto spec = FromProto(msg);
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().message(), "model.normalization: unknown value \"BatchNorm\"");
  v1::SearchSpec msg2;
  msg2.mutable_search()->set_backend("slurm");
  EXPECT_EQ(FromProto(msg2).status().message(), "search.backend: unknown value \"slurm\"");
}

TEST(ConvertTest, TrialResultRoundTrips) {
  search::TrialResult r;
  r.policy = *search::ParsePolicy("selective:[core_attn,moe_act]");
  r.status = search::TrialStatus::kOom;
  search::RankResult rr;
  rr.rank = 1;
  rr.peak_allocated_bytes = 10;
  rr.peak_reserved_bytes = 20;
  rr.failing_request_bytes = 30;
  rr.step_times_s = {0.4, 0.5, 0.7};
  r.ranks = {rr};
  r.step_time_s = 0.5;
  r.loss = 2.5;
  r.reused = true;
  r.message = "out of memory";
  auto back = FromProto(ToProto(r));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->policy.ToString(), "selective:[core_attn,moe_act]");
  EXPECT_EQ(back->status, search::TrialStatus::kOom);
  EXPECT_EQ(back->ranks.at(0).failing_request_bytes, 30u);
  EXPECT_EQ(back->ranks.at(0).step_times_s, (std::vector<double>{0.4, 0.5, 0.7}));
  EXPECT_TRUE(back->reused);
  EXPECT_EQ(back->message, "out of memory");
}

TEST(ConvertTest, NonFinalStatusIsRefused) {
  v1::TrialResult msg;
  msg.mutable_policy()->set_canonical("none");
  msg.set_status(v1::TRIAL_STATUS_RUNNING);
  EXPECT_FALSE(FromProto(msg).ok());
  msg.set_status(v1::TRIAL_STATUS_OK);
  msg.mutable_policy()->set_canonical("selective:[bogus]");
  EXPECT_FALSE(FromProto(msg).ok());
}

}  // namespace
}  // namespace remat::proto
