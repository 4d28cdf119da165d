// LeaseWaiters on its own: every parked call is answered exactly once, oldest first.
#include "server/lease_waiters.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <vector>

namespace remat::server {
namespace {

class LeaseWaitersTest : public ::testing::Test {
 protected:
  // Parks a call for `worker`; its answer lands in answers_[worker] (-1: an error).
  uint64_t Park(const std::string& worker, int64_t deadline) {
    v1::LeaseTrialRequest r;
    r.set_worker_id(worker);
    return waiters_.Park(
        r,
        [this, worker](absl::StatusOr<v1::LeaseTrialResponse> got) {
          ++calls_[worker];
          answers_[worker] = got.ok() ? got->trials_size() : -1;
        },
        deadline);
  }
  void Run() {
    for (auto& f : deferred_.Take()) f();
  }
  static v1::LeaseTrialResponse Trials(int n) {
    v1::LeaseTrialResponse out;
    for (int i = 0; i < n; ++i) out.add_trials()->set_trial_id("t-" + std::to_string(i));
    return out;
  }

  DeferredCalls deferred_;
  LeaseWaiters waiters_{&deferred_};
  std::map<std::string, int> answers_;
  std::map<std::string, int> calls_;
};

TEST_F(LeaseWaitersTest, AnswersGoThroughDeferredCallsOnly) {
  Park("w-1", 1000);
  EXPECT_TRUE(waiters_.Cancel(1));
  EXPECT_TRUE(calls_.empty());  // not under the caller's lock
  Run();
  EXPECT_EQ(calls_["w-1"], 1);
  EXPECT_EQ(answers_["w-1"], 0);
  EXPECT_FALSE(waiters_.Cancel(1));  // answered once only
  Run();
  EXPECT_EQ(calls_["w-1"], 1);
}

TEST_F(LeaseWaitersTest, ExpireAnswersOnlyThosePastTheirDeadline) {
  Park("w-1", 1000);
  Park("w-2", 2000);
  EXPECT_EQ(waiters_.MsUntilDeadline(400, 250), 250);
  EXPECT_EQ(waiters_.MsUntilDeadline(900, 250), 100);
  EXPECT_EQ(waiters_.MsUntilDeadline(5000, 250), 0);
  waiters_.Expire(1000);
  Run();
  EXPECT_EQ(calls_["w-1"], 1);
  EXPECT_EQ(calls_.count("w-2"), 0u);
  waiters_.AnswerAllEmpty();
  Run();
  EXPECT_EQ(calls_["w-2"], 1);
  EXPECT_TRUE(waiters_.empty());
}

TEST_F(LeaseWaitersTest, ServeOffersWorkOldestFirstWhileThereIsSome) {
  Park("w-1", 1000);
  Park("w-2", 1000);
  Park("w-3", 1000);
  int work = 2;
  std::vector<std::string> offered;
  waiters_.Serve(
      [&] { return work > 0; },
      [&](const v1::LeaseTrialRequest& r) -> std::optional<absl::StatusOr<v1::LeaseTrialResponse>> {
        offered.push_back(r.worker_id());
        if (r.worker_id() == "w-1") return std::nullopt;  // nothing fits it
        --work;
        return Trials(1);
      });
  Run();
  EXPECT_EQ(offered, (std::vector<std::string>{"w-1", "w-2", "w-3"}));
  EXPECT_EQ(answers_["w-2"], 1);
  EXPECT_EQ(answers_["w-3"], 1);
  EXPECT_EQ(calls_.count("w-1"), 0u);  // still parked
  EXPECT_FALSE(waiters_.empty());
  waiters_.Serve([] { return false; },
                 [&](const v1::LeaseTrialRequest&) {
                   ADD_FAILURE() << "offered with no work";
                   return std::nullopt;
                 });
}

TEST_F(LeaseWaitersTest, ErrorsAreAnswersToo) {
  Park("w-1", 1000);
  waiters_.Serve(
      [] { return true; },
      [](const v1::LeaseTrialRequest&) -> std::optional<absl::StatusOr<v1::LeaseTrialResponse>> {
        return absl::StatusOr<v1::LeaseTrialResponse>(absl::UnavailableError("store down"));
      });
  Run();
  EXPECT_EQ(answers_["w-1"], -1);
  EXPECT_TRUE(waiters_.empty());
}

}  // namespace
}  // namespace remat::server
