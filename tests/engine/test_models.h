// Tiny versions of the three example models (dense GQA, MLA, grouped MoE with shared experts)
// for the CPU engine tests: hidden 64, 4 layers, seq 64, vocab 512, fp32, dropout 0. The vocabulary
// is 8x the hidden size, as in real models (where it is 8-40x): the logits and their fp32 softmax
// then weigh as they do in a real step, so the end-of-forward peak is not dwarfed by one
// layer's backward transient.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/trial_runner.h"
#include "search/policy.h"
#include "search/spec.h"

namespace remat::engine::testing {

// The `model:` section of the tiny dense model the multi-rank tests write as YAML for their
// remat-trial processes (pipeline, distributed optimizer, layout proxies): hidden 64, 4 heads in 2
// query groups, SwiGLU FFN 128, RMSNorm, vocabulary 256, RoPE, no dropout, no biases.
// `extra` lines are added to the section.
inline std::string TinyRankModelYaml(int layers, int seq_length, const std::string& extra = "") {
  return "model:\n"
         "  num_layers: " + std::to_string(layers) + "\n"
         "  hidden_size: 64\n"
         "  num_attention_heads: 4\n"
         "  num_query_groups: 2\n"
         "  ffn_hidden_size: 128\n"
         "  gated_linear_unit: true\n"
         "  normalization: RMSNorm\n"
         "  seq_length: " + std::to_string(seq_length) + "\n"
         "  vocab_size: 256\n"
         "  attention_dropout: 0.0\n"
         "  hidden_dropout: 0.0\n"
         "  add_bias_linear: false\n"
         "  position_embedding_type: rope\n" + extra;
}

// The `model:` lines of the tiny MoE the multi-rank tests add to TinyRankModelYaml: 4 experts,
// top-2, 64 wide, grouped or sequential, with a 32-wide shared expert when `shared_expert`, and
// the token dispatcher named when `dispatcher` is not empty (else Megatron's default).
inline std::string TinyRankMoeLines(bool grouped, const std::string& dispatcher = "",
                                    bool shared_expert = true) {
  return "  num_moe_experts: 4\n"
         "  moe_router_topk: 2\n"
         "  moe_ffn_hidden_size: 64\n" +
         std::string(shared_expert ? "  moe_shared_expert_intermediate_size: 32\n" : "") +
         (dispatcher.empty() ? "" : "  moe_token_dispatcher_type: " + dispatcher + "\n") +
         "  moe_grouped_gemm: " + (grouped ? "true" : "false") + "\n";
}

// The `parallel:` lines of the 8-rank expert grid: TP 2 (sequence parallel) x PP 2 x DP 2 on the
// dense side, EP 2 x ETP `etp` on the expert side.
inline std::string ExpertGridYaml(int etp) {
  return "  tensor_model_parallel_size: 2\n  sequence_parallel: true\n"
         "  pipeline_model_parallel_size: 2\n  data_parallel_size: 2\n"
         "  expert_model_parallel_size: 2\n  expert_tensor_parallel_size: " +
         std::to_string(etp) + "\n";
}

// A whole spec for a remat-trial process: `name`, a `model:` section (TinyRankModelYaml), the
// `train:` lines beyond fp32 precision, the `parallel:` lines (none: one rank, TP 1), and a
// `search:` section of one warm-up and one measured step on CPU plus the `search_extra` lines.
inline std::string TinyRankSpecYaml(const std::string& name, const std::string& model,
                                    const std::string& train, const std::string& parallel,
                                    const std::string& search_extra = "") {
  return "name: " + name + "\n" + model +
         "train:\n"
         "  precision: fp32\n" + train +
         "parallel:\n" + (parallel.empty() ? "  tensor_model_parallel_size: 1\n" : parallel) +
         "search:\n"
         "  memory_budget_gib: 1\n"
         "  warmup_steps: 1\n"
         "  measure_steps: 1\n"
         "  device: cpu\n" + search_extra;
}

inline search::SearchSpec TinyBase() {
  search::SearchSpec s;
  s.name = "tiny";
  auto& m = s.model;
  m.num_layers = 4;
  m.hidden_size = 64;
  m.num_attention_heads = 4;
  m.seq_length = 64;
  m.vocab_size = 512;
  m.ffn_hidden_size = 128;
  m.gated_linear_unit = true;
  m.normalization = search::Normalization::kRMSNorm;
  m.attention_dropout = 0.0;
  m.hidden_dropout = 0.0;
  m.add_bias_linear = false;
  m.position_embedding_type = search::PositionEmbedding::kRope;
  s.train.micro_batch_size = 2;
  s.train.precision = search::Precision::kFp32;
  s.search.memory_budget_gib = 1;
  s.search.warmup_steps = 1;  // the measured step's loss sees one optimizer update
  s.search.warmup_max_steps = 1;  // a fixed warm-up (a window of one settles at once): fast
  s.search.steady_window = 1;
  s.search.measure_steps = 1;
  s.search.noise_target = 0;  // exactly one measured step
  s.search.device = search::Device::kCpu;
  return s;
}

inline search::SearchSpec TinyDense() {
  search::SearchSpec s = TinyBase();
  s.name = "tiny-dense";
  s.model.num_query_groups = 2;
  return s;
}

// Megatron's defaults where the modern recipe differs: LayerNorm, GELU, biases, learned absolute
// positions, dropout on.
inline search::SearchSpec TinyDenseDropout() {
  search::SearchSpec s = TinyBase();
  s.name = "tiny-dense-dropout";
  s.model.gated_linear_unit = false;
  s.model.normalization = search::Normalization::kLayerNorm;
  s.model.add_bias_linear = true;
  s.model.position_embedding_type = search::PositionEmbedding::kLearnedAbsolute;
  s.model.attention_dropout = 0.1;
  s.model.hidden_dropout = 0.1;
  return s;
}

inline search::SearchSpec TinyMla() {
  search::SearchSpec s = TinyBase();
  s.name = "tiny-mla";
  auto& m = s.model;
  m.multi_latent_attention = true;
  m.q_lora_rank = 32;
  m.kv_lora_rank = 32;
  m.qk_head_dim = 32;
  m.qk_pos_emb_head_dim = 16;
  m.v_head_dim = 24;
  return s;
}

inline search::SearchSpec TinyMoe() {
  search::SearchSpec s = TinyBase();
  s.name = "tiny-moe";
  auto& m = s.model;
  m.num_moe_experts = 8;
  m.moe_router_topk = 2;
  m.moe_ffn_hidden_size = 64;
  m.moe_shared_expert_intermediate_size = 96;
  m.moe_grouped_gemm = true;
  m.moe_layer_freq.pattern = {0, 1, 1, 1};  // a dense first layer, as DeepSeek-V2-Lite
  return s;
}

// |a - b| relative to |b| (b = 0 counts as 1e-30: any difference from exact zero is large).
inline double RelDiff(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// The policy `text` names; a test failure (and the default policy) when it does not parse.
inline search::Policy ParsedPolicy(const std::string& text) {
  auto p = search::ParsePolicy(text);
  EXPECT_TRUE(p.ok()) << text;
  return p.ok() ? *p : search::Policy();
}

// One in-process trial of `spec` under `policy` on one rank (the counting allocator measures).
inline search::TrialResult RunInProcess(const search::SearchSpec& spec,
                                        const search::Policy& policy) {
  TrialOptions o;
  o.spec = spec;
  o.policy = policy;
  return RunTrial(o);
}

}  // namespace remat::engine::testing
