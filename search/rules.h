// Megatron Core's recompute validation rules, and which labels have an effect on a model.
//
// A policy is valid for a spec when Megatron Core's TransformerConfig.__post_init__ would accept
// it (reference: recompute-semantics.md section 3.3) and every label in it changes something on
// this model (a label with no effect is refused, so no strategy wastes a trial on it).
// Thread-safety: pure functions.
#pragma once

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

// The labels that are valid alone on this model, canonical order.
std::vector<Label> ValidLabels(const SearchSpec& spec);

// The bound of full:*:N: the most layers of one model chunk (a pipeline stage, or one of its
// virtual chunks under interleaving), and at most num_layers / pipeline_model_parallel_size
// (Megatron's own check).
int LayersPerStage(const SearchSpec& spec);

// Every valid policy: all subsets of ValidLabels that pass ValidatePolicy, then full:uniform:N
// and full:block:N for N in [1, LayersPerStage]. Deterministic order.
std::vector<Policy> EnumerateValidPolicies(const SearchSpec& spec);

}  // namespace remat::search
