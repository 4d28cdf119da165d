// Numerical sanity (every trial's loss and grad norm against the control's, at the contract's
// tolerance) and the versions a search ran with (search/provenance.h).
#include "search/provenance.h"

#include <gtest/gtest.h>

#include "search/policy.h"

namespace remat::search {
namespace {

TrialResult Ok(const std::string& policy, double loss, double grad_norm) {
  TrialResult r;
  r.policy = *ParsePolicy(policy);
  r.status = TrialStatus::kOk;
  r.step_time_s = 1;
  r.loss = loss;
  r.grad_norm = grad_norm;
  return r;
}

SearchSpec WithPrecision(Precision p) {
  SearchSpec spec;
  spec.train.precision = p;
  return spec;
}

TEST(Numerics, ToleranceFollowsThePrecision) {
  EXPECT_DOUBLE_EQ(NumericsTolerance(Precision::kFp32), 1e-5);
  EXPECT_DOUBLE_EQ(NumericsTolerance(Precision::kBf16), 1e-3);
}

// Each row: a trial's loss and grad norm against a control of loss 2.0 and norm 4.0.
TEST(Numerics, MismatchTable) {
  const TrialResult control = Ok("selective:[]", 2.0, 4.0);
  struct Row {
    Precision precision;
    double loss, norm;
    bool mismatch;
  };
  const Row rows[] = {
      {Precision::kFp32, 2.0, 4.0, false},             // identical
      {Precision::kFp32, 2.0 * (1 + 9e-6), 4.0, false},  // within 1e-5
      {Precision::kFp32, 2.0 * (1 + 2e-5), 4.0, true},   // the loss off
      {Precision::kFp32, 2.0, 4.0 * (1 - 2e-5), true},   // the grad norm off
      {Precision::kBf16, 2.0 * (1 + 5e-4), 4.0 * (1 - 9e-4), false},  // within 1e-3
      {Precision::kBf16, 2.0 * (1 + 2e-3), 4.0, true},
      {Precision::kBf16, 2.0, 0.0, false},  // a norm not reported is not compared
  };
  for (const Row& row : rows) {
    const std::string m = NumericsMismatch(WithPrecision(row.precision),
                                           control, Ok("selective:[mlp]", row.loss, row.norm));
    EXPECT_EQ(!m.empty(), row.mismatch) << row.loss << " " << row.norm << ": " << m;
    if (row.mismatch) EXPECT_EQ(m.rfind("selective:[mlp]: ", 0), 0u) << m;
  }
  // The sentence names the figure that is off and the tolerance.
  const std::string m = NumericsMismatch(WithPrecision(Precision::kFp32), control,
                                         Ok("selective:[mlp]", 2.5, 4.0));
  EXPECT_NE(m.find("loss 2.5 vs the control's 2"), std::string::npos) << m;
  EXPECT_NE(m.find("tolerance 1.0e-05, fp32"), std::string::npos) << m;
}

TEST(Numerics, CheckComparesEveryTrialWithTheControl) {
  const SearchSpec spec = WithPrecision(Precision::kBf16);
  TrialResult oom = Ok("full:uniform:1", 9, 9);
  oom.status = TrialStatus::kOom;
  TrialResult predicted = Ok("full:block:1", 9, 9);
  predicted.predicted = true;
  TrialResult no_loss = Ok("selective:[layernorm]", 0, 0);  // e.g. a command job without losses
  const std::vector<TrialResult> results = {
      Ok("selective:[core_attn]", 3.0, 1.0), Ok("selective:[]", 3.0, 1.0),
      Ok("selective:[mlp]", 3.1, 1.0),       oom, predicted, no_loss};
  const NumericsCheck check = CheckNumerics(spec, results);
  EXPECT_TRUE(check.has_control);
  EXPECT_EQ(check.compared, 2);  // core_attn and mlp; not the control, the oom, the prediction
  ASSERT_EQ(check.mismatches.size(), 1u);
  EXPECT_EQ(check.mismatches.begin()->first, 2u);
  EXPECT_EQ(check.reference, "selective:[]");
  // A lone trial has nothing to be compared with.
  const NumericsCheck none = CheckNumerics(spec, {Ok("selective:[mlp]", 3.1, 1.0)});
  EXPECT_FALSE(none.has_control);
  EXPECT_EQ(none.compared, 0);
  EXPECT_TRUE(none.mismatches.empty());
  // A control over the budget: the first comparable trial stands in, and is named.
  TrialResult control_oom = Ok("selective:[]", 0, 0);
  control_oom.status = TrialStatus::kOom;
  const NumericsCheck stand_in = CheckNumerics(
      spec, {control_oom, Ok("selective:[core_attn]", 3.0, 1.0), Ok("selective:[mlp]", 3.1, 1.0)});
  EXPECT_FALSE(stand_in.has_control);
  EXPECT_EQ(stand_in.reference, "selective:[core_attn]");
  EXPECT_EQ(stand_in.compared, 1);
  ASSERT_EQ(stand_in.mismatches.size(), 1u);
  EXPECT_NE(stand_in.mismatches.at(2).find("vs selective:[core_attn]'s 3"), std::string::npos)
      << stand_in.mismatches.at(2);
}

TEST(Provenance, SearchVersionsJoinWhatTrialsReport) {
  TrialResult a = Ok("selective:[]", 1, 1), b = Ok("selective:[mlp]", 1, 1);
  a.versions = {{"remat", "0.9.0"}, {"torch", "2.5.1"}, {"gpu", "NVIDIA H200"}, {"driver", "550"}};
  b.versions = {{"remat", "0.9.0"}, {"torch", "2.5.1"}, {"gpu", "NVIDIA H200"}, {"driver", "560"}};
  const auto v = SearchVersions({a, b, Ok("full:uniform:1", 1, 1)});
  EXPECT_EQ(v.at("remat"), "0.9.0");
  EXPECT_EQ(v.at("gpu"), "NVIDIA H200");
  EXPECT_EQ(v.at("driver"), "550 | 560");
  EXPECT_TRUE(SearchVersions({}).empty());
}

}  // namespace
}  // namespace remat::search
