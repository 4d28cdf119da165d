// Scheduler::State: the Scheduler's internals, shared by its two source files (scheduler.cc:
// the public methods; scheduler_state.cc: the transitions below). Not a public header: only the
// Scheduler includes it.
//
// It ties the parts together: a trial moves between a search's queue (SearchRun), a worker's
// lease (WorkerRegistry) and its final result, each change written to the JobStore first;
// parked LeaseTrial calls (LeaseWaiters) get work as it is queued; watchers (WatchHub) get a
// progress update on every change.
//
// Thread-safety: every member is guarded by mu_; every method expects it held (see Locked).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "server/deferred_calls.h"
#include "server/lease_waiters.h"
#include "server/logging.h"
#include "server/scheduler.h"
#include "server/search_run.h"
#include "server/watch_hub.h"
#include "server/worker_registry.h"

namespace remat::server {

class Scheduler::State {
 public:
  State(SchedulerOptions options, JobStore* store, Metrics* metrics);

  // Holds the mutex; runs the callbacks deferred under it after releasing it.
  class Locked {
   public:
    explicit Locked(State* s) : s_(s), lock_(s->mu_) {}
    ~Locked() {
      std::vector<std::function<void()>> run = s_->deferred_.Take();
      lock_.unlock();
      for (auto& f : run) f();
    }

   private:
    State* s_;
    std::unique_lock<std::mutex> lock_;
  };

  int64_t Now() const { return opt_.monotonic_ms(); }
  int64_t UnixNow() const { return opt_.unix_ms(); }
  std::string NewId(const char* prefix);

  void PublishGauges();
  void CountState(v1::SearchState from, v1::SearchState to);
  void PublishFrontier(SearchRun& s);
  // Keeps the set of searches with queued trials (for the round robin) up to date.
  void UpdateReady(SearchRun& s);
  // Sends watchers of `s` its progress; `last` is the trial that just changed (may be null).
  void Notify(SearchRun& s, const RunTrial* last);

  // A worker was heard from; one coming back frees its slots for every search's refill.
  void Touch(WorkerEntry& w);

  // Rebuilds the unfinished searches and the workers from the store (Scheduler::Resume).
  absl::Status ResumeFromStore();

  // Writes the search's state and derived fields.
  absl::Status SaveSearch(SearchRun& s);
  // Proposes trials until the search's queue holds its share of the free slots (free_slots < 0:
  // the current ones), and writes them to the store. Candidates that could not be written are
  // kept and written next time.
  void Refill(SearchRun& s, int64_t free_slots = -1);
  void RefillAll();
  // Ends the search when nothing is outstanding and the strategy is done (or can propose
  // nothing more). Returns true when the search left memory.
  bool MaybeFinish(SearchRun& s);
  // Records the final state with frontier, recommendation and apply, and retires the search.
  // Returns false when the store refused (retried on the next Tick).
  bool Finish(SearchRun& s);
  // Removes a finished search from memory after telling its watchers.
  void Retire(SearchRun& s);

  // Applies a final result that the store has recorded. Returns true when the search ended.
  bool Apply(SearchRun& s, RunTrial& t, const v1::TrialResult& result,
             const std::string& by_worker);
  // A lease was lost (silent worker, or the worker no longer runs it): requeue the trial, or
  // fail it after max_trial_attempts. Returns false when the store refused (retry later).
  bool LoseLease(SearchRun& s, RunTrial& t, const std::string& reason);
  // The stored lease of trial `t` to worker `w` (attempt `attempt`), applied in memory.
  void Lease(SearchRun& s, RunTrial& t, WorkerEntry& w, int32_t attempt);
  // The results cache key of trial `t` measured by worker `w`.
  std::string CacheKey(const SearchRun& s, const RunTrial& t, const WorkerEntry& w) const;

  // Joining (identical searches give identical answers whatever their timing). A
  // queued trial whose results-cache key equals that of a trial running for another search (the
  // key as if it ran on that trial's worker) does not run: it joins the running one, leaves its
  // queue (its search proposes its next trial then, as a lease would make it) and takes the
  // result when the running trial reports ok or oom. When the running trial ends otherwise (a
  // failure, a lost lease, a cancelled search) its joined trials go back to the front of their
  // queues. A re-measure neither joins nor is joined (it must measure again).
  //
  // `t` of `s` was just leased to `w`: it may be joined from now on, and identical trials queued
  // in other searches join it now.
  void OfferToJoin(SearchRun& s, RunTrial& t, const WorkerEntry& w);
  // Joins queued trial `t` of `s` to an identical running trial of another search, if any.
  bool JoinRunning(SearchRun& s, RunTrial& t);
  // Trial `leader_id` stopped running: its joined trials take `result` (as reused) when it is
  // not null, or go back to the front of their queues.
  void ReleaseFollowers(const std::string& leader_id, const v1::TrialResult* result);
  // A queued search whose trial was leased or joined is running.
  void MarkRunning(SearchRun& s);
  // Why no connected worker can run `s`'s queued trials ("waiting: ..."), "" when one can or
  // nothing waits; *any_connected: some worker is connected at all.
  std::string UnservedReason(const SearchRun& s, bool* any_connected) const;
  // Keeps `s`'s waiting message up to date and fails it once it waited unserved longer than
  // unserved_search_timeout_s (SchedulerOptions). Returns true when the search ended.
  bool CheckServed(SearchRun& s);

  // Hands queued trials to worker `w` while they fit in `free` slots, fair across searches
  // (round robin). Trials found in the results cache are recorded as reused on the way.
  // Stops adding trials before the reply outgrows limits::kMaxLeaseReplyBytes (one trial always
  // goes: a submitted search fits the transport).
  absl::StatusOr<v1::LeaseTrialResponse> Allocate(WorkerEntry& w, int free);
  // RESOURCE_EXHAUSTED when `owner`'s active searches, plus one with `planned` trials, would
  // exceed the per-user limits (SchedulerOptions).
  absl::Status CheckQuota(const std::string& owner, int64_t planned) const;
  // Gives newly queued work to parked LeaseTrial calls, oldest first.
  void ServeWaiters();

  SchedulerOptions opt_;
  JobStore* store_;
  Metrics* metrics_;
  std::shared_ptr<spdlog::logger> log_;

  std::mutex mu_;
  DeferredCalls deferred_;
  std::mt19937_64 rng_;
  bool shutdown_ = false;
  // Whether Resume has rebuilt the unfinished searches. Public calls wait for it (without mu_,
  // which Resume holds) up to kResumeWaitMs, then answer UNAVAILABLE: the coordinator listens
  // before it resumes.
  bool WaitResumed();
  void MarkResumed();
  std::atomic<bool> resumed_{false};
  std::mutex resume_mu_;
  std::condition_variable resume_cv_;

  std::map<std::string, std::unique_ptr<SearchRun>> active_;
  std::unordered_map<std::string, std::pair<SearchRun*, RunTrial*>> trial_index_;
  std::set<std::string> ready_;  // searches with queued trials
  std::unordered_map<std::string, std::string> running_keys_;  // running trial id -> cache key
  std::unordered_map<std::string, std::vector<std::string>> followers_;  // id -> joined trial ids
  std::string cursor_;           // round robin: the search served last
  WorkerRegistry workers_;
  std::map<v1::SearchState, int64_t> state_counts_;
  std::set<std::string> frontier_series_;
  WatchHub watches_;
  LeaseWaiters waiters_;

 private:
  // The next search (round robin after the last one served) with a queued trial that fits.
  SearchRun* NextReady(const WorkerEntry& w, int free);
};

}  // namespace remat::server
