// Megatron's explicit pipeline layout (parallel.pipeline_model_parallel_layout): a string such as
// "Et|(tt|)*30mL" that says what each of the PP x VPP pipeline stages builds.
//
// The grammar is Megatron Core's (megatron/core/transformer/pipeline_parallel_layer_layout.py at
// d98e8a6, PipelineParallelLayerLayout.parse_str_to_list): commas are cosmetic and dropped; then
// every "(X)*N" whose X holds no ')' is replaced by N copies of X, left to right, without
// rescanning what a replacement wrote; then every "c*N" by N copies of the character c; then the
// text is split at '|' into stages, whose characters are E (the embedding), t (a transformer,
// "decoder", layer), m (a multi-token-prediction layer) and L (the loss). Stage k of the list is
// virtual chunk k / PP of pipeline rank k % PP (chunk-major, as Megatron lays chunks out).
//
// Megatron's rules (validate_layer_layout and TransformerConfig.__post_init__ at d98e8a6): the
// stage count is a multiple of PP and gives VPP; E is the first item and L the last, each once;
// the t count equals num_layers and the m count mtp_num_layers; no t after the first m; every m
// sits in the last chunk of its rank, all in one stage, never on the first rank; and the layout
// cannot be combined with num_layers_in_{first,last}_pipeline_stage or
// account_for_{embedding,loss}_in_pipeline_split. remat adds one rule of its own: Megatron builds
// the embedding on the first stage and the loss on the last whatever the layout says, so E must
// be in stage 0 and L in the last stage (a layout that says otherwise would describe a model
// Megatron does not build).
//
// Thread-safety: pure functions; LayoutOf keeps parsed layouts in a mutex-guarded cache.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "search/spec.h"
#include "search/status.h"

namespace remat::search {

// What one stage (one chunk of one rank) of a layout builds.
struct LayoutStage {
  int decoder = 0;         // transformer layers (t)
  int mtp = 0;             // multi-token-prediction layers (m)
  bool embedding = false;  // E
  bool loss = false;       // L
};

// A parsed layout: `stages` in the string's order (chunk-major), PP x VPP of them.
struct PipelineLayout {
  int pp = 1;
  int vpp = 1;
  std::vector<LayoutStage> stages;
  std::vector<int> decoder_offset;  // per stage: t's in the stages before it

  const LayoutStage& At(int pp_rank, int chunk) const { return stages[chunk * pp + pp_rank]; }
  int FirstLayer(int pp_rank, int chunk) const { return decoder_offset[chunk * pp + pp_rank]; }
};

// The stages of `text` as item strings (each character one of E, t, m, L), after the unrolling
// above. InvalidArgument naming parallel.pipeline_model_parallel_layout on an unknown character,
// an empty layout or one that unrolls to more than a million items.
StatusOr<std::vector<std::string>> UnrollLayout(const std::string& text);

// The number of stages `text` has (PP x VPP); the errors of UnrollLayout.
StatusOr<int> LayoutStageCount(const std::string& text);

// Every rule above for the spec's layout (Ok when it has none). InvalidArgument whose message
// starts with the offending field.
Status ValidateLayoutField(const SearchSpec& spec);

// The spec's parsed layout, or nullptr when it has none or its layout does not parse to PP x VPP
// stages (ValidateLayoutField says why). Parsed once per (text, PP) and kept.
std::shared_ptr<const PipelineLayout> LayoutOf(const SearchSpec& spec);

// Multi-token-prediction layers of the spec (mtp_num_layers, 0 when null).
int MtpLayerCount(const SearchSpec& spec);

}  // namespace remat::search
