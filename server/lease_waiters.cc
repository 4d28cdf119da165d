#include "server/lease_waiters.h"

#include <algorithm>
#include <iterator>
#include <utility>

namespace remat::server {

uint64_t LeaseWaiters::Park(v1::LeaseTrialRequest request, LeaseDone done, int64_t deadline_ms) {
  const uint64_t id = next_id_++;
  waiters_.push_back(Waiter{id, std::move(request), std::move(done), deadline_ms});
  index_[id] = std::prev(waiters_.end());
  return id;
}

bool LeaseWaiters::Cancel(uint64_t id) {
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  Answer(it->second, v1::LeaseTrialResponse());
  return true;
}

void LeaseWaiters::Expire(int64_t now_ms) {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    it = it->deadline_ms > now_ms ? std::next(it) : Answer(it, v1::LeaseTrialResponse());
  }
}

void LeaseWaiters::AnswerAllEmpty() {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    it = Answer(it, v1::LeaseTrialResponse());
  }
}

void LeaseWaiters::Serve(const std::function<bool()>& more_work, const TryServe& try_serve) {
  for (auto it = waiters_.begin(); it != waiters_.end() && more_work();) {
    auto answer = try_serve(it->request);
    it = answer ? Answer(it, std::move(*answer)) : std::next(it);
  }
}

int64_t LeaseWaiters::MsUntilDeadline(int64_t now_ms, int64_t cap_ms) const {
  int64_t wait = cap_ms;
  for (const Waiter& w : waiters_) wait = std::min(wait, w.deadline_ms - now_ms);
  return std::max<int64_t>(0, wait);
}

LeaseWaiters::Iter LeaseWaiters::Answer(Iter it, absl::StatusOr<v1::LeaseTrialResponse> response) {
  deferred_->Add(
      [done = std::move(it->done), r = std::move(response)]() mutable { done(std::move(r)); });
  index_.erase(it->id);
  return waiters_.erase(it);
}

}  // namespace remat::server
