// Planning costs what the layout costs, never what the limits allow: the largest specs that
// ValidateSpec accepts (tests/search/largest_specs.h) plan in well under a second. A submit plans
// before it is acknowledged and a restart re-plans every queued search, so a spec that took a
// minute here would stall the coordinator. remat-plan-bench prints the figures
// (docs/security.md): tens of milliseconds and a few MiB; the bound here leaves room for the
// sanitizer build and a loaded CI machine.
#include <gtest/gtest.h>

#include <chrono>

#include "search/pipeline.h"
#include "search/planner.h"
#include "tests/search/largest_specs.h"

namespace remat::search {
namespace {

TEST(PlanningCost, TheLargestAcceptedSpecsPlanQuickly) {
  for (const auto& [name, base] : testing::LargestSpecs()) {
    for (StrategyKind kind : {StrategyKind::kGuided, StrategyKind::kExhaustive}) {
      for (bool layout_proxy : {false, true}) {
        SearchSpec spec = base;
        spec.search.strategy = kind;
        spec.search.layout_proxy = layout_proxy;
        const auto t0 = std::chrono::steady_clock::now();
        const Status valid = ValidateSpec(spec);
        if (layout_proxy && !valid.ok()) continue;  // not every layout can be proxied
        ASSERT_TRUE(valid.ok()) << name << ": " << valid.message();
        auto strategy = MakeStrategy(spec);
        EXPECT_GT(strategy->PlannedTotal(), 0) << name;
        EXPECT_FALSE(strategy->Propose(64).empty()) << name;
        EXPECT_FALSE(InitialPlan(spec).empty()) << name;
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_LT(s, 5.0) << name << " (" << Name(kind) << ") took " << s << " s";
      }
    }
  }
}

// The in-flight states of a step of 2^24 micro-batches come from a few of them.
TEST(PlanningCost, InFlightStatesComeFromAFewMicrobatches) {
  for (const auto& [name, spec] : testing::LargestSpecs()) {
    const int pp = spec.parallel.pipeline_model_parallel_size;
    const int vpp = spec.parallel.VirtualChunks();
    for (int p : {0, pp - 1}) {
      EXPECT_LE(InFlightMicrobatches(spec, p), 4 * pp + 2) << name;
      EXPECT_LE(InFlightStates(spec, p).size(), static_cast<size_t>(3 * pp * vpp)) << name;
    }
  }
}

}  // namespace
}  // namespace remat::search
