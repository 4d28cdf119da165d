// LeaseWaiters: LeaseTrial calls parked in a long poll, oldest first. Each parked call is
// answered exactly once, through DeferredCalls (so never under the Scheduler's mutex): with
// trials (Serve), or empty when its deadline passes (Expire), its caller goes away (Cancel) or
// the coordinator stops (AnswerAllEmpty).
//
// Thread-safety: none of its own; the Scheduler calls it under its mutex.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "remat/v1/remat.pb.h"
#include "server/deferred_calls.h"

namespace remat::server {

// The answer to a LeaseTrial call; called exactly once.
using LeaseDone = std::function<void(absl::StatusOr<v1::LeaseTrialResponse>)>;

class LeaseWaiters {
 public:
  // `deferred` receives the answers; it must outlive this object.
  explicit LeaseWaiters(DeferredCalls* deferred) : deferred_(deferred) {}

  // Parks a call until `deadline_ms` (monotonic). Returns its id (never 0).
  uint64_t Park(v1::LeaseTrialRequest request, LeaseDone done, int64_t deadline_ms);

  // Answers one parked call empty; false when it was already answered.
  bool Cancel(uint64_t id);
  // Answers empty every call whose deadline is at or before `now_ms`.
  void Expire(int64_t now_ms);
  void AnswerAllEmpty();

  // Offers work to the parked calls, oldest first, while `more_work()` is true: `try_serve`
  // returns an answer (the call is answered and leaves) or nullopt (it stays parked).
  using TryServe = std::function<std::optional<absl::StatusOr<v1::LeaseTrialResponse>>(
      const v1::LeaseTrialRequest&)>;
  void Serve(const std::function<bool()>& more_work, const TryServe& try_serve);

  // Milliseconds from `now_ms` to the earliest deadline, at most `cap_ms`, at least 0.
  int64_t MsUntilDeadline(int64_t now_ms, int64_t cap_ms) const;
  bool empty() const { return waiters_.empty(); }

 private:
  struct Waiter {
    uint64_t id;
    v1::LeaseTrialRequest request;
    LeaseDone done;
    int64_t deadline_ms;
  };
  using Iter = std::list<Waiter>::iterator;

  // Answers and removes; returns the next waiter.
  Iter Answer(Iter it, absl::StatusOr<v1::LeaseTrialResponse> response);

  DeferredCalls* deferred_;
  std::list<Waiter> waiters_;  // oldest first
  std::unordered_map<uint64_t, Iter> index_;
  uint64_t next_id_ = 1;
};

}  // namespace remat::server
