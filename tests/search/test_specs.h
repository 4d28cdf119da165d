// Small specs shared by the search tests: one per architecture the guide distinguishes.
#pragma once

#include "search/spec.h"

namespace remat::search::testing {

inline SearchSpec DenseSpec() {
  SearchSpec s;
  s.name = "dense";
  s.model.num_layers = 4;
  s.model.hidden_size = 4096;
  s.model.num_attention_heads = 32;
  s.model.num_query_groups = 8;
  s.model.ffn_hidden_size = 14336;
  s.model.gated_linear_unit = true;
  s.model.normalization = Normalization::kRMSNorm;
  s.model.seq_length = 4096;
  s.model.vocab_size = 128256;
  s.model.attention_dropout = 0;
  s.model.hidden_dropout = 0;
  s.model.add_bias_linear = false;
  s.model.position_embedding_type = PositionEmbedding::kRope;
  return s;
}

inline SearchSpec MlaSpec() {  // DeepSeek-V2-Lite shape, MoE with shared experts, first layer dense
  SearchSpec s = DenseSpec();
  s.name = "mla";
  s.model.hidden_size = 2048;
  s.model.num_attention_heads = 16;
  s.model.num_query_groups.reset();
  s.model.ffn_hidden_size = 10944;
  s.model.multi_latent_attention = true;
  s.model.q_lora_rank.reset();  // DeepSeek-V2-Lite: no q compression
  s.model.kv_lora_rank = 512;
  s.model.qk_head_dim = 128;
  s.model.qk_pos_emb_head_dim = 64;
  s.model.v_head_dim = 128;
  s.model.vocab_size = 102400;
  return s;
}

inline SearchSpec MoeSpec() {
  SearchSpec s = DenseSpec();
  s.name = "moe";
  s.model.num_moe_experts = 8;
  s.model.moe_router_topk = 2;
  s.model.moe_ffn_hidden_size = 4096;
  s.model.moe_shared_expert_intermediate_size = 4096;
  s.model.moe_grouped_gemm = true;
  return s;
}

}  // namespace remat::search::testing
