#include "server/watch_hub.h"

#include <algorithm>
#include <utility>

namespace remat::server {

uint64_t WatchHub::Add(const std::string& search_id, std::function<void()> wake) {
  const uint64_t id = next_id_++;
  Watcher& w = watchers_[id];
  w.search_id = search_id;
  w.wake = std::move(wake);
  if (!search_id.empty()) by_search_[search_id].push_back(id);
  return id;
}

void WatchHub::Push(uint64_t watch_id, v1::SearchProgress update, bool final) {
  auto it = watchers_.find(watch_id);
  if (it == watchers_.end() || it->second.final_queued) return;
  Watcher& w = it->second;
  if (w.pending.size() >= kMaxPendingUpdates) w.pending.pop_front();  // slow reader
  w.pending.push_back(std::move(update));
  w.final_queued = final;
  if (w.wake) deferred_->Add(w.wake);
}

void WatchHub::PushToSearch(const std::string& search_id, const v1::SearchProgress& update,
                            bool final) {
  auto it = by_search_.find(search_id);
  if (it == by_search_.end()) return;
  for (uint64_t id : it->second) Push(id, update, final);
}

bool WatchHub::HasWatchers(const std::string& search_id) const {
  auto it = by_search_.find(search_id);
  return it != by_search_.end() && !it->second.empty();
}

void WatchHub::DetachSearch(const std::string& search_id) {
  auto it = by_search_.find(search_id);
  if (it == by_search_.end()) return;
  for (uint64_t id : it->second) {
    if (auto w = watchers_.find(id); w != watchers_.end()) w->second.search_id.clear();
  }
  by_search_.erase(it);
}

WatchPoll WatchHub::Poll(uint64_t watch_id, v1::SearchProgress* update) {
  auto it = watchers_.find(watch_id);
  if (it == watchers_.end()) return WatchPoll::kClosed;
  Watcher& w = it->second;
  if (!w.pending.empty()) {
    *update = std::move(w.pending.front());
    w.pending.pop_front();
    if (w.pending.empty() && w.final_queued) {
      Erase(it);
      return WatchPoll::kFinal;
    }
    return WatchPoll::kUpdate;
  }
  if (w.closed) {
    Erase(it);
    return WatchPoll::kClosed;
  }
  return WatchPoll::kNone;
}

void WatchHub::Remove(uint64_t watch_id) {
  auto it = watchers_.find(watch_id);
  if (it != watchers_.end()) Erase(it);
}

void WatchHub::CloseAll() {
  for (auto& [id, w] : watchers_) {
    w.closed = true;
    if (w.wake) deferred_->Add(w.wake);
  }
}

void WatchHub::Erase(std::unordered_map<uint64_t, Watcher>::iterator it) {
  if (auto s = by_search_.find(it->second.search_id); s != by_search_.end()) {
    auto& ids = s->second;
    ids.erase(std::remove(ids.begin(), ids.end(), it->first), ids.end());
    if (ids.empty()) by_search_.erase(s);
  }
  watchers_.erase(it);
}

}  // namespace remat::server
