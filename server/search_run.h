// SearchRun: one unfinished search in the coordinator's memory: its spec, its search::Strategy,
// its trials in proposal order, the queue of pending trials, and the domain results the strategy
// and the frontier are computed from. It holds the rules of one search's life cycle (what a
// submit must carry, how a stored search is rebuilt, how a trial moves between pending, leased
// and final, how a finished search is concluded); the Scheduler moves trials between searches
// and workers and writes every change to the JobStore before applying it here.
//
// Thread-safety: none; the Scheduler calls it under its mutex.
// Fallible calls return absl::Status: InvalidArgument naming the field, or the store's error.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "remat/v1/remat.pb.h"
#include "search/frontier.h"
#include "search/planner.h"
#include "search/spec.h"
#include "search/trial.h"
#include "server/job_store.h"

namespace remat::server {

// A final trial status (ok, oom, failed, timeout, invalid, cancelled).
bool IsFinal(v1::TrialStatus s);
// A finished search (succeeded, failed, cancelled).
bool IsFinished(v1::SearchState s);

// The domain form of a stored result of `policy`; a result that cannot be read becomes a failed
// one, so a strategy still observes every trial it proposed.
search::TrialResult ResultToDomain(const std::string& policy, const v1::TrialResult& msg);

// Checks a result that came over the wire (a worker's report, a replay entry sent with a
// search) against the trial's spec: one of the six named final statuses (a proto3 enum holds any
// int32), figures that are finite and not negative, an ok result with its step time, step times
// 0 or within [limits::kMinStepTimeS, limits::kMaxTrialTimeoutS], one result per rank and ranks
// below `world_size` (the layout's world size, for reports and replay entries alike: a layout
// proxy's result lists every rank of the layout though its trial leased one slot), bounded lists
// and versions. InvalidArgument naming `where` and the field ("result.ranks[2].rank: ..."). The
// message is not checked: the caller bounds it (search/text.h BoundedUtf8).
absl::Status ValidateWireResult(const v1::TrialResult& result, const std::string& where,
                                int world_size);

struct RunTrial {
  TrialRecord rec;
  // A second measurement of a near-tie (search/remeasure.h): not the strategy's, and never
  // taken from the results cache (that would return the first measurement).
  bool remeasure = false;
  // Joined: the running trial (of another search) with the same results-cache key whose result
  // this one takes when it ends ok or oom (Scheduler::State::Join); "" otherwise. A joined trial
  // is pending in the store and in no queue; it counts as outstanding.
  std::string joined_to;
  // Why the last report that answered its lease was refused ("" if none): said again when the
  // trial loses its lease, so the reason reaches the search.
  std::string refused_report;
  int64_t leased_ms = 0;     // monotonic time of the current lease
  int64_t confirmed_ms = 0;  // last time the holder listed it in a heartbeat (or leased it)
};

// The one place the coordinator puts a trial's policy on a result: whatever reports it (a
// worker, the results cache) is recorded under the trial's own policy string.
v1::TrialResult ResultOfTrial(const RunTrial& t, v1::TrialResult result);
// A result the coordinator decides itself (cancelled, lost its worker too often).
v1::TrialResult CoordinatorResult(const RunTrial& t, v1::TrialStatus status, std::string message);

struct SearchRun {
  // A new search from a submit request (not yet stored, no id, no strategy): the spec validated
  // and resolved, the replay table's keys made canonical. InvalidArgument naming the field.
  static absl::StatusOr<std::unique_ptr<SearchRun>> FromRequest(
      const std::string& owner, const v1::SubmitSearchRequest& request);
  // A stored unfinished search (no trials yet, no strategy); InvalidArgument when its spec can
  // no longer be read.
  static absl::StatusOr<std::unique_ptr<SearchRun>> FromRecord(SearchRecord rec);

  // Rebuilds the trials from the store and restores the strategy from them. Final trials become
  // results, pending ones are queued; for each leased one `keep_lease(trial)` decides: true keeps
  // it leased (the caller counts it running), false queues it again (the caller requeued it in
  // the store), an error stops the rebuild.
  absl::Status RestoreTrials(std::vector<TrialRecord> records,
                             const std::function<absl::StatusOr<bool>(RunTrial&)>& keep_lease);

  std::vector<search::FrontierPoint> Frontier() const;
  // One result per policy (search::CombineRemeasured): what the frontier and the
  // recommendation are computed from.
  std::vector<search::TrialResult> Measured() const;
  // The total shown in progress: the strategy's estimate when the search starts, raised (to the
  // strategy's estimate then) only when more trials are proposed than it says, never lowered while
  // the search runs (a finished search shows its trials). `planned_revised_from` is the total
  // shown before the last raise (0: never raised), so progress can say it was revised.
  int PlannedTotal() const;
  void RevisePlannedTotal();
  // Anything queued, leased, joined to another search's trial, or proposed and not yet stored.
  bool Outstanding() const {
    return !queue.empty() || running > 0 || joined > 0 || !unsaved.empty();
  }
  // With backend replay: the table's entry for `policy` (nullptr when absent or not replay).
  const v1::ReplayEntry* ReplayFor(const std::string& policy) const;

  // New trials so that the queue holds `target` trials (proposed by the strategy, kept in
  // `unsaved` until stored), as records to store; ids from `new_id`.
  std::vector<TrialRecord> Proposals(int64_t target, const std::function<std::string()>& new_id);
  // The records Proposals returned were stored: queue them. Returns the new trials.
  std::vector<RunTrial*> Enqueue(std::vector<TrialRecord> stored);

  // Trial moves (the store already has them).
  void MarkLeased(RunTrial& t, int32_t attempt, const std::string& worker_id, int64_t now_ms);
  void Requeue(RunTrial& t);  // a lost lease: back to the front of the queue
  // A queued trial waits for `leader_id`'s result instead of running (it leaves the queue); Unjoin
  // puts it back at the front of the queue (the leader ended without a result to share).
  void Join(RunTrial& t, const std::string& leader_id);
  void Unjoin(RunTrial& t);
  // A final result (ResultOfTrial / CoordinatorResult): the trial leaves the queue or its
  // lease, the strategy observes it (a re-measure: once the round's last one is final, the
  // strategy observes every re-measured policy's runs pooled, all at once, so what it does next
  // does not depend on the order they finished in).
  void MarkFinal(RunTrial& t, const v1::TrialResult& result, const std::string& by_worker);
  // When the re-measure round was proposed and every re-measure is final: the strategy observes
  // their pooled runs, once.
  void ObserveRemeasuresOnceFinal();
  // Cancels every trial not yet final; `on_cancel(trial)` runs first for each.
  void CancelAll(const std::string& message, const std::function<void(RunTrial&)>& on_cancel);

  // The current frontier, recommendation and apply strings into `out`.
  void FillFrontier(SearchRecord* out) const;
  // Frontier, recommendation, apply, message and final state (succeeded when some trial
  // measured something, failed otherwise) into `rec`.
  void Conclude();

  SearchRecord rec;
  search::SearchSpec spec;
  std::unique_ptr<search::Strategy> strategy;
  int world_size = 1;  // slots a trial leases (search::TrialSlots: 1 for a layout proxy)
  std::string backend;                            // search::Name of the spec's backend
  std::vector<std::unique_ptr<RunTrial>> trials;  // proposal order
  std::deque<RunTrial*> queue;                    // pending, in the order they should run
  int running = 0;
  int joined = 0;  // trials joined to another search's running trial
  int done = 0;
  std::vector<search::TrialResult> results;  // finished (re-measures included), in that order
  std::vector<search::Candidate> unsaved;    // proposed, not yet written to the store
  // The one round of near-tie re-measures (search/remeasure.h) was proposed: once the strategy
  // is done and nothing is outstanding, before the search concludes.
  bool remeasure_proposed = false;
  // Every re-measure of that round is final and the strategy has their pooled runs
  // (Strategy::ObserveRemeasured): it may have gone on.
  bool remeasures_observed = false;
  bool finalize_pending = false;             // finished, but the store write failed
  // Since when (monotonic ms) no connected worker could run its trials while some worker was
  // connected; 0: not waiting so (Scheduler::State::CheckServed).
  int64_t unserved_since_ms = 0;
  int planned_shown = 0;                     // see PlannedTotal
  int planned_revised_from = 0;
};

}  // namespace remat::server
