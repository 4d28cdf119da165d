// The plan's predictions learning from the trials (search/predict.h): the leave-one-out error of
// the memory predictions and the fit test the planner derives from it.
#include "search/predict.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "search/rules.h"
#include "tests/search/test_specs.h"

namespace remat::search {
namespace {

// A trial of `p` that peaks where the model says, at `tokens_per_s` (0 unless ok).
TrialResult ModelTrial(const SearchSpec& spec, const Policy& p, double tokens_per_s,
                       TrialStatus status = TrialStatus::kOk) {
  TrialResult r;
  r.policy = p;
  r.status = status;
  RankResult rank;
  rank.peak_allocated_bytes = rank.peak_reserved_bytes =
      static_cast<uint64_t>(EstimateMemory(spec, p).peak_bytes);
  r.ranks = {rank};
  r.tokens_per_s = status == TrialStatus::kOk ? tokens_per_s : 0;
  r.step_time_s = 1000 / tokens_per_s;
  return r;
}

// Every valid selective single label and the control, "measured" at the model's peak times
// `scale` (and times `odd` for `odd_policy`), at a throughput the model's step cost gives.
std::map<std::string, TrialResult> Measured(const SearchSpec& spec, double scale,
                                            const std::string& odd_policy = "",
                                            double odd = 1) {
  std::map<std::string, TrialResult> out;
  std::vector<Policy> policies = {Policy::None()};
  for (Label l : ValidLabels(spec)) policies.push_back(Policy::Selective({l}));
  for (const Policy& p : policies) {
    TrialResult r;
    r.policy = p;
    r.status = TrialStatus::kOk;
    RankResult rank;
    const double peak = EstimateMemory(spec, p).peak_bytes * scale *
                        (p.ToString() == odd_policy ? odd : 1);
    rank.peak_allocated_bytes = rank.peak_reserved_bytes = static_cast<uint64_t>(peak);
    r.ranks = {rank};
    r.step_time_s = 1;
    r.tokens_per_s = 1000;
    out[p.ToString()] = r;
  }
  return out;
}

TEST(Predict, MemoryErrorIsZeroWhereTheModelIsRightUpToAScale) {
  const SearchSpec spec = testing::DenseSpec();
  Predictor predictor(spec);
  // A uniform 7% offset is absorbed by anchoring on a measured neighbour: no error.
  const MemoryError e = predictor.MeasuredMemoryError(Measured(spec, 1.07));
  EXPECT_GE(e.trials, 3);
  EXPECT_NEAR(e.bias, 0, 1e-6);
  EXPECT_NEAR(e.spread, 0, 1e-6);
}

TEST(Predict, MemoryErrorFindsAPolicyTheModelGotWrong) {
  const SearchSpec spec = testing::DenseSpec();
  Predictor predictor(spec);
  const MemoryError e =
      predictor.MeasuredMemoryError(Measured(spec, 1.0, "selective:[core_attn]", 1.05));
  EXPECT_GE(e.trials, 3);
  // The odd one predicted from the others is 5% low, and whatever anchors on it is high.
  EXPECT_NEAR(e.spread, 0.05, 0.02);
  EXPECT_GT(e.spread, 0.03);
}

// The spread is the errors' 90th percentile: with ten or more, one policy measured off its
// neighbours (allocator caching) does not set the margin for every other prediction; with fewer
// it does.
TEST(Predict, MemoryErrorSpreadIsItsNinetiethPercentile) {
  const SearchSpec spec = testing::MlaSpec();
  Predictor predictor(spec);
  auto measured = [&](const std::string& odd, double by, size_t count) {
    std::map<std::string, TrialResult> out;
    for (const Policy& p : EnumerateValidPolicies(spec)) {
      if (out.size() == count) continue;
      TrialResult r;
      r.policy = p;
      r.status = TrialStatus::kOk;
      RankResult rank;
      rank.peak_allocated_bytes = rank.peak_reserved_bytes = static_cast<uint64_t>(
          EstimateMemory(spec, p).peak_bytes * (p.ToString() == odd ? by : 1.0));
      r.ranks = {rank};
      r.step_time_s = 1;
      r.tokens_per_s = 1000;
      out[p.ToString()] = r;
    }
    return out;
  };
  // MlaSpec has 16 selective policies; the first 20 valid ones add four full-recompute ones.
  // One policy 3% over its model: its own leave-one-out error and its neighbour's (anchored on
  // it) are about 3%, every other is 0.
  const auto nine = measured("", 1, 9);
  int odd_among_nine = 0;
  for (const Policy& p : EnumerateValidPolicies(spec)) {
    if (p.IsFull()) continue;
    SCOPED_TRACE(p.ToString());
    const MemoryError few = predictor.MeasuredMemoryError(measured(p.ToString(), 1.03, 9));
    if (nine.count(p.ToString())) {
      ++odd_among_nine;
      EXPECT_GT(few.spread, 0.025);  // 9 errors: the largest
    } else {
      EXPECT_EQ(few.spread, 0);
    }
    const MemoryError many = predictor.MeasuredMemoryError(measured(p.ToString(), 1.03, 20));
    EXPECT_EQ(many.trials, 20);
    EXPECT_LT(many.spread, 0.005);  // 20 errors: the two largest are past the 90th percentile
  }
  EXPECT_GE(odd_among_nine, 5);
}

// full:uniform:1 and full:block:<layers> keep the same tensors and recompute the same: measured
// both, they are two draws of one policy, and the block N below is predicted from their mean.
TEST(Predict, BlockFamilyEndIsTheMeanOfItsTwoDraws) {
  const SearchSpec spec = testing::DenseSpec();
  const int layers = LayersPerStage(spec);
  ASSERT_GE(layers, 2);
  auto trial = [&](const Policy& p, double tokens_per_s) {
    TrialResult r;
    r.policy = p;
    r.status = TrialStatus::kOk;
    RankResult rank;
    rank.peak_allocated_bytes = rank.peak_reserved_bytes =
        static_cast<uint64_t>(EstimateMemory(spec, p).peak_bytes);
    r.ranks = {rank};
    r.step_time_s = 1000 / tokens_per_s;
    r.tokens_per_s = tokens_per_s;
    return r;
  };
  const Policy uniform1 = Policy::Full(RecomputeMethod::kUniform, 1);
  const Policy end = Policy::Full(RecomputeMethod::kBlock, layers);
  const Policy target = Policy::Full(RecomputeMethod::kBlock, layers - 1);
  Predictor predictor(spec);
  const double from_uniform =
      predictor.Predict({{uniform1.ToString(), trial(uniform1, 1000)}}, target).tokens_per_s;
  const double from_block =
      predictor.Predict({{end.ToString(), trial(end, 900)}}, target).tokens_per_s;
  const double from_both = predictor
                               .Predict({{uniform1.ToString(), trial(uniform1, 1000)},
                                         {end.ToString(), trial(end, 900)}},
                                        target)
                               .tokens_per_s;
  EXPECT_GT(from_uniform, from_block);
  EXPECT_NEAR(from_both, 0.5 * (from_uniform + from_block), 1e-6 * from_uniform);
}

// Predicted optimistically, a label no trial has run is charged kUnmeasuredLabelScale of the
// model's charge for it; once any trial ran it, whatever came of that trial, the model's charge
// stands, and a label some trial ran is never discounted.
TEST(Predict, OptimisticAboutALabelNoTrialHasRun) {
  const SearchSpec spec = testing::MoeSpec();
  auto trial = [&](const Policy& p, TrialStatus status) {
    return ModelTrial(spec, p, 1000, status);
  };
  const Policy core = Policy::Selective({Label::kCoreAttn});
  const Policy target = Policy::Selective({Label::kCoreAttn, Label::kMoe});
  std::map<std::string, TrialResult> measured = {{core.ToString(), trial(core, TrialStatus::kOk)}};
  Predictor predictor(spec);
  const double charge = predictor.StepCost(target) / predictor.StepCost(core) - 1;
  ASSERT_GT(charge, 0.05);  // the replay of every expert: a FLOP figure, not a flat charge
  const double model = predictor.Predict(measured, target).tokens_per_s;
  const double optimistic = predictor.Predict(measured, target, true).tokens_per_s;
  EXPECT_NEAR(model, 1000 / (1 + charge), 1e-6);
  EXPECT_NEAR(optimistic, 1000 / (1 + kUnmeasuredLabelScale * charge), 1e-6);
  // The memory prediction is the same either way.
  EXPECT_EQ(predictor.Predict(measured, target).memory_bytes,
            predictor.Predict(measured, target, true).memory_bytes);
  // A moe policy that ran out of memory was still tried: moe is charged as the model says.
  const Policy tried = Policy::Selective({Label::kMoe});
  measured[tried.ToString()] = trial(tried, TrialStatus::kOom);
  EXPECT_NEAR(predictor.Predict(measured, target, true).tokens_per_s, model, 1e-6);
}

// A label's charge in a prediction is what the search's pairs of trials (policies that differ by
// that label alone) measure of it against the model, within [kMinLabelChargeScale,
// kMaxLabelChargeScale]; a label no pair differs by keeps the model's charge.
TEST(Predict, LabelChargesAreWhatPairsOfTrialsMeasure) {
  const SearchSpec spec = testing::DenseSpec();
  Predictor predictor(spec);
  const Policy none = Policy::None();
  const Policy core = Policy::Selective({Label::kCoreAttn});
  const Policy norm = Policy::Selective({Label::kLayernorm});
  const Policy mlp = Policy::Selective({Label::kMlp});
  const Policy core_norm = Policy::Selective({Label::kCoreAttn, Label::kLayernorm});
  auto charge = [&](const Policy& with, const Policy& without) {
    return predictor.StepCost(with) / predictor.StepCost(without) - 1;
  };
  auto trial = [&](const Policy& p, double tokens_per_s) {
    return ModelTrial(spec, p, tokens_per_s);
  };
  std::map<std::string, TrialResult> measured = {
      {none.ToString(), trial(none, 1000)},
      {core.ToString(), trial(core, 1000 / (1 + 3 * charge(core, none)))},
      {norm.ToString(), trial(norm, 1000 / (1 + 2 * charge(norm, none)))},
      {mlp.ToString(), trial(mlp, 1000 / (1 + 10 * charge(mlp, none)))}};
  const auto scales = predictor.LabelChargeScales(measured);
  ASSERT_EQ(scales.size(), 3u);
  EXPECT_NEAR(scales.at(Label::kCoreAttn).scale, 3, 1e-9);
  EXPECT_NEAR(scales.at(Label::kLayernorm).scale, 2, 1e-9);
  EXPECT_EQ(scales.at(Label::kMlp).scale, kMaxLabelChargeScale);
  EXPECT_EQ(scales.at(Label::kCoreAttn).pairs, 1);
  // [core_attn, layernorm] from its nearest measured neighbour, [core_attn] (both replay the
  // scores; layernorm saves little): layernorm charged twice the model's charge beside it.
  const Prediction p = predictor.Predict(measured, core_norm);
  EXPECT_NEAR(p.tokens_per_s,
              measured.at(core.ToString()).tokens_per_s / (1 + 2 * charge(core_norm, core)), 1e-6);
  // The charges follow the measurements (they are kept between calls): a trial measured again,
  // or one that no longer anchors, is charged anew.
  measured[core.ToString()].tokens_per_s = 1000 / (1 + 1.5 * charge(core, none));
  EXPECT_NEAR(predictor.LabelChargeScales(measured).at(Label::kCoreAttn).scale, 1.5, 1e-9);
  measured[core.ToString()].status = TrialStatus::kOom;
  EXPECT_EQ(predictor.LabelChargeScales(measured).count(Label::kCoreAttn), 0u);
}

TEST(Predict, FitTestUsesTheMeasuredErrorOnceThereAreEnoughTrials) {
  MemoryError few;
  few.trials = kMinErrorTrials - 1;
  few.bias = 0.05;
  few.spread = 0.001;
  const FitTest untaught = FitTestFrom(few);
  EXPECT_DOUBLE_EQ(untaught.bias, 0);
  EXPECT_DOUBLE_EQ(untaught.margin, kModelMargin);
  EXPECT_TRUE(untaught.MayFit(101.9, 100));
  EXPECT_FALSE(untaught.MayFit(102.1, 100));

  MemoryError steady = few;
  steady.trials = kMinErrorTrials;
  steady.bias = 0.0;
  steady.spread = 0.001;  // predictions within 0.1%: the edge narrows to kMinMargin
  const FitTest taught = FitTestFrom(steady);
  EXPECT_DOUBLE_EQ(taught.margin, kMinMargin);
  EXPECT_FALSE(taught.MayFit(101.0, 100));  // was tried before
  EXPECT_TRUE(taught.MayFit(100.4, 100));

  MemoryError low = steady;
  low.bias = 0.03;  // predictions run 3% under what trials measure
  low.spread = 0.5;
  const FitTest shifted = FitTestFrom(low);
  EXPECT_DOUBLE_EQ(shifted.margin, kModelMargin);  // never wider than the model's own margin
  EXPECT_NEAR(shifted.Corrected(100), 103, 1e-9);
  EXPECT_FALSE(shifted.MayFit(99.5, 100));  // 102.5 corrected: over the 2% margin
  EXPECT_TRUE(shifted.MayFit(98.5, 100));
}

}  // namespace
}  // namespace remat::search
