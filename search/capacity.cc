#include "search/capacity.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "search/memory_model.h"
#include "search/policy.h"

namespace remat::search {
namespace {

std::string Gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f GiB", BytesToGib(bytes));
  return buf;
}

// Static memory per rank on the stage that holds the most, and that stage. The control's
// estimate serves: no policy changes static memory.
std::pair<double, int> WorstStatic(const SearchSpec& spec) {
  const MemoryEstimate est = EstimateMemory(spec, Policy::None());
  double worst = est.static_bytes;
  int stage = est.peak_stage;
  for (const StageMemory& s : est.stages) {
    if (s.static_bytes > worst) {
      worst = s.static_bytes;
      stage = s.stage;
    }
  }
  return {worst, stage};
}

}  // namespace

std::optional<CapacityFinding> StaticCapacityProblem(const SearchSpec& spec) {
  const uint64_t budget = spec.search.MemoryBudgetBytes();
  // Not a structured binding: the lambdas below capture it (C++17, and clang 14, forbid that).
  const std::pair<double, int> worst = WorstStatic(spec);
  const double static_bytes = worst.first;
  const int stage = worst.second;
  if (static_bytes <= static_cast<double>(budget)) return std::nullopt;
  CapacityFinding f;
  f.static_bytes = static_bytes;
  f.stage = stage;
  f.budget_bytes = budget;
  f.message = "static memory alone (weights, gradients, optimizer state) is " +
              Gib(static_bytes) + " per rank" +
              (spec.parallel.pipeline_model_parallel_size > 1
                   ? " on pipeline stage " + std::to_string(stage)
                   : std::string()) +
              ", over the budget of " + Gib(budget) +
              ": no recompute policy can fit, since recompute frees activations only";

  const ParallelSpec& p = spec.parallel;
  auto world = [](const SearchSpec& s) { return std::to_string(s.parallel.WorldSize()); };
  auto consider = [&](const std::string& setting, const std::function<void(SearchSpec&)>& change,
                      bool grows_world) {
    SearchSpec changed = spec;
    change(changed);
    if (!ValidateSpec(changed).ok()) return;
    const double bytes = WorstStatic(changed).first;
    if (!(bytes < static_bytes)) return;
    CapacityLever l;
    l.setting = setting;
    l.static_bytes = bytes;
    l.fits = bytes < static_cast<double>(budget);
    if (grows_world) l.note = "world size " + world(spec) + " -> " + world(changed);
    f.levers.push_back(std::move(l));
  };
  const bool dist = spec.train.use_distributed_optimizer;
  if (!dist) {
    consider("train.use_distributed_optimizer: true",
             [](SearchSpec& s) { s.train.use_distributed_optimizer = true; }, false);
  }
  consider(std::string("parallel.data_parallel_size: ") + std::to_string(2 * p.data_parallel_size) +
               (dist ? "" : " with train.use_distributed_optimizer: true"),
           [](SearchSpec& s) {
             s.parallel.data_parallel_size *= 2;
             s.train.use_distributed_optimizer = true;
             if (s.train.global_batch_size) *s.train.global_batch_size *= 2;  // same micro-batches
           },
           true);
  // MoE under TP needs sequence parallelism (Megatron's MoELayer): the lever turns it on.
  const bool needs_sp = spec.model.IsMoe() && !p.sequence_parallel;
  consider("parallel.tensor_model_parallel_size: " + std::to_string(2 * p.tensor_model_parallel_size) +
               (needs_sp ? " with parallel.sequence_parallel: true" : ""),
           [needs_sp](SearchSpec& s) {
             s.parallel.tensor_model_parallel_size *= 2;
             if (needs_sp) s.parallel.sequence_parallel = true;
           },
           true);
  consider("parallel.pipeline_model_parallel_size: " +
               std::to_string(2 * p.pipeline_model_parallel_size),
           [](SearchSpec& s) {
             s.parallel.pipeline_model_parallel_size *= 2;
             s.parallel.num_layers_in_first_pipeline_stage.reset();
             s.parallel.num_layers_in_last_pipeline_stage.reset();
           },
           true);
  if (spec.model.IsMoe()) {
    consider("parallel.expert_model_parallel_size: " +
                 std::to_string(2 * p.expert_model_parallel_size),
             [](SearchSpec& s) { s.parallel.expert_model_parallel_size *= 2; }, false);
  }
  std::stable_sort(f.levers.begin(), f.levers.end(),
                   [](const CapacityLever& a, const CapacityLever& b) {
                     return a.static_bytes < b.static_bytes;
                   });
  return f;
}

std::vector<std::string> CapacityLines(const CapacityFinding& f) {
  std::vector<std::string> out = {f.message};
  if (f.levers.empty()) {
    out.push_back("no single setting remat can try lowers it; more GPUs per model copy, "
                  "smaller optimizer state or a smaller model are left");
    return out;
  }
  out.push_back("settings that lower static memory per rank (the model's prediction):");
  for (const CapacityLever& l : f.levers) {
    out.push_back("  " + l.setting + " -> static " + Gib(l.static_bytes) +
                  (l.fits ? " (leaves " + Gib(f.budget_bytes - l.static_bytes) +
                                " for activations)"
                          : " (still over)") +
                  (l.note.empty() ? "" : "; " + l.note));
  }
  return out;
}

}  // namespace remat::search
