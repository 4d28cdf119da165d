// The adaptive-measurement rule and the median's interval (search/noise.h).
#include "search/noise.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "search/spec.h"

namespace remat::search {
namespace {

SearchOptions Adaptive(int measure, int cap, double target) {
  SearchOptions o;
  o.measure_steps = measure;
  o.max_measure_steps = cap;
  o.noise_target = target;
  return o;
}

TEST(Noise, BinomialTail) {
  EXPECT_DOUBLE_EQ(BinomialHalfBelow(5, 0), 0);
  EXPECT_NEAR(BinomialHalfBelow(5, 1), 1.0 / 32, 1e-15);
  EXPECT_NEAR(BinomialHalfBelow(5, 2), 6.0 / 32, 1e-15);
  EXPECT_NEAR(BinomialHalfBelow(10, 5), 386.0 / 1024, 1e-12);
  EXPECT_DOUBLE_EQ(BinomialHalfBelow(4, 9), 1);
  // Large n stays finite (log-space): half of the mass lies below n/2 (less the middle term).
  EXPECT_NEAR(BinomialHalfBelow(100000, 50000), 0.5 - 0.5 * 0.0025231, 1e-4);
}

// The order statistics chosen for n steps at 90%: [x_(k), x_(n+1-k)] and their exact coverage.
TEST(Noise, IntervalTakesTheNarrowestOrderStatisticsThatCover) {
  struct Row {
    int n, k;
    double coverage;
  };
  for (const Row& row : {Row{5, 1, 1 - 2.0 / 32}, Row{6, 1, 1 - 2.0 / 64},
                         Row{8, 2, 1 - 2 * 9.0 / 256}, Row{10, 2, 1 - 2 * 11.0 / 1024},
                         Row{20, 6, 1 - 2 * 0.020694732666015625}}) {
    std::vector<double> times;
    for (int i = row.n; i >= 1; --i) times.push_back(i);  // x_(i) = i, given in reverse
    const MedianInterval ci = MedianConfidenceInterval(times);
    EXPECT_EQ(ci.steps, row.n);
    EXPECT_DOUBLE_EQ(ci.low_s, row.k) << "n=" << row.n;
    EXPECT_DOUBLE_EQ(ci.high_s, row.n + 1 - row.k) << "n=" << row.n;
    EXPECT_NEAR(ci.coverage, row.coverage, 1e-9) << "n=" << row.n;
    EXPECT_GE(ci.coverage, kMedianConfidence);
  }
}

TEST(Noise, TooFewStepsGiveMinMaxWithTheirCoverage) {
  const MedianInterval three = MedianConfidenceInterval({1.2, 1.0, 1.1});
  EXPECT_DOUBLE_EQ(three.low_s, 1.0);
  EXPECT_DOUBLE_EQ(three.high_s, 1.2);
  EXPECT_DOUBLE_EQ(three.median_s, 1.1);
  EXPECT_DOUBLE_EQ(three.coverage, 0.75);
  EXPECT_NEAR(three.RelativeHalfWidth(), 0.1 / 1.1, 1e-12);
  const MedianInterval one = MedianConfidenceInterval({2.0});
  EXPECT_DOUBLE_EQ(one.low_s, 2.0);
  EXPECT_DOUBLE_EQ(one.coverage, 0);
  EXPECT_EQ(MedianConfidenceInterval({}).steps, 0);
}

// The coverage is what it claims: for skewed steps (one in five 30% slow, MoE-like) the interval
// of 7 steps holds the true median in at least 90% of 4000 draws.
TEST(Noise, CoverageHoldsOnSkewedSteps) {
  std::mt19937_64 gen(7);
  std::normal_distribution<double> jitter(0, 0.01);
  std::bernoulli_distribution slow(0.2);
  auto step = [&] { return (1 + jitter(gen)) * (slow(gen) ? 1.3 : 1.0); };
  std::vector<double> big;
  for (int i = 0; i < 200001; ++i) big.push_back(step());
  const double true_median = MedianStepTime(big);
  int held = 0;
  const int draws = 4000;
  for (int d = 0; d < draws; ++d) {
    std::vector<double> t;
    for (int i = 0; i < 7; ++i) t.push_back(step());
    const MedianInterval ci = MedianConfidenceInterval(t);
    held += ci.low_s <= true_median && true_median <= ci.high_s;
  }
  EXPECT_GE(held, 0.9 * draws - 40);
}

TEST(Noise, SteadyStepsStopAtFiveNoisyOnesAtTheCap) {
  const SearchOptions o = Adaptive(3, 12, 0.02);
  std::vector<double> steady;
  for (double t : {1.0, 1.004, 0.997, 1.002, 0.999, 1.001}) {
    steady.push_back(t);
    const bool done = MeasureDone(o, steady);
    // 3 and 4 steps cannot reach 90%; 5 steps within 0.4% can.
    EXPECT_EQ(done, steady.size() >= 5) << steady.size();
  }
  std::vector<double> noisy;
  for (int i = 0; i < 12; ++i) {
    noisy.push_back(i % 3 == 0 ? 1.4 : (i % 2 ? 1.0 : 1.1));
    EXPECT_EQ(MeasureDone(o, noisy), noisy.size() >= 12) << noisy.size();
  }
  EXPECT_EQ(MeasureStepCap(o), 12);
}

TEST(Noise, TargetZeroMeasuresExactlyMeasureSteps) {
  const SearchOptions o = Adaptive(3, 20, 0);
  EXPECT_EQ(MeasureStepCap(o), 3);
  EXPECT_FALSE(MeasureDone(o, {1.0, 2.0}));
  EXPECT_TRUE(MeasureDone(o, {1.0, 2.0, 5.0}));
  // A cap below measure_steps never cuts the minimum.
  EXPECT_EQ(MeasureStepCap(Adaptive(8, 4, 0.02)), 8);
}

TEST(Noise, RecordedRunsTakeTheSameStepsTheEngineWould) {
  const SearchOptions o = Adaptive(3, 10, 0.02);
  // Two warm-up steps, then steady steps: the window ends at the fifth measured step.
  const std::vector<double> run = {3.0, 2.0, 1.0, 1.001, 0.999, 1.002, 0.998, 1.5, 1.5};
  EXPECT_EQ(AdaptiveMeasuredSteps(run, 2, o),
            (std::vector<double>{1.0, 1.001, 0.999, 1.002, 0.998}));
  // A run that never settles gives every step up to the cap.
  std::vector<double> noisy(20);
  for (int i = 0; i < 20; ++i) noisy[i] = 1 + 0.3 * (i % 2);
  EXPECT_EQ(AdaptiveMeasuredSteps(noisy, 0, o).size(), 10u);
  EXPECT_EQ(AdaptiveMeasuredSteps({1.0, 2.0}, 5, o).size(), 0u);
}

TEST(Noise, TrialIntervalFromTheSlowestRank) {
  SearchOptions o = Adaptive(3, 10, 0.02);
  TrialResult r;
  r.step_time_s = 2.0;
  r.tokens_per_s = 1000;
  RankResult fast, slow;
  fast.step_time_s = 1.0;
  fast.step_times_s = {1.0, 1.0, 1.0, 1.0, 1.0};
  slow.step_time_s = 2.0;
  slow.step_times_s = {1.9, 2.0, 2.2, 2.0, 2.0};
  r.ranks = {fast, slow};
  FillStepTimeInterval(o, &r);
  EXPECT_DOUBLE_EQ(r.step_time_low_s, 1.9);
  EXPECT_DOUBLE_EQ(r.step_time_high_s, 2.2);
  EXPECT_EQ(r.measured_steps, 5);
  EXPECT_FALSE(r.noise_target_met);  // +-7.5% against a 2% target
  const ThroughputInterval tp = ThroughputIntervalOf(r);
  EXPECT_NEAR(tp.low, 1000 * 2.0 / 2.2, 1e-9);
  EXPECT_NEAR(tp.high, 1000 * 2.0 / 1.9, 1e-9);
  // Without per-step times the recorded interval stands; without either, none.
  r.ranks.clear();
  EXPECT_TRUE(TrialInterval(r).has_value());
  r.step_time_low_s = r.step_time_high_s = 0;
  EXPECT_FALSE(TrialInterval(r).has_value());
  EXPECT_DOUBLE_EQ(ThroughputIntervalOf(r).high, 1000);
}

// A trial's tie band: its steps' whole range until the median's interval reaches 90%; then the
// interval's width, or half the range when the steps spread further (drifting steps).
TEST(Noise, RelativeNoiseIsTheIntervalOnceItCoversElseTheRange) {
  auto trial = [](std::vector<double> steps) {
    TrialResult r;
    r.step_time_s = 1.0;
    RankResult rank;
    rank.step_time_s = 1.0;
    rank.step_times_s = std::move(steps);
    r.ranks = {rank};
    return r;
  };
  // 3 steps: [min, max] covers the median 75% of the time: the range.
  EXPECT_NEAR(RelativeNoise(trial({0.9, 1.0, 1.1})), 0.2, 1e-12);
  // 11 steps: the 90% interval is [x(3), x(9)] = [0.98, 1.02], wider than half the range (0.03).
  const TrialResult steady =
      trial({0.97, 0.975, 0.98, 0.99, 1.0, 1.0, 1.0, 1.01, 1.02, 1.025, 1.03});
  EXPECT_NEAR(RelativeNoise(steady), 0.04, 1e-12);
  EXPECT_NEAR(steady.RelativeSpread(), 0.06, 1e-12);
  // The same interval with a 40% range: half the range (0.2) is the band.
  EXPECT_NEAR(RelativeNoise(trial({0.8, 0.975, 0.98, 0.99, 1.0, 1.0, 1.0, 1.01, 1.02, 1.025, 1.2})),
              0.2, 1e-12);
  // A table that kept only the range (no steps, no interval): the range.
  TrialResult ranged;
  ranged.step_time_s = 1.0;
  ranged.step_time_spread_s = 0.07;
  EXPECT_NEAR(RelativeNoise(ranged), 0.07, 1e-12);
}

}  // namespace
}  // namespace remat::search
