// The worker's one conversion of an assignment, and the one place a result gets its policy.
#include "worker/assignment.h"

#include <gtest/gtest.h>

#include "search/limits.h"
#include "search/text.h"

namespace remat::worker {
namespace {

using search::TrialStatus;

v1::TrialAssignment Wire() {
  v1::TrialAssignment a;
  a.set_trial_id("t-1");
  a.set_search_id("s-1");
  a.set_attempt(3);
  a.set_world_size(0);
  a.mutable_policy()->set_canonical("selective:[core_attn]");
  a.mutable_spec()->mutable_model()->set_seq_length(4096);
  return a;
}

TEST(Assignment, ConvertsOnceWithTheSpecDefaultsResolved) {
  Assignment a = ToAssignment(Wire());
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(a.trial_id, "t-1");
  EXPECT_EQ(a.search_id, "s-1");
  EXPECT_EQ(a.attempt, 3);
  EXPECT_EQ(a.world_size, 1);  // at least one rank
  EXPECT_EQ(a.policy.ToString(), "selective:[core_attn]");
  // Unset fields take search/spec.h's defaults (not restated on the wire side).
  const search::SearchSpec defaults;
  EXPECT_EQ(a.spec.search.warmup_steps, defaults.search.warmup_steps);
  EXPECT_EQ(a.spec.search.measure_steps, defaults.search.measure_steps);
  EXPECT_EQ(a.spec.search.trial_timeout_s, defaults.search.trial_timeout_s);
  EXPECT_EQ(a.spec.search.backend, search::Backend::kBuiltin);
  EXPECT_FALSE(a.replay.has_value());
}

TEST(Assignment, TokensPerSecondFollowsTheContractWithUnsetFieldsDefaulted) {
  v1::TrialAssignment w = Wire();
  EXPECT_DOUBLE_EQ(search::TokensPerSecond(ToAssignment(w).spec, 0.5), 4096 / 0.5);
  w.mutable_spec()->mutable_train()->set_micro_batch_size(2);
  w.mutable_spec()->mutable_parallel()->set_data_parallel_size(4);
  EXPECT_DOUBLE_EQ(search::TokensPerSecond(ToAssignment(w).spec, 2.0), 2 * 4096 * 4 / 2.0);
  EXPECT_DOUBLE_EQ(search::TokensPerSecond(ToAssignment(w).spec, 0), 0);
}

TEST(Assignment, AnUnreadableSpecOrPolicyIsAnErrorNamingTheField) {
  v1::TrialAssignment w = Wire();
  w.mutable_spec()->mutable_model()->set_normalization("BatchNorm");
  Assignment a = ToAssignment(w);
  EXPECT_NE(a.error.find("model.normalization"), std::string::npos) << a.error;
  EXPECT_EQ(a.trial_id, "t-1");  // the identity is kept for the report
  w = Wire();
  w.mutable_policy()->set_canonical("selective:[warp_drive]");
  a = ToAssignment(w);
  EXPECT_NE(a.error.find("policy"), std::string::npos) << a.error;
  EXPECT_EQ(a.policy_name, "selective:[warp_drive]");
}

TEST(Assignment, ReplayEntryIsReadWithoutItsPolicyAndANonFinalStatusFails) {
  v1::TrialAssignment w = Wire();
  w.set_replay_found(true);
  w.mutable_replay()->set_wall_s(1.5);
  w.mutable_replay()->mutable_result()->mutable_policy()->set_canonical("not a policy");
  w.mutable_replay()->mutable_result()->set_status(v1::TRIAL_STATUS_OK);
  w.mutable_replay()->mutable_result()->set_step_time_s(0.25);
  Assignment a = ToAssignment(w);
  ASSERT_TRUE(a.replay.has_value());
  EXPECT_EQ(a.error, "");
  EXPECT_EQ(a.replay->status, TrialStatus::kOk);
  EXPECT_DOUBLE_EQ(a.replay->step_time_s, 0.25);
  EXPECT_DOUBLE_EQ(a.replay_wall_s, 1.5);

  w.mutable_replay()->mutable_result()->set_status(v1::TRIAL_STATUS_PENDING);
  a = ToAssignment(w);
  EXPECT_EQ(a.replay->status, TrialStatus::kFailed);
  EXPECT_EQ(a.replay->message, "replay entry has no final status");
}

TEST(Assignment, MakeReportStampsTheAssignmentsPolicyOnce) {
  Assignment a = ToAssignment(Wire());
  search::TrialResult result = StatusResult(TrialStatus::kOom, "out of memory");
  result.policy = search::Policy::Full(search::RecomputeMethod::kBlock, 2);  // not read
  result.wall_s = 4;
  v1::ReportTrialRequest report = MakeReport("w-9", a, result);
  EXPECT_EQ(report.worker_id(), "w-9");
  EXPECT_EQ(report.trial_id(), "t-1");
  EXPECT_EQ(report.attempt(), 3);
  EXPECT_EQ(report.result().policy().canonical(), "selective:[core_attn]");
  EXPECT_EQ(report.result().status(), v1::TRIAL_STATUS_OOM);
  EXPECT_EQ(report.result().message(), "out of memory");
  EXPECT_DOUBLE_EQ(report.result().wall_s(), 4);

  // An assignment that could not be read is reported under the policy string it came with.
  v1::TrialAssignment w = Wire();
  w.mutable_policy()->set_canonical("selective:[warp_drive]");
  Assignment bad = ToAssignment(w);
  report = MakeReport("w-9", bad, StatusResult(TrialStatus::kFailed, bad.error));
  EXPECT_EQ(report.result().policy().canonical(), "selective:[warp_drive]");
  EXPECT_EQ(report.result().status(), v1::TRIAL_STATUS_FAILED);
}

// A trial that wrote invalid UTF-8 or megabytes must still give a report the coordinator can
// parse (a proto3 string with invalid UTF-8 fails the whole message on the receiving side).
TEST(Assignment, MakeReportMakesTheMessageValidUtf8AndBounded) {
  Assignment a = ToAssignment(Wire());
  std::string junk = "rank 0: Segmentation fault \xFF\xFE";
  junk += std::string(8 << 20, '\xC3');  // megabytes of a lead byte with nothing after it
  junk += " the end";
  v1::ReportTrialRequest report = MakeReport("w-9", a, StatusResult(TrialStatus::kFailed, junk));
  std::string wire;
  ASSERT_TRUE(report.SerializeToString(&wire));
  v1::ReportTrialRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire)) << "the coordinator could not read the report";
  EXPECT_LE(parsed.result().message().size(), search::limits::kMaxTrialMessageBytes);
  EXPECT_TRUE(search::IsValidUtf8(parsed.result().message()));
  EXPECT_EQ(parsed.result().message().rfind("rank 0: Segmentation fault \xEF\xBF\xBD", 0), 0u)
      << parsed.result().message().substr(0, 80);
}

}  // namespace
}  // namespace remat::worker
