// The guided strategy on real measurements: the exhaustive H200 searches of docs/results.md,
// replayed. Every policy the guided search proposes is answered from the measured table, so the
// figures here are what the guided search would have found on that GPU.
#include <gtest/gtest.h>

#include <cstdio>

#include "search/frontier.h"
#include "search/planner.h"
#include "search/rules.h"
#include "spec/spec_file.h"

namespace remat::search {
namespace {

struct Outcome {
  size_t guided_trials = 0, exhaustive_trials = 0;
  double hypervolume_ratio = 0;
};

Outcome Evaluate(const std::string& name) {
  const std::string spec_path = std::string(REMAT_SOURCE_DIR) + "/examples/replay/h200-" + name + ".yaml";
  auto spec = spec::LoadSpecFile(spec_path);
  EXPECT_TRUE(spec.ok()) << spec.status().message();
  auto table = spec::LoadReplayTableFile(spec->search.replay_table);
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
  std::printf("%s: guided %zu trials, exhaustive %zu (ratio %.3f); hypervolume %.4f\n",
              name.c_str(), o.guided_trials, o.exhaustive_trials,
              double(o.guided_trials) / o.exhaustive_trials, o.hypervolume_ratio);
  std::printf("  guided order:");
  for (const auto& r : guided) std::printf(" %s", r.policy.ToString().c_str());
  std::printf("\n");
  return o;
}

// Issue 5's goal is 0.95 of the hypervolume for a quarter of the trials. The hypervolume part
// holds on these measurements; the trial count cannot reach a quarter on the dense model, whose
// contract-mandated initial plan alone is 6 of its 24 policies (docs/results.md). These bounds
// keep the strategy from sliding back.
void ExpectEfficient(const Outcome& o, double max_trial_ratio) {
  EXPECT_GE(o.hypervolume_ratio, 0.95);
  EXPECT_LE(static_cast<double>(o.guided_trials) / o.exhaustive_trials, max_trial_ratio);
}

TEST(PlannerOnH200Measurements, Dense) { ExpectEfficient(Evaluate("dense"), 0.5); }
TEST(PlannerOnH200Measurements, Moe) { ExpectEfficient(Evaluate("moe"), 0.45); }
TEST(PlannerOnH200Measurements, Mla) { ExpectEfficient(Evaluate("mla"), 0.3); }

}  // namespace
}  // namespace remat::search
