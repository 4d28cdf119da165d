// The measurement rules' one home (search/trial.h, search/units.h, search/memory_model.h): the
// median and measure window the engine and the command backend share, units, padded vocabulary.
#include <gtest/gtest.h>

#include "search/memory_model.h"
#include "search/trial.h"
#include "search/units.h"

namespace remat::search {
namespace {

TEST(Measure, MedianOfOddEvenAndNone) {
  EXPECT_DOUBLE_EQ(MedianStepTime({3, 1, 2}), 2);
  EXPECT_DOUBLE_EQ(MedianStepTime({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(MedianStepTime({}), 0);
}

TEST(Measure, WindowSkipsWarmupAndStopsAfterMeasureSteps) {
  const std::vector<double> all = {9, 8, 1, 2, 3, 4, 5, 6};
  EXPECT_EQ(MeasuredSteps(all, 2, 5), (std::vector<double>{1, 2, 3, 4, 5}));
  EXPECT_EQ(MeasuredSteps(all, 2, 50), (std::vector<double>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(MeasuredSteps(all, 8, 5).empty());
  EXPECT_TRUE(MeasuredSteps(all, 20, 5).empty());
}

TEST(Units, GibibytesAndBytes) {
  EXPECT_EQ(kGiB, 1073741824u);
  EXPECT_EQ(GibToBytes(80), 80 * kGiB);
  EXPECT_EQ(GibToBytes(0.5), kGiB / 2);
  EXPECT_DOUBLE_EQ(BytesToGib(3.0 * kGiB), 3.0);
  SearchSpec spec;
  spec.search.memory_budget_gib = 6.96 / 1024;  // examples/tiny-dense.yaml's budget
  EXPECT_EQ(spec.search.MemoryBudgetBytes(), GibToBytes(6.96 / 1024));
}

TEST(PaddedVocab, MultipleOf128TimesTp) {
  SearchSpec spec;
  spec.model.vocab_size = 50257;
  EXPECT_EQ(PaddedVocabSize(spec), 50304);
  spec.parallel.tensor_model_parallel_size = 2;
  EXPECT_EQ(PaddedVocabSize(spec), 50432);
  spec.model.vocab_size = 256;
  EXPECT_EQ(PaddedVocabSize(spec), 256);
}

}  // namespace
}  // namespace remat::search
