#include "search/mtp_model.h"

#include <algorithm>

#include "search/pipeline.h"
#include "search/pipeline_layout.h"

namespace remat::search {

int MtpInnerLayer(const SearchSpec& spec) { return std::max(0, spec.model.num_layers - 1); }

double MtpExtraParams(const SearchSpec& spec) {
  const ModelSpec& m = spec.model;
  const double h = m.hidden_size, t = std::max(1, spec.parallel.tensor_model_parallel_size);
  const double norm = (m.EffectiveNormalization() == Normalization::kLayerNorm ? 2 : 1) * h;
  return 3 * norm + 2 * h * h / t;
}

double MtpHeldBytes(const SearchSpec& spec, double final_norm, double logits, bool checkpointed) {
  const ModelSpec& m = spec.model;
  const double e = spec.train.precision == Precision::kFp32 ? 4 : 2;
  const double t = std::max(1, spec.parallel.tensor_model_parallel_size);
  const double tokens = static_cast<double>(m.seq_length) /
                        std::max(1, spec.parallel.context_parallel_size) *
                        spec.train.micro_batch_size;
  const bool sp = spec.parallel.sequence_parallel && t > 1;
  const double seq_tokens = sp ? tokens / t : tokens;
  const double h = m.hidden_size;
  const double stats = m.EffectiveNormalization() == Normalization::kLayerNorm ? 8 : 4;
  if (checkpointed) return 16 * tokens + 3 * e * seq_tokens * h + logits;
  // enorm's and hnorm's inputs (the shifted embedding, the hidden states handed on) and their
  // statistics, then the concatenation eh_proj saves (its input, sequence-sharded under SP).
  const double norms = 2 * e * seq_tokens * h + 2 * stats * seq_tokens;
  const double concat = 2 * e * seq_tokens * h;
  // The shifted token ids and labels (int64), then the head as the main model's.
  return 16 * tokens + norms + concat + final_norm + logits;
}

double MtpFlopsPerToken(const SearchSpec& spec) {
  const double h = spec.model.hidden_size;
  return 3.0 * 2.0 * MtpLayerCount(spec) * (3 * h + 2 * h * h);
}

std::string MtpEngineProblem(const SearchSpec& spec) {
  if (MtpLayerCount(spec) == 0) return "";
  const ParallelSpec& par = spec.parallel;
  if (par.context_parallel_size > 1) {
    return "model.mtp_num_layers: multi-token prediction with context_parallel_size > 1 is not "
           "run by the builtin engine (its MTP has no roll across CP ranks)";
  }
  const int pp = std::max(1, par.pipeline_model_parallel_size);
  if (pp > 1 && spec.model.position_embedding_type == PositionEmbedding::kLearnedAbsolute) {
    return "model.mtp_num_layers: multi-token prediction with learned_absolute positions and "
           "pipeline parallelism is not run by the builtin engine";
  }
  for (int r = 0; r < pp; ++r) {
    for (const StageChunk& c : ChunksOf(spec, r)) {
      if (c.mtp_layers > 0 && !c.has_loss) {
        return "parallel.pipeline_model_parallel_layout: MTP layers on a stage without the loss "
               "(L) are not run by the builtin engine; put m in the last stage";
      }
    }
  }
  return "";
}

}  // namespace remat::search
