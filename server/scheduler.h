// Scheduler: the coordinator's service logic as a plain class (no gRPC), which the RPC layer
// (grpc_service.h) wraps method for method. It owns the in-memory state of every unfinished
// search (its search::Strategy, queue and leases), the workers, lease long-polls and watchers,
// and writes every change to the JobStore before applying it in memory.
//
// Protocol, as workers and clients see it (also in server/README.md):
//   - Register: a worker offers slots (one per Gpu entry; none = one slot), backends and command
//     templates. Re-registering with a known worker_id keeps the id and its leases.
//   - Any call from a worker counts as a sign of life. A worker silent for lease_timeout_s loses
//     its leases: each trial goes back to the front of its search's queue, or, after
//     max_trial_attempts leases, is recorded as failed with the reason.
//   - Heartbeat.running_trial_ids must list every trial leased to the worker and not yet
//     reported (running, or with a report waiting to be delivered). The answer's
//     cancel_trial_ids names listed trials the worker must stop (cancelled, finished elsewhere,
//     or unknown, or not leased to this worker: a heartbeat never leases; a worker takes back
//     only a trial whose last lease was its own, requeued while it still ran it and leased to
//     no one since). A lease the worker has not listed for lease_timeout_s is treated as lost.
//     reregister=true: the coordinator does not know this worker id; call Register again
//     (passing the old id keeps it).
//   - LeaseTrial: trials whose world size fits the free slots (a trial of world size W needs W
//     slots on this worker), fair across searches (round robin). With wait_s > 0 the call waits
//     up to min(wait_s, max_lease_wait_s) for work; it answers empty when none came. A trial
//     whose result is already in the results cache is recorded as reused instead of handed out.
//     Unknown worker id: FAILED_PRECONDITION ("register first").
//   - ReportTrial: the first final result for a trial is recorded (any attempt, so a late report
//     from a worker whose lease expired is not lost); every later one, and a report for an
//     unknown or finished trial, answers accepted=false (not an error: drop it). A result the
//     trial's spec rules out (search_run.h ValidateWireResult: a status other than the named
//     final ones, two results for one rank, ...) is INVALID_ARGUMENT, and the reason goes into
//     the trial's message if it then loses its lease.
//   - Register: every field bounded (search/limits.h: names, slots, backends, templates,
//     versions, size); INVALID_ARGUMENT naming the field.
//
// Structure: a locked facade over separate parts, each with its own header and tests:
// SearchRun (one search: strategy, trials, queue, results; search_run.h), WorkerRegistry
// (workers, slots, leases; worker_registry.h), LeaseWaiters (parked long polls;
// lease_waiters.h), WatchHub (watchers; watch_hub.h) and the API views (search_views.h).
// Scheduler::State (scheduler_state.h, internal) ties them together under one mutex.
//
// Thread-safety: every public method may be called from any thread; one mutex guards the state
// and store writes happen under it. Callbacks (lease completions, watch wake-ups) are run after
// the mutex is released, never under it, so they may call back into the Scheduler.
// Fallible calls return absl::Status: InvalidArgument (bad spec/request, naming the field),
// NotFound (unknown search, or another user's), FailedPrecondition, Unavailable (store errors;
// retry) or Internal.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "remat/v1/remat.pb.h"
#include "search/planner.h"
#include "search/spec.h"
#include "server/auth.h"
#include "server/job_store.h"
#include "server/lease_waiters.h"
#include "server/watch_hub.h"

namespace remat::server {

class Metrics;

struct SchedulerOptions {
  double heartbeat_interval_s = 2;
  double lease_timeout_s = 15;
  int max_trial_attempts = 3;
  double max_lease_wait_s = 10;
  int max_frontier_series = 200;  // remat_frontier_points series at most (active searches)
  // Per owner (CoordinatorOptions): active searches and their trials not yet final; 0 = any.
  int max_searches_per_user = 100;
  int64_t max_trials_per_user = 100000;
  // A search whose trials no connected worker can run (backend, command template, or world size
  // over every worker's slots) says why in its message at once ("waiting: ..."), and fails after
  // this many seconds of it while some worker is connected (0: waits for ever). With no worker
  // connected at all it waits without a deadline (the pool is still coming up).
  double unserved_search_timeout_s = 600;
  // Monotonic milliseconds for leases and long polls, and Unix milliseconds for timestamps.
  std::function<int64_t()> monotonic_ms;
  std::function<int64_t()> unix_ms;
  // Seam: builds the strategy of a search (default search::MakeStrategy).
  std::function<std::unique_ptr<search::Strategy>(const search::SearchSpec&)> make_strategy;
};

class Scheduler {
 public:
  // `store` must outlive the scheduler; `metrics` may be null.
  Scheduler(SchedulerOptions options, JobStore* store, Metrics* metrics);
  ~Scheduler();

  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Loads every unfinished search from the store and rebuilds it: the strategy is restored from
  // the recorded trials, queued trials are queued again, leased ones stay leased to their
  // worker for one lease timeout (the worker may still report them) and are requeued if it stays
  // silent. Call once. Until it has returned ok, every other call answers UNAVAILABLE ("coordinator
  // is starting"): the coordinator listens first, then resumes, so a restart with many searches
  // to re-plan is reachable at once.
  absl::Status Resume();

  // RematService.
  absl::StatusOr<v1::SubmitSearchResponse> SubmitSearch(const Principal& who,
                                                        const v1::SubmitSearchRequest& request);
  absl::StatusOr<v1::Search> GetSearch(const Principal& who, const std::string& id);
  absl::StatusOr<v1::CancelSearchResponse> CancelSearch(const Principal& who,
                                                        const std::string& id);
  absl::StatusOr<v1::ListSearchesResponse> ListSearches(const Principal& who, int limit);

  // Watching: Watch registers a watcher and queues the current state as its first update;
  // `wake` is called (outside the lock, possibly spuriously) whenever updates are waiting, and
  // the watcher pulls them with PollWatch. After the final update (a finished search) the
  // watcher is removed. Unwatch removes it early (the client went away).
  using WatchPoll = server::WatchPoll;
  absl::StatusOr<uint64_t> Watch(const Principal& who, const std::string& id,
                                 std::function<void()> wake);
  WatchPoll PollWatch(uint64_t watch_id, v1::SearchProgress* update);
  void Unwatch(uint64_t watch_id);

  // WorkerService. `credential` is the caller's (Principal::credential; "" without worker
  // tokens). A worker id is bound to the credential that registered it: another credential gets
  // PERMISSION_DENIED when it registers, heartbeats, leases or reports under that id (an id
  // stored without one, from before tokens were required, goes to the next that registers it).
  // Worker ids are at most 64 letters, digits, '-', '_' or '.' (INVALID_ARGUMENT otherwise). A
  // report is accepted only for the lease it answers: the trial's current worker and attempt.
  absl::StatusOr<v1::RegisterResponse> Register(const v1::RegisterRequest& request,
                                                const std::string& credential = "");
  absl::StatusOr<v1::HeartbeatResponse> Heartbeat(const v1::HeartbeatRequest& request,
                                                  const std::string& credential = "");
  absl::StatusOr<v1::ReportTrialResponse> ReportTrial(const v1::ReportTrialRequest& request,
                                                      const std::string& credential = "");

  // LeaseTrial with long poll: `done` is called exactly once, either before LeaseTrial returns
  // (work was there, wait_s was 0, or an error) or later from another thread (work arrived,
  // the wait ended, CancelLeaseWait, Shutdown). Returns an id for CancelLeaseWait (0 when
  // `done` already ran).
  using LeaseDone = server::LeaseDone;
  uint64_t LeaseTrial(const v1::LeaseTrialRequest& request, LeaseDone done,
                      const std::string& credential = "");
  // The caller went away: ends the wait with an empty answer (no-op when already answered).
  void CancelLeaseWait(uint64_t wait_id);

  // Time passes: ends long polls past their deadline and expires the leases of silent workers.
  // The coordinator calls it from its timer thread; tests call it after moving their clock.
  void Tick();
  // Milliseconds (on monotonic_ms) until Tick has something to do; for the timer thread.
  int64_t MsUntilNextTick();

  // Ends every long poll (empty answers) and closes every watcher (PollWatch -> kClosed);
  // later LeaseTrial calls answer empty at once, later Watch calls are Unavailable.
  void Shutdown();

  class State;

 private:
  std::unique_ptr<State> state_;
};

}  // namespace remat::server
