#include "cli/plan_validate.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "search/capacity.h"
#include "search/noise.h"
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

// With pipeline stages: one row per stage, one column per candidate (the numbers of the table
// above), each cell the stage's activation at its peak / its peak, in GiB. The row's own columns
// say how many layers the stage has and how many micro-batches its schedule holds at the peak.
void PrintStages(const std::vector<search::Candidate>& plan, std::ostream& out) {
  out << "\nper pipeline stage: activation / peak GiB under candidate #; 'in flight': micro-batches"
         "\n(chunk-forwards when interleaved) the schedule holds at the stage's peak\n";
  char cell[64];
  std::snprintf(cell, sizeof(cell), "%-6s %6s %9s", "stage", "layers", "in flight");
  out << cell;
  for (size_t i = 0; i < plan.size(); ++i) {
    std::snprintf(cell, sizeof(cell), " %15s", ("#" + std::to_string(i + 1)).c_str());
    out << cell;
  }
  out << "\n";
  const auto& stages = plan.front().estimate.stages;
  for (size_t p = 0; p < stages.size(); ++p) {
    std::snprintf(cell, sizeof(cell), "%-6zu %6d %9d", p, stages[p].layers, stages[p].in_flight);
    out << cell;
    for (const auto& c : plan) {
      const auto& st = c.estimate.stages.at(p);
      const std::string v = Gib(st.activation_bytes) + "/" + Gib(st.peak_bytes) +
                            (static_cast<int>(p) == c.estimate.peak_stage ? "*" : " ");
      std::snprintf(cell, sizeof(cell), " %15s", v.c_str());
      out << cell;
    }
    out << "\n";
  }
  out << "(* the stage with the highest peak: it decides the fit)\n";
}

// A policy's prediction as the plan JSON gives it: the whole layout's figures (those of the
// stage with the highest peak) and every stage's.
nlohmann::json PredictionJson(const search::MemoryEstimate& e, uint64_t budget) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& st : e.stages) {
    stages.push_back({
        {"stage", st.stage},
        {"predicted_activation_bytes", static_cast<uint64_t>(st.activation_bytes)},
        {"predicted_peak_bytes", static_cast<uint64_t>(st.peak_bytes)},
        {"predicted_static_bytes", static_cast<uint64_t>(st.static_bytes)},
        {"layers", st.layers},
        {"in_flight_microbatches", st.in_flight},
    });
  }
  return {
      {"predicted_peak_bytes", static_cast<uint64_t>(e.peak_bytes)},
      {"predicted_activation_bytes", static_cast<uint64_t>(e.activation_bytes)},
      {"predicted_static_bytes", static_cast<uint64_t>(e.static_bytes)},
      {"predicted_recompute_flops", e.recompute_flops},
      {"predicted_fits", e.peak_bytes <= static_cast<double>(budget)},
      {"peak_stage", e.peak_stage},
      {"stages", std::move(stages)},
  };
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
  const auto capacity = search::StaticCapacityProblem(*spec);
  const std::string builtin_problem = spec->search.backend == search::Backend::kBuiltin
                                          ? search::BuiltinBackendProblem(*spec)
                                          : std::string();
  const std::string routing = search::RoutingNoiseCaution(*spec);
  if (json) {
    nlohmann::json j;
    j["name"] = spec->name;
    if (capacity) {  // first: what recompute cannot fix
      nlohmann::json levers = nlohmann::json::array();
      for (const auto& l : capacity->levers) {
        levers.push_back({{"setting", l.setting},
                          {"predicted_static_bytes", static_cast<uint64_t>(l.static_bytes)},
                          {"static_fits", l.fits},
                          {"note", l.note}});
      }
      j["capacity"] = {{"static_exceeds_budget", true},
                       {"predicted_static_bytes", static_cast<uint64_t>(capacity->static_bytes)},
                       {"stage", capacity->stage},
                       {"memory_budget_bytes", budget},
                       {"message", capacity->message},
                       {"levers", std::move(levers)}};
    }
    if (!builtin_problem.empty()) j["builtin_backend_problem"] = builtin_problem;
    if (!routing.empty()) j["measurement_caution"] = routing;
    j["strategy"] = search::Name(spec->search.strategy);
    j["memory_budget_bytes"] = budget;
    j["candidates"] = nlohmann::json::array();
    j["num_microbatches"] = spec->NumMicrobatches();
    for (const auto& c : plan) {
      nlohmann::json candidate = {{"policy", c.policy.ToString()}, {"reason", c.reason}};
      candidate.update(PredictionJson(c.estimate, budget));
      j["candidates"].push_back(std::move(candidate));
    }
    out << j.dump(2) << "\n";
    return 0;
  }
  const auto& est = plan.front().estimate;
  const auto& par = spec->parallel;
  out << "plan for " << spec->name << ": " << Architecture(*spec) << ", " << spec->model.num_layers
      << " layers, seq " << spec->model.seq_length << ", TP " << par.tensor_model_parallel_size;
  if (par.context_parallel_size > 1) out << " CP " << par.context_parallel_size;
  out << " PP " << par.pipeline_model_parallel_size;
  if (par.VirtualChunks() > 1) out << " (VPP " << par.VirtualChunks() << ")";
  if (!par.pipeline_model_parallel_layout.empty()) {
    out << " layout \"" << par.pipeline_model_parallel_layout << "\"";
  }
  if (spec->model.mtp_num_layers.value_or(0) > 0) {
    out << " MTP " << *spec->model.mtp_num_layers;
  }
  if (par.expert_model_parallel_size > 1) out << " EP " << par.expert_model_parallel_size;
  out << " DP " << par.data_parallel_size << ", " << spec->NumMicrobatches()
      << (spec->NumMicrobatches() == 1 ? " micro-batch" : " micro-batches") << " per step\n";
  out << "static (weights, grads, optimizer): " << Gib(est.static_bytes) << " GiB per rank";
  if (est.stages.size() > 1) out << " on stage " << est.peak_stage << " (the highest peak)";
  out << "; budget " << Gib(budget) << " GiB (" << search::Name(spec->search.memory_metric)
      << ")\n";
  if (!builtin_problem.empty()) {
    out << "note: the builtin backend will refuse to search this spec: " << builtin_problem << "\n";
  }
  if (!routing.empty()) out << "note: measurement: " << routing << "\n";
  out << "\n";
  if (capacity) {
    // Every policy would be listed as not fitting: say why instead, and what can fix it.
    for (const std::string& line : search::CapacityLines(*capacity)) out << line << "\n";
    out << "\n(the candidates, none of which can fit: remat plan --json)\n";
    return 0;
  }
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
  if (est.stages.size() > 1) PrintStages(plan, out);
  out << "\nPredictions come from the analytic model (docs/memory-model.md); the search measures."
      << "\nAfter these, the guided search changes one label at a time from frontier points.\n";
  return 0;
}

int RunValidate(const std::string& spec_path, const std::string& policy_text, bool json,
                std::ostream& out, std::ostream& err) {
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
  const std::vector<std::string> warnings = search::PolicyWarnings(*spec, *policy);
  const std::string builtin_problem = spec->search.backend == search::Backend::kBuiltin
                                          ? search::BuiltinBackendProblem(*spec)
                                          : std::string();
  if (json) {
    const uint64_t budget = spec->search.MemoryBudgetBytes();
    nlohmann::json j = {{"name", spec->name},
                        {"policy", policy->ToString()},
                        {"valid", true},
                        {"warnings", warnings},
                        {"memory_budget_bytes", budget}};
    if (!builtin_problem.empty()) j["builtin_backend_problem"] = builtin_problem;
    j.update(PredictionJson(search::EstimateMemory(*spec, *policy), budget));
    j["apply"] = {{"megatron_bridge", policy->MegatronBridgeOverrides()},
                  {"megatron_lm", policy->MegatronLmFlags()},
                  {"megatron_lm_remove", policy->MegatronLmFlagsToRemove()}};
    out << j.dump(2) << "\n";
    return 0;
  }
  out << "valid: " << policy->ToString() << "\n";
  for (const std::string& w : warnings) err << "warning: " << w << "\n";
  if (!builtin_problem.empty()) {
    err << "note: the builtin backend will refuse this spec: " << builtin_problem << "\n";
  }
  out << "  Megatron Bridge: " << policy->MegatronBridgeOverrides() << "\n";
  const std::string flags = policy->MegatronLmFlags();
  out << "  Megatron-LM:     " << (flags.empty() ? "(no recompute flags)" : flags) << "\n";
  out << "    after removing " << policy->MegatronLmFlagsToRemove() << " (with their values)\n";
  return 0;
}

}  // namespace remat::cli
