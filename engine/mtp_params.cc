// The parameters of Megatron Core's multi-token-prediction layers (Megatron-LM
// megatron/core/transformer/multi_token_prediction.py at d98e8a6, MultiTokenPredictionLayer):
// enorm, hnorm, eh_proj (column-parallel 2h -> h, no bias), one transformer layer built from the
// decoder's last layer spec, final_layernorm.
#include <string>

#include "engine/model_params.h"
#include "search/mtp_model.h"
#include "search/pipeline_layout.h"

namespace remat::engine {

void ModelParams::DeclareMtp(const search::SearchSpec& spec, const Runtime& rt,
                             const std::vector<search::StageChunk>& chunks) {
  const int count = search::MtpLayerCount(spec);
  bool held = false;
  for (const search::StageChunk& c : chunks) held |= c.mtp_layers > 0;
  mtp_held_ = held;
  const int64_t hidden = spec.model.hidden_size;
  for (int k = 0; k < count; ++k) {
    const size_t begin = params.size();
    const std::string pre = "mtp.layers." + std::to_string(k) + ".";
    MtpParams p;
    AddNorm(pre + "enorm", hidden, &p.enorm_w, &p.enorm_b);
    AddNorm(pre + "hnorm", hidden, &p.hnorm_w, &p.hnorm_b);
    p.eh_proj = Add(pre + "eh_proj.weight", {hidden, 2 * hidden}, 0, 0.02);
    p.layer = static_cast<int>(layers.size());
    layers.push_back(
        DeclareLayer(spec, rt, pre + "transformer_layer.", search::MtpInnerLayer(spec)));
    AddNorm(pre + "final_layernorm", hidden, &p.final_w, &p.final_b);
    for (size_t i = begin; i < params.size(); ++i) params[i].absent |= !held;
    mtp.push_back(p);
  }
}

void ModelParams::MtpEmbedding(const search::SearchSpec& spec, bool first_stage) {
  if (search::MtpLayerCount(spec) == 0) return;
  // Every rank marks the first stage's embedding (its gradient joins the embedding group's sum).
  if (spec.parallel.pipeline_model_parallel_size > 1) params[word_emb].pipeline_tied = true;
  if (!mtp_held_) return;
  if (first_stage) {
    mtp_word_emb = word_emb;
  } else if (output_w >= 0 && params[output_w].copy_of == word_emb) {
    mtp_word_emb = output_w;  // the tied embedding's copy serves the MTP layers too
  } else {
    // GPTModel builds the embedding on an MTP stage; its word embedding starts as the first
    // stage's and their gradients are summed over the embedding group.
    mtp_word_emb = AddWordEmbeddingCopy("embedding.word_embeddings.weight (MTP stage copy)");
  }
}

}  // namespace remat::engine
