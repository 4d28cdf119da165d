// JobStore: the coordinator's durable state (searches with their spec and replay table, trials
// with per-rank results, workers, the results cache) behind an interface, so tests can inject
// faults. The real implementation is SQLite in WAL mode (sqlite_store.h).
//
// Every mutating call is one transaction: it either happens completely or not at all, and a
// process killed at any moment leaves the last committed state. The scheduler writes the store
// first and changes its memory only when the write succeeded, so a failed write is a failed
// call (the worker or client retries), never a divergence between memory and disk.
//
// Thread-safety: implementations must be safe to call from several threads, but the scheduler
// serialises its calls under its own lock anyway. Fallible calls return absl::Status
// (Unavailable/Internal for I/O and SQL errors, NotFound for an unknown id).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "remat/v1/remat.pb.h"

namespace remat::server {

// One search as stored. Trials live in their own records.
struct SearchRecord {
  std::string id;
  std::string owner;
  v1::SearchState state = v1::SEARCH_STATE_QUEUED;
  v1::SearchSpec spec;            // resolved (Megatron defaults filled in)
  v1::ReplayTable replay_table;   // with backend replay
  std::vector<std::string> frontier;
  std::optional<std::string> recommendation;
  v1::Apply apply;
  std::string message;
  int64_t created_unix_ms = 0;
  int64_t updated_unix_ms = 0;
  int32_t trials_planned = 0;
};

// One trial as stored. `status` is PENDING (queued), RUNNING (leased) or final; `result` is set
// exactly when the status is final.
struct TrialRecord {
  std::string id;
  std::string search_id;
  int32_t seq = 0;          // proposal order within its search, from 0
  std::string policy;       // canonical policy string
  std::string reason;       // why the planner proposed it
  v1::TrialStatus status = v1::TRIAL_STATUS_PENDING;
  int32_t attempts = 0;     // leases handed out so far
  std::string worker_id;    // the worker holding (or that last held) the lease
  std::optional<v1::TrialResult> result;
};

struct WorkerRecord {
  std::string id;
  std::string hostname;
  v1::RegisterRequest registration;  // gpus, versions, backends, templates
  int64_t registered_unix_ms = 0;
};

// A row of ListSearches, without the trials.
struct SearchSummaryRecord {
  SearchRecord search;
  int32_t trials_done = 0;
};

class JobStore {
 public:
  virtual ~JobStore() = default;

  // Searches.
  virtual absl::Status CreateSearch(const SearchRecord& search) = 0;
  // Writes state, frontier, recommendation, apply, message, updated time and trials_planned.
  virtual absl::Status UpdateSearch(const SearchRecord& search) = 0;
  virtual absl::StatusOr<std::optional<SearchRecord>> LoadSearch(const std::string& id) = 0;
  // Searches whose state is queued or running, oldest first.
  virtual absl::StatusOr<std::vector<SearchRecord>> LoadUnfinishedSearches() = 0;
  // Newest first; `owner` nullopt = everyone's.
  virtual absl::StatusOr<std::vector<SearchSummaryRecord>> ListSearches(
      const std::optional<std::string>& owner, int limit) = 0;
  // Number of searches in each state (for the remat_searches gauge at start-up).
  virtual absl::StatusOr<std::map<v1::SearchState, int64_t>> CountSearchesByState() = 0;
  // Cancels a search: its state becomes cancelled and every non-final trial gets status
  // cancelled with `message`, in one transaction.
  virtual absl::Status CancelSearch(const std::string& search_id, int64_t now_unix_ms,
                                    const std::string& message) = 0;

  // Trials.
  virtual absl::Status AddTrials(const std::vector<TrialRecord>& trials) = 0;
  // All trials of a search, in proposal order.
  virtual absl::StatusOr<std::vector<TrialRecord>> LoadTrials(const std::string& search_id) = 0;
  // Records a lease: status RUNNING, attempts = `attempt`, worker_id.
  virtual absl::Status LeaseTrial(const std::string& trial_id, int32_t attempt,
                                  const std::string& worker_id) = 0;
  // Back to the queue after a lost lease (attempts are kept).
  virtual absl::Status RequeueTrial(const std::string& trial_id) = 0;
  // Records the final result of a trial that has none yet (also its per-rank rows and, when
  // `cache_key` is non-empty, a results-cache entry). Returns false without writing when the
  // trial already has a final result: that is how duplicate reports are recognised.
  virtual absl::StatusOr<bool> RecordResult(const std::string& trial_id,
                                            const v1::TrialResult& result,
                                            const std::string& worker_id,
                                            const std::string& cache_key) = 0;

  // Workers.
  virtual absl::Status UpsertWorker(const WorkerRecord& worker) = 0;
  virtual absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers() = 0;

  // Results cache: a measured result (ok or oom) under its key (see cache_key.h).
  virtual absl::StatusOr<std::optional<v1::TrialResult>> LookupCache(const std::string& key) = 0;
};

// Opens (creating when new) the SQLite store at `path` (":memory:" allowed), in WAL mode with
// synchronous=NORMAL: a committed transaction survives the process being killed (SIGKILL); only
// an OS crash or power loss can lose the last transactions.
absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteStore(const std::string& path);

}  // namespace remat::server
