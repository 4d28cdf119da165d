// The model's parameters as Megatron Core's GPT model declares them: names, full shapes, this
// rank's TP / EP / expert-TP shard, initialisation, and which of them this pipeline rank holds.
// Internal to remat_engine: GptModel (engine/model.cc) is built on it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model.h"
#include "engine/ops.h"
#include "search/pipeline.h"
#include "search/spec.h"

namespace remat::engine {

struct ModelParams {
  struct LayerParams {
    bool moe = false;
    int ln1_w = -1, ln1_b = -1, ln2_w = -1, ln2_b = -1;
    // standard attention
    int qkv_w = -1, qkv_b = -1;
    // MLA
    int q_down = -1, q_norm_w = -1, q_norm_b = -1, q_up = -1, kv_down = -1, kv_norm_w = -1,
        kv_norm_b = -1, kv_up = -1;
    int proj_w = -1, proj_b = -1;
    // dense MLP
    int fc1_w = -1, fc1_b = -1, fc2_w = -1, fc2_b = -1;
    // MoE
    int router = -1, w1 = -1, w2 = -1;
    std::vector<int> e_fc1_w, e_fc1_b, e_fc2_w, e_fc2_b;  // sequential experts
    int sh_fc1_w = -1, sh_fc1_b = -1, sh_fc2_w = -1, sh_fc2_b = -1;
    int spec_layer = 0;  // the decoder layer whose spec it follows (an MTP layer's: the last)
  };
  // One multi-token-prediction layer (engine/mtp_block.h): its norms, eh_proj and the index of
  // its transformer layer in `layers` (after the decoder's).
  struct MtpParams {
    int enorm_w = -1, enorm_b = -1, hnorm_w = -1, hnorm_b = -1, eh_proj = -1, final_w = -1,
        final_b = -1;
    int layer = -1;
  };
  std::vector<ParamInfo> params;
  std::vector<LayerParams> layers;  // every layer of the model; this rank runs its chunks' only
  int word_emb = -1, pos_emb = -1, final_w = -1, final_b = -1, output_w = -1;
  std::vector<MtpParams> mtp;  // every MTP layer of the model; absent unless this rank builds them
  int mtp_word_emb = -1;       // the word embedding this rank's MTP layers read

  // Declares every parameter of the model, in Megatron Core's order and with its names (so every
  // rank, whatever its layout, draws the same initialisation stream): the layers of every stage
  // (those outside `chunks` absent), the embedding on the first stage, the final norm and output
  // layer on the last (a copy of the tied word embedding there under PP).
  void Declare(const search::SearchSpec& spec, const Runtime& rt,
               const std::vector<search::StageChunk>& chunks, bool first_stage, bool last_stage);

 private:
  // A parameter split over TP along `shard_dim` (-1: replicated) in `blocks` equal blocks.
  int Add(std::string name, std::vector<int64_t> full, int shard_dim, double std_dev,
          double value = 0, int blocks = 1, bool sp_grad = false);
  // An expert weight: this rank's `local` shard is cut from `full` viewed as `view`
  // (ExpertShard): experts along `expert_dim` split over EP, the expert FFN width along
  // `etp_dim` split over expert TP (-1: not split). With `owner` >= 0 (sequential experts) only
  // EP rank `owner` holds it.
  int AddExpert(std::string name, std::vector<int64_t> full, std::vector<int64_t> local,
                std::vector<int64_t> view, int expert_dim, int etp_dim, double std_dev,
                int owner = -1);
  void AddNorm(const std::string& name, int64_t size, int* w, int* b);
  // A present copy of the word embedding named `name`, whose gradient is summed with the first
  // stage's before the optimizer step (the tied output layer, an MTP stage's embedding); its index.
  int AddWordEmbeddingCopy(std::string name);
  // One transformer layer's parameters, named `pre`..., built as decoder layer `spec_layer`.
  LayerParams DeclareLayer(const search::SearchSpec& spec, const Runtime& rt,
                           const std::string& pre, int spec_layer);
  // engine/mtp_params.cc: the MTP layers (after the decoder, as GPTModel builds them) and the word
  // embedding they read on a stage other than the first (a copy summed with the first stage's, as
  // Megatron's embedding group with MTP).
  void DeclareMtp(const search::SearchSpec& spec, const Runtime& rt,
                  const std::vector<search::StageChunk>& chunks);
  void MtpEmbedding(const search::SearchSpec& spec, bool first_stage);

  int tp_ = 1;
  bool sp_ = false;
  int ep_rank_ = 0;
  bool layer_norm_ = true;
  bool mtp_held_ = false;  // this rank builds the MTP layers
};

}  // namespace remat::engine
