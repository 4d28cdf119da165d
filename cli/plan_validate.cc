#include "cli/plan_validate.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "search/planner.h"
#include "search/rules.h"
#include "search/units.h"
#include "specfile/spec_file.h"

namespace remat::cli {
namespace {

std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f", search::BytesToGib(bytes));
  return buf;
}

std::string Architecture(const search::SearchSpec& spec) {
  const auto& m = spec.model;
  std::string a = m.multi_latent_attention ? "MLA"
                  : m.EffectiveQueryGroups() < m.num_attention_heads ? "GQA"
                                                                     : "MHA";
  a += std::string(" (") + search::Name(m.attention_backend) + ")";
  if (m.IsMoe()) {
    a += ", MoE " + std::to_string(*m.num_moe_experts) + " experts top-" +
         std::to_string(m.moe_router_topk) + (m.moe_grouped_gemm ? " grouped" : " sequential");
    if (m.HasSharedExperts()) a += " + shared experts";
    a += ", " + std::to_string(m.NumMoeLayers()) + "/" + std::to_string(m.num_layers) +
         " MoE layers";
  } else {
    a += m.gated_linear_unit ? ", dense SwiGLU FFN" : ", dense FFN";
  }
  return a;
}

}  // namespace

int RunPlan(const std::string& spec_path, bool json, std::ostream& out, std::ostream& err) {
  auto spec = spec::LoadSpecFile(spec_path);
  if (!spec.ok()) {
    err << "error: " << spec.status().message() << "\n";
    return 2;
  }
  auto control = search::ValidatePolicy(*spec, search::Policy::None());
  if (!control.ok()) {
    err << "error: no recompute policy is valid for this spec: " << control.message() << "\n";
    return 2;
  }
  const auto plan = search::InitialPlan(*spec);
  const uint64_t budget = spec->search.MemoryBudgetBytes();
  if (json) {
    nlohmann::json j;
    j["name"] = spec->name;
    j["strategy"] = search::Name(spec->search.strategy);
    j["memory_budget_bytes"] = budget;
    j["candidates"] = nlohmann::json::array();
    for (const auto& c : plan) {
      j["candidates"].push_back({
          {"policy", c.policy.ToString()},
          {"reason", c.reason},
          {"predicted_peak_bytes", static_cast<uint64_t>(c.estimate.peak_bytes)},
          {"predicted_activation_bytes", static_cast<uint64_t>(c.estimate.activation_bytes)},
          {"predicted_static_bytes", static_cast<uint64_t>(c.estimate.static_bytes)},
          {"predicted_recompute_flops", c.estimate.recompute_flops},
          {"predicted_fits", c.estimate.peak_bytes <= static_cast<double>(budget)},
      });
    }
    out << j.dump(2) << "\n";
    return 0;
  }
  const auto& est = plan.front().estimate;
  out << "plan for " << spec->name << ": " << Architecture(*spec) << ", "
      << spec->model.num_layers << " layers, seq " << spec->model.seq_length << ", TP "
      << spec->parallel.tensor_model_parallel_size << " PP "
      << spec->parallel.pipeline_model_parallel_size << " DP "
      << spec->parallel.data_parallel_size << "\n";
  out << "static (weights, grads, optimizer): " << Gib(est.static_bytes)
      << " GiB per rank; budget " << Gib(budget) << " GiB ("
      << search::Name(spec->search.memory_metric) << ")\n\n";
  char line[256];
  std::snprintf(line, sizeof(line), "%-3s %-34s %12s %12s %6s  %s\n", "#", "policy",
                "activ. GiB", "peak GiB", "fits", "reason");
  out << line;
  int i = 0;
  for (const auto& c : plan) {
    std::snprintf(line, sizeof(line), "%-3d %-34s %12s %12s %6s  ", ++i,
                  c.policy.ToString().c_str(), Gib(c.estimate.activation_bytes).c_str(),
                  Gib(c.estimate.peak_bytes).c_str(),
                  c.estimate.peak_bytes <= static_cast<double>(budget) ? "yes" : "no");
    out << line << c.reason << "\n";
  }
  out << "\nPredictions come from the analytic model (docs/memory-model.md); the search measures."
      << "\nAfter these, the guided search changes one label at a time from frontier points.\n";
  return 0;
}

int RunValidate(const std::string& spec_path, const std::string& policy_text, std::ostream& out,
                std::ostream& err) {
  auto spec = spec::LoadSpecFile(spec_path);
  if (!spec.ok()) {
    err << "error: " << spec.status().message() << "\n";
    return 2;
  }
  auto policy = search::ParsePolicy(policy_text);
  if (!policy.ok()) {
    err << "error: --policy: " << policy.status().message() << "\n";
    return 2;
  }
  auto status = search::ValidatePolicy(*spec, *policy);
  if (!status.ok()) {
    err << "error: " << policy->ToString() << " is not valid for " << spec->name << ": "
        << status.message() << "\n";
    return 2;
  }
  out << "valid: " << policy->ToString() << "\n";
  out << "  Megatron Bridge: " << policy->MegatronBridgeOverrides() << "\n";
  const std::string flags = policy->MegatronLmFlags();
  out << "  Megatron-LM:     " << (flags.empty() ? "(no recompute flags)" : flags) << "\n";
  return 0;
}

}  // namespace remat::cli
