// Megatron Core's recompute validation rules, and which labels have an effect on a model.
//
// A policy is valid for a spec when Megatron Core's TransformerConfig.__post_init__ would accept
// it (NVIDIA/Megatron-LM megatron/core/transformer/transformer_config.py@d98e8a6, TransformerConfig.__post_init__) and every label in it changes something on
// this model (a label with no effect is refused, so no strategy wastes a trial on it).
// Thread-safety: pure functions.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "search/policy.h"
#include "search/spec.h"
#include "search/status.h"

namespace remat::search {

// Ok, or InvalidArgument whose message says what is wrong and why, in Megatron's terms
// (e.g. "moe_act in recompute_modules is only supported with moe_grouped_gemm").
Status ValidatePolicy(const SearchSpec& spec, const Policy& policy);

// Empty when `label` has an effect on this model; otherwise why it has none or is refused.
std::string LabelProblem(const SearchSpec& spec, Label label);

// Why a valid policy may be pointless on this spec (the decision guide's cautions: core_attn
// under flash attention, labels nested in moe, mlp on MoE layers, checkpoints inside CUDA
// graphs), one sentence each; empty when none applies. `remat validate` prints them as warnings.
std::vector<std::string> PolicyWarnings(const SearchSpec& spec, const Policy& policy);

// The labels that are valid alone on this model, canonical order.
std::vector<Label> ValidLabels(const SearchSpec& spec);

// The bound of full:*:N: the most layers of one model chunk (a pipeline stage, or one of its
// virtual chunks under interleaving), and at most num_layers / pipeline_model_parallel_size
// (Megatron's own check).
int LayersPerStage(const SearchSpec& spec);

// Every valid policy: all subsets of ValidLabels that pass ValidatePolicy, then full:uniform:N
// and full:block:N for N in [1, LayersPerStage]. Deterministic order.
std::vector<Policy> EnumerateValidPolicies(const SearchSpec& spec);

// ---- The recompute fields of a training configuration (the apply strings' target)

// What a configuration says about recompute, as Megatron Core's TransformerConfig holds it
// (nullopt = null/unset), plus Megatron-LM's --recompute-activations switch.
struct RecomputeFields {
  std::optional<std::string> granularity;  // "full" | "selective" | anything a user wrote
  std::optional<std::string> method;       // "uniform" | "block"
  std::optional<int> num_layers;
  std::optional<std::vector<std::string>> modules;
  bool recompute_activations = false;  // Megatron-LM only: means granularity selective
  bool distribute_saved_activations = false;
};

// The fields a policy sets (modules null under full: Megatron Core ignores them there).
RecomputeFields FieldsOf(const Policy& policy);

// Ok, or InvalidArgument with the complaint, for the recompute rules that concern these fields
// alone (TransformerConfig.__post_init__'s recompute_modules checks and its label list; the rules
// that depend on the model are ValidatePolicy's): granularity full or selective; method uniform
// or block; full needs a method and recompute_num_layers; selective refuses recompute_num_layers;
// selective labels from Megatron Core's set. With `megatron_lm`, also Megatron-LM's own
// arguments.py rules (3.5): selective refuses a recompute method, and distribute_saved_activations
// needs full with a method.
Status CheckRecomputeFields(const RecomputeFields& fields, bool megatron_lm);

// `fields` after Megatron Bridge Hydra overrides ("model.recompute_granularity=full ...": words
// separated by spaces, values `null`, a word or a `[a,b]` list) as Bridge applies them to a
// recipe. Keys other than model.recompute_* and model.distribute_saved_activations are refused.
StatusOr<RecomputeFields> ApplyBridgeOverrides(RecomputeFields fields,
                                               const std::string& overrides);

// The fields a Megatron-LM command line sets (argparse: a repeated flag's last value wins;
// --recompute-modules takes the words up to the next flag). Other flags are skipped.
StatusOr<RecomputeFields> MegatronLmRecomputeFields(const std::vector<std::string>& args);

// `args` without the flags named in `flags` (space-separated, as MegatronLmFlagsToRemove
// gives them) and their values, then the words of `add` appended: a command line edited as
// the apply strings say.
std::vector<std::string> EditMegatronLmArgs(const std::vector<std::string>& args,
                                            const std::string& remove, const std::string& add);

}  // namespace remat::search
