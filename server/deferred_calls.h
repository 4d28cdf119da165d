// DeferredCalls: callbacks collected while the Scheduler's mutex is held and run after it is
// released (lease answers, watch wake-ups), so a callback may call back into the Scheduler.
//
// Thread-safety: none of its own; the Scheduler's mutex guards it. Take() hands the collected
// calls over in the order they were added.
#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace remat::server {

class DeferredCalls {
 public:
  void Add(std::function<void()> call) { calls_.push_back(std::move(call)); }

  // The collected calls, oldest first; the list is empty afterwards.
  std::vector<std::function<void()>> Take() {
    std::vector<std::function<void()>> out;
    out.swap(calls_);
    return out;
  }

 private:
  std::vector<std::function<void()>> calls_;
};

}  // namespace remat::server
