// remat-bench-estimate --spec FILE.yaml [--policies P1;P2;...] : the search core's memory model for
// a spec, as one JSON object: every valid policy (with its apply strings), each layer's activation
// bytes under no recompute (search::EstimateLayerActivations) and, per requested policy,
// search::EstimateMemory with its per-pipeline-stage figures (`stages`).

#include <iostream>

#include <nlohmann/json.hpp>

#include "bench/engine/bench_args.h"
#include "search/memory_model.h"
#include "search/rules.h"

int main(int argc, char** argv) {
  auto args = remat::bench::ParseBenchArgs(
      argc, argv, "remat-bench-estimate --spec FILE.yaml [--policies 'P1;P2']",
      /*policies_required=*/false);
  if (!args) return 2;
  const remat::search::SearchSpec& spec = args->spec;
  nlohmann::json out;
  out["valid_policies"] = nlohmann::json::array();
  // The settings `remat validate` and a search's recommendation print for each valid policy
  // (search/policy.cc, their one home): bench/gpu/check_apply_strings.py applies them to Megatron
  // Core's TransformerConfig.
  out["apply"] = nlohmann::json::object();
  for (const auto& p : remat::search::EnumerateValidPolicies(spec)) {
    out["valid_policies"].push_back(p.ToString());
    out["apply"][p.ToString()] = {{"megatron_bridge", p.MegatronBridgeOverrides()},
                                  {"megatron_lm", p.MegatronLmFlags()},
                                  {"megatron_lm_remove", p.MegatronLmFlagsToRemove()}};
  }
  out["layers"] = nlohmann::json::array();
  for (int i = 0; i < spec.model.num_layers; ++i) {
    out["layers"].push_back(remat::search::EstimateLayerActivations(spec, i).Total());
  }
  out["estimates"] = nlohmann::json::object();
  for (const remat::search::Policy& policy : args->policies) {
    const auto e = remat::search::EstimateMemory(spec, policy);
    nlohmann::json stages = nlohmann::json::array();
    for (const remat::search::StageMemory& st : e.stages) {
      stages.push_back({{"stage", st.stage},
                        {"layers", st.layers},
                        {"static_bytes", st.static_bytes},
                        {"activation_bytes", st.activation_bytes},
                        {"in_flight", st.in_flight},
                        {"transient_bytes", st.transient_bytes},
                        {"peak_bytes", st.peak_bytes}});
    }
    out["estimates"][policy.ToString()] = {{"static_bytes", e.static_bytes},
                                           {"activation_bytes", e.activation_bytes},
                                           {"layer_activation_bytes", e.layer_activation_bytes},
                                           {"transient_bytes", e.transient_bytes},
                                           {"peak_bytes", e.peak_bytes},
                                           {"stages", stages}};
  }
  std::cout << out.dump() << std::endl;
  return 0;
}
