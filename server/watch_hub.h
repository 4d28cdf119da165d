// WatchHub: the coordinator's watchers (RematService.WatchSearch streams). Each watcher has a
// queue of progress updates that the RPC layer pulls with Poll; a watcher is woken (through
// DeferredCalls, so never under the Scheduler's mutex) whenever an update is queued.
//
// A watcher follows one search until its final update has been pulled; a slow reader keeps the
// newest kMaxPendingUpdates updates (older non-final ones are dropped; the final one never is).
//
// Thread-safety: none of its own; the Scheduler calls it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "remat/v1/remat.pb.h"
#include "server/deferred_calls.h"

namespace remat::server {

// What Poll found: nothing yet, an update, the final update (the watcher is gone afterwards), or
// a closed watcher (unknown id, or closed by CloseAll).
enum class WatchPoll { kNone, kUpdate, kFinal, kClosed };

class WatchHub {
 public:
  static constexpr size_t kMaxPendingUpdates = 256;

  // `deferred` receives the wake-ups; it must outlive the hub.
  explicit WatchHub(DeferredCalls* deferred) : deferred_(deferred) {}

  // A new watcher of `search_id` (empty: a search no longer followed, e.g. already finished).
  uint64_t Add(const std::string& search_id, std::function<void()> wake);

  // Queues `update` for one watcher; `final` ends it (later pushes are ignored). Unknown ids are
  // ignored.
  void Push(uint64_t watch_id, v1::SearchProgress update, bool final);
  // Queues `update` for every watcher of `search_id`.
  void PushToSearch(const std::string& search_id, const v1::SearchProgress& update, bool final);
  bool HasWatchers(const std::string& search_id) const;

  // The search left memory: its watchers keep what is queued but follow nothing anymore.
  void DetachSearch(const std::string& search_id);

  // Takes the oldest queued update into *update.
  WatchPoll Poll(uint64_t watch_id, v1::SearchProgress* update);
  // Removes a watcher at once (its client went away). Unknown ids are ignored.
  void Remove(uint64_t watch_id);
  // Closes every watcher: each is woken, drains what is queued, then polls kClosed.
  void CloseAll();

 private:
  struct Watcher {
    std::string search_id;
    std::deque<v1::SearchProgress> pending;
    bool final_queued = false;
    bool closed = false;
    std::function<void()> wake;
  };

  void Erase(std::unordered_map<uint64_t, Watcher>::iterator it);

  DeferredCalls* deferred_;
  std::unordered_map<uint64_t, Watcher> watchers_;
  std::unordered_map<std::string, std::vector<uint64_t>> by_search_;  // in order of Add
  uint64_t next_id_ = 1;
};

}  // namespace remat::server
