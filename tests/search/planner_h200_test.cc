// The guided strategy on real measurements: the exhaustive H200 searches of docs/results.md,
// replayed. Every policy the guided search proposes is answered from the measured table, so the
// figures here are what the guided search would have found on that GPU. Two runs on different
// days' machines (tables `h200-MODEL-exhaustive-table.json` and `...-table-r2.json`): the strategy
// must hold on both, which keeps it from being tuned to one run's noise.
#include <gtest/gtest.h>

#include <cstdio>

#include "search/frontier.h"
#include "search/planner.h"
#include "search/rules.h"
#include "specfile/spec_file.h"

namespace remat::search {
namespace {

struct Outcome {
  size_t guided_trials = 0, exhaustive_trials = 0;
  double hypervolume_ratio = 0;
};

// `run` is "" for the first run's table, "-r2" for the second's.
Outcome Evaluate(const std::string& name, const std::string& run = "") {
  const std::string spec_path = std::string(REMAT_SOURCE_DIR) + "/examples/replay/h200-" + name + ".yaml";
  auto spec = spec::LoadSpecFile(spec_path);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  const std::string table_path = std::string(REMAT_SOURCE_DIR) + "/docs/results/h200-" + name +
                                 "-exhaustive-table" + run + ".json";
  auto table = spec::LoadReplayTableFile(table_path);
  EXPECT_TRUE(table.ok()) << table.status().message();
  auto answer = [&](const Policy& p) {
    TrialResult r;
    auto it = table->find(p.ToString());
    if (it == table->end()) {
      r.policy = p;
      r.status = TrialStatus::kFailed;
      r.message = "not in replay table";
      return r;
    }
    r = it->second.result;
    r.tokens_per_s = TokensPerSecond(*spec, r.step_time_s);
    return r;
  };
  auto strategy = MakeGuidedStrategy(*spec);
  std::vector<TrialResult> guided;
  for (int guard = 0; guard < 200 && !strategy->Done(); ++guard) {
    for (const auto& c : strategy->Propose(1)) {
      guided.push_back(answer(c.policy));
      strategy->Observe(guided.back());
    }
  }
  std::vector<TrialResult> all;
  for (const auto& p : EnumerateValidPolicies(*spec)) all.push_back(answer(p));
  const uint64_t budget = spec->search.MemoryBudgetBytes();
  const auto fe = ComputeFrontier(all, spec->search.memory_metric, budget);
  const auto fg = ComputeFrontier(guided, spec->search.memory_metric, budget);
  double t_min = 1e300;
  for (const auto& p : fe) t_min = std::min(t_min, p.tokens_per_s);
  Outcome o;
  o.guided_trials = guided.size();
  o.exhaustive_trials = all.size();
  o.hypervolume_ratio = Hypervolume(fg, budget, 0.9 * t_min) / Hypervolume(fe, budget, 0.9 * t_min);
  std::printf("%s%s: guided %zu trials, exhaustive %zu (ratio %.3f); hypervolume %.4f\n",
              name.c_str(), run.c_str(), o.guided_trials, o.exhaustive_trials,
              double(o.guided_trials) / o.exhaustive_trials, o.hypervolume_ratio);
  std::printf("  guided order:");
  for (const auto& r : guided) std::printf(" %s", r.policy.ToString().c_str());
  std::printf("\n");
  return o;
}

// Issue 5's goal is 0.95 of the hypervolume for a quarter of the trials. The hypervolume part
// holds on five of these six tables (not on the second MoE run, below); the trial count reaches a
// quarter on the second MLA run only, and cannot on the dense model, whose contract-mandated
// initial plan alone is 6 of its 24 policies (docs/results.md). These bounds keep the strategy
// from sliding back.
void ExpectEfficient(const Outcome& o, double max_trial_ratio, double min_hypervolume = 0.95) {
  EXPECT_GE(o.hypervolume_ratio, min_hypervolume);
  EXPECT_LE(static_cast<double>(o.guided_trials) / o.exhaustive_trials, max_trial_ratio);
}

TEST(PlannerOnH200Measurements, Dense) { ExpectEfficient(Evaluate("dense"), 0.5); }
TEST(PlannerOnH200Measurements, Moe) { ExpectEfficient(Evaluate("moe"), 0.45); }
TEST(PlannerOnH200Measurements, Mla) { ExpectEfficient(Evaluate("mla"), 0.3); }
TEST(PlannerOnH200Measurements, DenseSecondRun) { ExpectEfficient(Evaluate("dense", "-r2"), 0.5); }
// A known miss (docs/results.md): in this run the MoE step times scatter by up to 20% between
// policies that differ by one recomputed layer (routing of random tokens, 3 measured steps), and
// the exhaustive frontier holds full:block:5 at 1.2 GiB under what the model predicts for it; the
// guided search does not try it and keeps 0.85 of the hypervolume. The bound keeps it from falling.
TEST(PlannerOnH200Measurements, MoeSecondRun) { ExpectEfficient(Evaluate("moe", "-r2"), 0.45, 0.85); }
TEST(PlannerOnH200Measurements, MlaSecondRun) { ExpectEfficient(Evaluate("mla", "-r2"), 0.25); }

}  // namespace
}  // namespace remat::search
