// CancelToken: a one-way flag that asks a running trial to stop, and lets it sleep interruptibly.
//
// Thread-safety: every method may be called from any thread. Cancel() is idempotent.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace remat::worker {

class CancelToken {
 public:
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }
  bool cancelled() const {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }
  // Sleeps up to `seconds`; returns true early (and at once) when cancelled.
  bool WaitFor(double seconds) const {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds < 0 ? 0 : seconds),
                        [this] { return cancelled_; });
  }

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool cancelled_ = false;
};

}  // namespace remat::worker
