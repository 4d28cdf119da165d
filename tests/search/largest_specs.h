// The largest specs ValidateSpec accepts: every limit of search/limits.h at (or next to) its
// maximum, together, in the layouts that cost the planner most (the most micro-batches per
// step, the deepest pipeline, the most virtual chunks, the most experts). Shared by the
// planning-cost test (tests/search/planning_cost_test.cc) and remat-plan-bench.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "search/limits.h"
#include "search/spec.h"

namespace remat::search::testing {

// A dense model at the limits: 1024 layers, hidden 2^18 over 4096 heads, sequence and vocabulary
// 2^22, one sequence per micro-batch and a global batch of 2^24 (the most micro-batches).
inline SearchSpec LargestDense() {
  SearchSpec s;
  s.name = "largest";
  s.model.num_layers = static_cast<int>(limits::kMaxLayers);
  s.model.hidden_size = static_cast<int>(limits::kMaxHiddenSize);
  s.model.num_attention_heads = static_cast<int>(limits::kMaxAttentionHeads);
  s.model.num_query_groups = static_cast<int>(limits::kMaxAttentionHeads);
  s.model.ffn_hidden_size = static_cast<int>(limits::kMaxHiddenSize);
  s.model.gated_linear_unit = true;
  s.model.normalization = Normalization::kRMSNorm;
  s.model.seq_length = static_cast<int>(limits::kMaxSeqLength);
  s.model.vocab_size = static_cast<int>(limits::kMaxVocabSize);
  s.model.attention_dropout = 0;
  s.model.hidden_dropout = 0;
  s.model.add_bias_linear = false;
  s.model.position_embedding_type = PositionEmbedding::kRope;
  s.train.micro_batch_size = 1;
  s.train.global_batch_size = static_cast<int>(limits::kMaxGlobalBatchSize);
  s.search.memory_budget_gib = limits::kMaxMemoryGib;
  s.search.max_trials = static_cast<int>(limits::kMaxTrials);
  return s;
}

// Named layouts of LargestDense (and an MoE one), each accepted by ValidateSpec.
inline std::vector<std::pair<std::string, SearchSpec>> LargestSpecs() {
  std::vector<std::pair<std::string, SearchSpec>> out;
  {
    // What a submit found first: two layers, PP 2, 2^24 micro-batches.
    SearchSpec s = LargestDense();
    s.model.num_layers = 2;
    s.parallel.pipeline_model_parallel_size = 2;
    out.emplace_back("2 layers, PP 2, 2^24 micro-batches", s);
  }
  {
    SearchSpec s = LargestDense();
    s.parallel.pipeline_model_parallel_size = 1024;
    s.parallel.tensor_model_parallel_size = 64;
    s.parallel.sequence_parallel = true;
    out.emplace_back("1024 layers, PP 1024 x TP 64, 2^24 micro-batches", s);
  }
  {
    SearchSpec s = LargestDense();
    s.parallel.pipeline_model_parallel_size = 2;
    s.parallel.virtual_pipeline_model_parallel_size = 512;
    out.emplace_back("1024 layers, PP 2 x VPP 512, 2^24 micro-batches", s);
  }
  {
    SearchSpec s = LargestDense();
    s.parallel.pipeline_model_parallel_size = 32;
    s.parallel.virtual_pipeline_model_parallel_size = 32;
    s.parallel.context_parallel_size = 64;
    s.model.attention_backend = AttentionBackend::kFlash;
    out.emplace_back("1024 layers, PP 32 x VPP 32 x CP 64, 2^24 micro-batches", s);
  }
  {
    SearchSpec s = LargestDense();
    s.parallel.pipeline_model_parallel_size = 16;
    s.parallel.virtual_pipeline_model_parallel_size = 64;
    s.parallel.num_layers_in_first_pipeline_stage = 64;
    s.parallel.virtual_pipeline_model_parallel_size.reset();
    s.parallel.num_layers_in_last_pipeline_stage = 64;
    s.parallel.data_parallel_size = 4096;
    s.train.micro_batch_size = static_cast<int>(limits::kMaxMicroBatchSize);
    s.train.global_batch_size = static_cast<int>(limits::kMaxGlobalBatchSize);
    out.emplace_back("1024 layers, uneven PP 16 x DP 4096, micro-batch 4096", s);
  }
  {
    SearchSpec s = LargestDense();
    s.model.num_moe_experts = static_cast<int>(limits::kMaxExperts);
    s.model.moe_router_topk = static_cast<int>(limits::kMaxExperts);
    s.model.moe_ffn_hidden_size = static_cast<int>(limits::kMaxHiddenSize);
    s.model.moe_shared_expert_intermediate_size = static_cast<int>(limits::kMaxHiddenSize);
    s.model.moe_grouped_gemm = true;
    s.parallel.pipeline_model_parallel_size = 4;
    s.parallel.virtual_pipeline_model_parallel_size = 256;
    s.parallel.expert_model_parallel_size = 4096;
    s.parallel.data_parallel_size = 4096;
    out.emplace_back("MoE 4096 experts top-4096, PP 4 x VPP 256 x EP 4096, 2^24 micro-batches", s);
  }
  return out;
}

}  // namespace remat::search::testing
