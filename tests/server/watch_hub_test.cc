// WatchHub on its own: queues, wake-ups through DeferredCalls, the final update, slow readers.
#include "server/watch_hub.h"

#include <gtest/gtest.h>

namespace remat::server {
namespace {

v1::SearchProgress Update(int done) {
  v1::SearchProgress p;
  p.set_trials_done(done);
  return p;
}

TEST(WatchHubTest, UpdatesArriveInOrderAndTheFinalOneEndsTheWatcher) {
  DeferredCalls deferred;
  WatchHub hub(&deferred);
  int wakes = 0;
  const uint64_t id = hub.Add("s-1", [&] { ++wakes; });
  EXPECT_TRUE(hub.HasWatchers("s-1"));
  hub.PushToSearch("s-1", Update(1), false);
  hub.PushToSearch("s-1", Update(2), true);
  hub.PushToSearch("s-1", Update(3), false);  // after the final one: ignored
  for (auto& f : deferred.Take()) f();
  EXPECT_EQ(wakes, 2);

  v1::SearchProgress got;
  EXPECT_EQ(hub.Poll(id, &got), WatchPoll::kUpdate);
  EXPECT_EQ(got.trials_done(), 1);
  EXPECT_EQ(hub.Poll(id, &got), WatchPoll::kFinal);
  EXPECT_EQ(got.trials_done(), 2);
  EXPECT_EQ(hub.Poll(id, &got), WatchPoll::kClosed);
  EXPECT_FALSE(hub.HasWatchers("s-1"));
}

TEST(WatchHubTest, NothingQueuedPollsNoneAndWakesNoOne) {
  DeferredCalls deferred;
  WatchHub hub(&deferred);
  const uint64_t id = hub.Add("s-1", [] {});
  v1::SearchProgress got;
  EXPECT_EQ(hub.Poll(id, &got), WatchPoll::kNone);
  EXPECT_TRUE(deferred.Take().empty());
  hub.PushToSearch("s-other", Update(1), false);
  EXPECT_EQ(hub.Poll(id, &got), WatchPoll::kNone);
}

TEST(WatchHubTest, ASlowReaderKeepsTheNewestUpdates) {
  DeferredCalls deferred;
  WatchHub hub(&deferred);
  const uint64_t id = hub.Add("s-1", nullptr);
  const int n = static_cast<int>(WatchHub::kMaxPendingUpdates) + 10;
  for (int i = 1; i <= n; ++i) hub.Push(id, Update(i), i == n);
  v1::SearchProgress got;
  EXPECT_EQ(hub.Poll(id, &got), WatchPoll::kUpdate);
  EXPECT_EQ(got.trials_done(), 11);  // the ten oldest were dropped
  WatchPoll last = WatchPoll::kUpdate;
  while (last == WatchPoll::kUpdate) last = hub.Poll(id, &got);
  EXPECT_EQ(last, WatchPoll::kFinal);
  EXPECT_EQ(got.trials_done(), n);
}

TEST(WatchHubTest, DetachedWatchersDrainWhatIsQueued) {
  DeferredCalls deferred;
  WatchHub hub(&deferred);
  const uint64_t a = hub.Add("s-1", nullptr);
  const uint64_t b = hub.Add("s-1", nullptr);
  hub.PushToSearch("s-1", Update(5), true);
  hub.DetachSearch("s-1");
  EXPECT_FALSE(hub.HasWatchers("s-1"));
  v1::SearchProgress got;
  EXPECT_EQ(hub.Poll(a, &got), WatchPoll::kFinal);
  EXPECT_EQ(hub.Poll(b, &got), WatchPoll::kFinal);
}

TEST(WatchHubTest, RemoveAndCloseAll) {
  DeferredCalls deferred;
  WatchHub hub(&deferred);
  const uint64_t a = hub.Add("s-1", nullptr);
  int wakes = 0;
  const uint64_t b = hub.Add("s-2", [&] { ++wakes; });
  hub.Remove(a);
  EXPECT_FALSE(hub.HasWatchers("s-1"));
  v1::SearchProgress got;
  EXPECT_EQ(hub.Poll(a, &got), WatchPoll::kClosed);
  hub.Push(b, Update(1), false);
  hub.CloseAll();
  for (auto& f : deferred.Take()) f();
  EXPECT_EQ(wakes, 2);
  EXPECT_EQ(hub.Poll(b, &got), WatchPoll::kUpdate);  // what was queued still comes
  EXPECT_EQ(hub.Poll(b, &got), WatchPoll::kClosed);
}

}  // namespace
}  // namespace remat::server
