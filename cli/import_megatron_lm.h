// `remat import megatron-lm -- ARGS ...`: Megatron-LM's command-line arguments (as given to
// pretrain_gpt.py) as a remat spec.
//
// Flags are Megatron-LM's (`--num-layers 80 --hidden-size 8192 --tensor-model-parallel-size 8
// --sequence-parallel ...`, `--flag=value` too); each maps to the TransformerConfig field remat
// reads under the same name, with Megatron-LM's own spellings and defaults where they differ
// from Megatron Core's: `--swiglu`, `--disable-bias-linear`, `--num-experts`,
// `--group-query-attention` (without it `--num-query-groups` has no effect), tied embeddings
// unless `--untie-embeddings-and-output-weights`, fp32 unless `--bf16`/`--fp16`,
// `attention_softmax_in_fp32` off unless given, `--num-layers-per-virtual-pipeline-stage`,
// `--decoder-first/last-pipeline-num-layers`. `remat_settings` ("section.key=value", e.g.
// parallel.data_parallel_size=8: Megatron-LM derives it from the world size) apply to the spec
// as they are. Every other flag is listed in a comment line; FP8 and CUDA graphs are carried
// as in cli/import_spec.h. Thread-safety: pure function.
#pragma once

#include <string>
#include <vector>

#include "search/status.h"

namespace remat::cli {

// The spec's YAML text. InvalidArgument naming the flag for a malformed argument, or the field
// when the result does not describe a model (e.g. "model.vocab_size: required ...").
search::StatusOr<std::string> ImportMegatronLm(const std::vector<std::string>& args,
                                               const std::vector<std::string>& remat_settings,
                                               const std::string& name);

}  // namespace remat::cli
