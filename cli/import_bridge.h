// `remat import bridge FILE [KEY=VALUE ...]`: a Megatron Bridge ConfigContainer, as Bridge
// writes it to YAML (`_target_` keys included), plus Hydra-style overrides, as a remat spec.
//
// Where Bridge keeps what remat reads: the architecture and the parallel layout under `model.*`
// (TransformerConfig names, the same as remat's), the sequence length under
// `dataset.sequence_length`, the batch under `train.*`, the precision in `mixed_precision` or
// `model.bf16`/`fp16`, the distributed optimizer under `optimizer.`/`ddp.`, the seed under
// `rng.seed`. Overrides `a.b=VALUE` (a leading `+`/`++` accepted, `~a.b` deletes) apply to the
// ConfigContainer before it is read, VALUE parsed as YAML (`[core_attn]`, `null`, `4`);
// `parallel.*` and `search.*` keys, which Bridge has not (e.g. parallel.data_parallel_size: Bridge
// derives it from the world size), apply to the remat spec. Every other field is listed in a
// comment line saying why it was not carried; fields that matter to memory and that remat does
// not model (FP8, CUDA graphs) are carried as spec fields where the spec has them (see
// cli/import_spec.h), otherwise as comments.
// Thread-safety: pure function.
#pragma once

#include <string>
#include <vector>

#include "search/status.h"

namespace remat::cli {

// The spec's YAML text. InvalidArgument naming the field when the input is not YAML, an
// override is malformed, or the result does not describe a model (e.g. model.vocab_size null
// and no tokenizer.vocab_size: "model.vocab_size: required ...").
search::StatusOr<std::string> ImportBridge(const std::string& yaml_text,
                                           const std::vector<std::string>& overrides,
                                           const std::string& name);

}  // namespace remat::cli
