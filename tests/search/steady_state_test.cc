// The steady-state rule (search/steady_state.h) on tables of step times.
#include "search/steady_state.h"

#include <gtest/gtest.h>

#include <vector>

#include "search/spec.h"

namespace remat::search {
namespace {

SearchOptions Options(int min_warmup, int max_warmup, int window, double tolerance,
                      int measure = 3) {
  SearchOptions o;
  o.warmup_steps = min_warmup;
  o.warmup_max_steps = max_warmup;
  o.steady_window = window;
  o.steady_tolerance = tolerance;
  o.measure_steps = measure;
  o.noise_target = 0;  // exactly `measure` steps (the adaptive rule: noise_test.cc)
  return o;
}

TEST(SteadyState, RelativeSpreadIsRangeOverMedian) {
  EXPECT_DOUBLE_EQ(RelativeSpreadOf({}), 0);
  EXPECT_DOUBLE_EQ(RelativeSpreadOf({0.5}), 0);
  EXPECT_DOUBLE_EQ(RelativeSpreadOf({1.0, 1.1, 0.9}), 0.2);
  EXPECT_NEAR(WindowSpread({5, 1.0, 1.02}, 2), 0.02 / 1.01, 1e-12);
  EXPECT_LT(WindowSpread({1.0}, 2), 0);  // too few to judge
}

// Each row: step times of one run and the warm-up the rule must take with the defaults
// (min 2, max 8, window 3, 5%).
TEST(SteadyState, WarmupTableWithDefaults) {
  const SearchOptions o = Options(2, 8, 3, 0.05);
  struct Row {
    std::vector<double> times;
    int warmup;
    bool settled;
  };
  const std::vector<Row> rows = {
      // Steady from the start: the window needs three steps.
      {{1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0}, 3, true},
      // The H200 grouped-MoE shape: 0.37 s falling to 0.26-0.28 s over four steps.
      {{0.37, 0.33, 0.30, 0.27, 0.265, 0.27, 0.268, 0.27, 0.27, 0.27}, 6, true},
      // Settles within 5% at step 5 (0.27, 0.28, 0.275: 3.6%).
      {{0.4, 0.35, 0.27, 0.28, 0.275, 0.27, 0.27, 0.27}, 5, true},
      // Never settles: the bound.
      {{1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1, 2}, 8, false},
      // Exactly at the tolerance counts as settled (1.0, 1.05, 1.0: spread 0.05 / 1.0).
      {{3, 1.0, 1.05, 1.0, 1, 1, 1}, 4, true},
  };
  for (const Row& row : rows) {
    const SteadySplit split = SplitSteadyState(o, row.times);
    EXPECT_EQ(split.warmup_steps, row.warmup) << ::testing::PrintToString(row.times);
    EXPECT_EQ(split.settled, row.settled) << ::testing::PrintToString(row.times);
    const size_t measured = std::min<size_t>(3, row.times.size() - row.warmup);
    EXPECT_EQ(split.measured.size(), measured);
    // Step by step, the engine's way, agrees with the split afterwards.
    std::vector<double> warmup;
    size_t i = 0;
    while (!WarmupDone(o, warmup)) warmup.push_back(row.times.at(i++));
    EXPECT_EQ(static_cast<int>(warmup.size()), row.warmup);
  }
}

TEST(SteadyState, MinimumAndBoundsHold) {
  // A long minimum wins over an early settle.
  EXPECT_EQ(SplitSteadyState(Options(5, 8, 2, 0.05), {1, 1, 1, 1, 1, 1, 1, 1, 1}).warmup_steps, 5);
  // A window of one settles at once: the old fixed warm-up of warmup_steps.
  const SteadySplit fixed = SplitSteadyState(Options(1, 8, 1, 0.05), {9, 1, 2, 3});
  EXPECT_EQ(fixed.warmup_steps, 1);
  EXPECT_TRUE(fixed.settled);
  EXPECT_EQ(fixed.measured, (std::vector<double>{1, 2, 3}));
  // No warm-up at all.
  const SteadySplit none = SplitSteadyState(Options(0, 0, 3, 0.05), {9, 1, 2, 3});
  EXPECT_EQ(none.warmup_steps, 0);
  EXPECT_FALSE(none.settled);
  EXPECT_EQ(none.measured, (std::vector<double>{9, 1, 2}));
  // A run that stops before its warm-up ends measures nothing.
  const SteadySplit short_run = SplitSteadyState(Options(2, 8, 3, 0.05), {5, 4, 3});
  EXPECT_EQ(short_run.warmup_steps, 3);
  EXPECT_FALSE(short_run.settled);
  EXPECT_TRUE(short_run.measured.empty());
  // A tighter tolerance takes longer on the same steps.
  const std::vector<double> drift = {1.0, 0.98, 0.97, 0.965, 0.962, 0.961, 0.9605, 0.9603, 0.96};
  EXPECT_LT(SplitSteadyState(Options(2, 8, 3, 0.05), drift).warmup_steps,
            SplitSteadyState(Options(2, 8, 3, 0.002), drift).warmup_steps);
}

TEST(SteadyState, SpecValidationNamesTheField) {
  SearchSpec spec;
  spec.model.num_layers = 2;
  spec.model.hidden_size = 64;
  spec.model.num_attention_heads = 4;
  spec.model.seq_length = 32;
  spec.model.vocab_size = 128;
  ASSERT_TRUE(ValidateSpec(spec).ok()) << ValidateSpec(spec).message();
  auto message = [&](auto edit) {
    SearchSpec s = spec;
    edit(s.search);
    return ValidateSpec(s).message();
  };
  EXPECT_EQ(message([](SearchOptions& o) { o.warmup_max_steps = 1; }).rfind(
                "search.warmup_max_steps:", 0),
            0u);
  EXPECT_EQ(message([](SearchOptions& o) { o.steady_window = 0; }).rfind("search.steady_window:", 0),
            0u);
  EXPECT_EQ(message([](SearchOptions& o) { o.steady_window = 9; }).rfind("search.steady_window:", 0),
            0u);
  EXPECT_EQ(message([](SearchOptions& o) { o.steady_tolerance = 0; }).rfind(
                "search.steady_tolerance:", 0),
            0u);
  EXPECT_EQ(message([](SearchOptions& o) { o.steady_tolerance = 1.5; }).rfind(
                "search.steady_tolerance:", 0),
            0u);
  EXPECT_TRUE(ValidateSpec([&] {
                SearchSpec s = spec;
                s.search.warmup_steps = 0;
                s.search.warmup_max_steps = 0;  // no warm-up at all
                return s;
              }())
                  .ok());
}

}  // namespace
}  // namespace remat::search
