#include "engine/model_params.h"

#include <cmath>
#include <string>
#include <utility>

#include "search/memory_model.h"

namespace remat::engine {

int ModelParams::Add(std::string name, std::vector<int64_t> full, int shard_dim, double std_dev,
                     double value, int blocks, bool sp_grad) {
  ParamInfo p;
  p.name = std::move(name);
  p.full_shape = full;
  p.shape = full;
  p.shard_dim = tp_ > 1 ? shard_dim : -1;
  p.shard_blocks = blocks;
  if (p.shard_dim >= 0) p.shape[p.shard_dim] /= tp_;
  p.init_std = std_dev;
  p.init_value = value;
  p.sequence_parallel_grad = sp_grad && sp_;
  params.push_back(std::move(p));
  return static_cast<int>(params.size()) - 1;
}

int ModelParams::AddExpert(std::string name, std::vector<int64_t> full, std::vector<int64_t> local,
                           std::vector<int64_t> view, int expert_dim, int etp_dim, double std_dev,
                           int owner) {
  const int index = Add(std::move(name), std::move(full), -1, std_dev);
  ParamInfo& p = params[index];
  p.expert = true;
  p.shape = std::move(local);
  p.expert_view = std::move(view);
  p.expert_dim = expert_dim;
  p.etp_dim = etp_dim;
  p.absent = owner >= 0 && owner != ep_rank_;
  return index;
}

void ModelParams::AddNorm(const std::string& name, int64_t size, int* w, int* b) {
  *w = Add(name + ".weight", {size}, -1, 0, 1.0, 1, true);
  if (layer_norm_) {
    *b = Add(name + ".bias", {size}, -1, 0, 0.0, 1, true);
  }
}

ModelParams::LayerParams ModelParams::DeclareLayer(const search::SearchSpec& spec,
                                                   const Runtime& rt, const std::string& pre,
                                                   int spec_layer) {
  const search::ModelSpec& m = spec.model;
  const int heads = m.num_attention_heads, groups = m.EffectiveQueryGroups();
  const int kv_channels = m.EffectiveKvChannels(), hidden = m.hidden_size;
  const int ffn = m.EffectiveFfnHiddenSize();
  const int ep = rt.ep_size(), ep_rank = ep_rank_, etp = rt.etp_size();
  const int local_experts = m.IsMoe() ? *m.num_moe_experts / ep : 0;
  const double std_dev = 0.02;                                     // Megatron's init_method_std
  const double out_std = std_dev / std::sqrt(2.0 * m.num_layers);  // scaled_init_method_normal
  const bool bias = m.add_bias_linear;
  const int glu = m.gated_linear_unit ? 2 : 1;
  LayerParams lp;
  lp.spec_layer = spec_layer;
  AddNorm(pre + "input_layernorm", hidden, &lp.ln1_w, &lp.ln1_b);
  if (m.multi_latent_attention) {
    const int64_t qk = m.qk_head_dim + m.qk_pos_emb_head_dim;
    if (m.q_lora_rank) {
      // Duplicated over TP; under SP each rank sees its own tokens, so the gradient is partial.
      lp.q_down = Add(pre + "self_attention.linear_q_down_proj.weight", {*m.q_lora_rank, hidden},
                      -1, std_dev, 0, 1, true);
      AddNorm(pre + "self_attention.q_layernorm", *m.q_lora_rank, &lp.q_norm_w, &lp.q_norm_b);
      lp.q_up = Add(pre + "self_attention.linear_q_up_proj.weight", {heads * qk, *m.q_lora_rank},
                    0, std_dev);
    } else {
      lp.q_up =
          Add(pre + "self_attention.linear_q_proj.weight", {heads * qk, hidden}, 0, std_dev);
    }
    lp.kv_down = Add(pre + "self_attention.linear_kv_down_proj.weight",
                     {m.kv_lora_rank + m.qk_pos_emb_head_dim, hidden}, -1, std_dev, 0, 1, true);
    AddNorm(pre + "self_attention.kv_layernorm", m.kv_lora_rank, &lp.kv_norm_w, &lp.kv_norm_b);
    lp.kv_up = Add(pre + "self_attention.linear_kv_up_proj.weight",
                   {heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank}, 0, std_dev);
    lp.proj_w = Add(pre + "self_attention.linear_proj.weight", {hidden, heads * m.v_head_dim}, 1,
                    out_std);
  } else {
    const int64_t qkv_rows = static_cast<int64_t>(heads + 2 * groups) * kv_channels;
    lp.qkv_w = Add(pre + "self_attention.linear_qkv.weight", {qkv_rows, hidden}, 0, std_dev);
    if (bias) lp.qkv_b = Add(pre + "self_attention.linear_qkv.bias", {qkv_rows}, 0, 0);
    lp.proj_w = Add(pre + "self_attention.linear_proj.weight",
                    {hidden, static_cast<int64_t>(heads) * kv_channels}, 1, out_std);
  }
  if (bias) lp.proj_b = Add(pre + "self_attention.linear_proj.bias", {hidden}, -1, 0, 0, 1, true);
  AddNorm(pre + "pre_mlp_layernorm", hidden, &lp.ln2_w, &lp.ln2_b);
  lp.moe = m.IsMoeLayer(spec_layer);
  if (!lp.moe) {
    lp.fc1_w = Add(pre + "mlp.linear_fc1.weight", {glu * ffn, hidden}, 0, std_dev, 0, glu);
    if (bias) lp.fc1_b = Add(pre + "mlp.linear_fc1.bias", {glu * ffn}, 0, 0, 0, glu);
    lp.fc2_w = Add(pre + "mlp.linear_fc2.weight", {hidden, ffn}, 1, out_std);
    if (bias) lp.fc2_b = Add(pre + "mlp.linear_fc2.bias", {hidden}, -1, 0, 0, 1, true);
  } else {
    const int64_t experts = *m.num_moe_experts;
    const int64_t f = m.EffectiveMoeFfnHiddenSize();
    lp.router = Add(pre + "mlp.router.weight", {experts, hidden}, -1, std_dev, 0, 1, true);
    const int64_t local = local_experts;
    const int64_t fl = f / etp;  // this rank's slice of each expert's FFN width
    if (m.moe_grouped_gemm) {
      // Megatron's GroupedMLP views weight1 [h, E x glu x F] as [E, h, glu x F] and weight2
      // [E x F, h] as [E, F, h]: expert e is the flat chunk e of each.
      lp.w1 = AddExpert(pre + "mlp.experts.weight1", {hidden, experts * glu * f},
                        {hidden, local * glu * fl}, {experts, hidden, glu, f}, 0, 3, std_dev);
      lp.w2 = AddExpert(pre + "mlp.experts.weight2", {experts * f, hidden}, {local * fl, hidden},
                        {experts, f, hidden}, 0, 1, out_std);
    } else {
      // Every expert is declared (the same initialisation on every EP rank); this rank keeps
      // the indices of its own, local expert i being global expert ep_rank * local + i.
      for (int e = 0; e < experts; ++e) {
        const std::string pe = pre + "mlp.experts.local_experts." + std::to_string(e) + ".";
        const int owner = ep > 1 ? static_cast<int>(e / local) : -1;
        const bool mine = owner < 0 || owner == ep_rank;
        const int fc1 = AddExpert(pe + "linear_fc1.weight", {glu * f, hidden}, {glu * fl, hidden},
                                  {glu, f, hidden}, -1, 1, std_dev, owner);
        const int fc2 = AddExpert(pe + "linear_fc2.weight", {hidden, f}, {hidden, fl},
                                  {hidden, f}, -1, 1, out_std, owner);
        if (mine) {
          lp.e_fc1_w.push_back(fc1);
          lp.e_fc2_w.push_back(fc2);
        }
        if (bias) {  // ETP is 1 with biases (ValidateSpec)
          const int b1 =
              AddExpert(pe + "linear_fc1.bias", {glu * f}, {glu * f}, {}, -1, -1, 0, owner);
          const int b2 =
              AddExpert(pe + "linear_fc2.bias", {hidden}, {hidden}, {}, -1, -1, 0, owner);
          if (mine) {
            lp.e_fc1_b.push_back(b1);
            lp.e_fc2_b.push_back(b2);
          }
        }
      }
    }
    if (m.HasSharedExperts()) {
      const int64_t fs = *m.moe_shared_expert_intermediate_size;
      // Megatron's SharedExpertMLP is a tensor-parallel MLP over the dense TP group.
      lp.sh_fc1_w = Add(pre + "mlp.shared_experts.linear_fc1.weight", {glu * fs, hidden}, 0,
                        std_dev, 0, glu);
      if (bias) {
        lp.sh_fc1_b = Add(pre + "mlp.shared_experts.linear_fc1.bias", {glu * fs}, 0, 0, 0, glu);
      }
      lp.sh_fc2_w = Add(pre + "mlp.shared_experts.linear_fc2.weight", {hidden, fs}, 1, out_std);
      if (bias) {
        lp.sh_fc2_b =
            Add(pre + "mlp.shared_experts.linear_fc2.bias", {hidden}, -1, 0, 0, 1, true);
      }
    }
  }
  return lp;
}

void ModelParams::Declare(const search::SearchSpec& spec, const Runtime& rt,
                          const std::vector<search::StageChunk>& chunks, bool first_stage,
                          bool last_stage) {
  const search::ModelSpec& m = spec.model;
  tp_ = spec.parallel.tensor_model_parallel_size;
  sp_ = spec.parallel.sequence_parallel && tp_ > 1;
  ep_rank_ = rt.ep_rank();
  layer_norm_ = m.EffectiveNormalization() == search::Normalization::kLayerNorm;
  const int hidden = m.hidden_size, seq = m.seq_length;
  const int vocab_padded = static_cast<int>(search::PaddedVocabSize(spec));
  const double std_dev = 0.02;  // Megatron's init_method_std
  // Parameters of other pipeline stages are declared all the same (absent), so every rank
  // draws the same initialisation stream.
  auto held_from = [this](size_t begin, bool held) {
    for (size_t k = begin; k < params.size(); ++k) params[k].absent |= !held;
  };
  std::vector<bool> layer_held(m.num_layers, false);
  for (const search::StageChunk& c : chunks) {
    for (int i = c.first_layer; i < c.first_layer + c.num_layers; ++i) layer_held[i] = true;
  }
  word_emb = Add("embedding.word_embeddings.weight", {vocab_padded, hidden}, 0, std_dev);
  if (m.position_embedding_type == search::PositionEmbedding::kLearnedAbsolute) {
    pos_emb = Add("embedding.position_embeddings.weight", {seq, hidden}, -1, std_dev);
  }
  held_from(static_cast<size_t>(word_emb), first_stage);
  for (int i = 0; i < m.num_layers; ++i) {
    const size_t layer_begin = params.size();
    layers.push_back(DeclareLayer(spec, rt, "decoder.layers." + std::to_string(i) + ".", i));
    held_from(layer_begin, layer_held[i]);
  }
  const size_t head_begin = params.size();
  AddNorm("decoder.final_layernorm", hidden, &final_w, &final_b);
  if (!m.share_embeddings_and_output_weights) {
    output_w = Add("output_layer.weight", {vocab_padded, hidden}, 0, std_dev);
  }
  held_from(head_begin, last_stage);
  // Last, so that every other weight draws what it draws without MTP (GPTModel builds the MTP
  // block before the output layer; only the initial values' order differs).
  DeclareMtp(spec, rt, chunks);  // engine/mtp_params.cc: absent unless this rank builds them
  if (m.share_embeddings_and_output_weights && !(first_stage && last_stage)) {
    // Megatron's tied embedding under PP: the last stage keeps a copy of the word embedding as
    // its output weight, and the two gradients are summed before the optimizer step.
    params[word_emb].pipeline_tied = true;
    if (last_stage) {
      output_w = AddWordEmbeddingCopy("output_layer.weight (copy of the tied word embedding)");
    }
  }
  MtpEmbedding(spec, first_stage);
}

int ModelParams::AddWordEmbeddingCopy(std::string name) {
  ParamInfo copy = params[word_emb];
  copy.name = std::move(name);
  copy.absent = false;
  copy.copy_of = word_emb;
  copy.shared = true;
  params.push_back(std::move(copy));
  return static_cast<int>(params.size()) - 1;
}

}  // namespace remat::engine
