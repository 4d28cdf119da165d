// The API views of searches (v1::Search, v1::SearchProgress, v1::SearchSummary, v1::Trial),
// built from an active SearchRun or from the store's records of a finished search.
//
// Thread-safety: pure functions of their arguments (a SearchRun is read under the Scheduler's
// mutex).
#pragma once

#include <cstdint>
#include <vector>

#include "remat/v1/remat.pb.h"
#include "server/job_store.h"
#include "server/search_run.h"

namespace remat::server {

v1::Trial TrialView(const TrialRecord& t);

// A search from its record and trials; trials_planned is at least the number of trials. Besides
// the record it carries what clients would otherwise have to decide: the budget in bytes, the
// memory metric and the fragmentation findings (from `spec` and the domain `results` of the
// finished trials).
v1::Search SearchView(const SearchRecord& rec, const std::vector<const TrialRecord*>& trials,
                      int planned, const search::SearchSpec& spec,
                      const std::vector<search::TrialResult>& results);
// A search no longer in memory, from the store's records.
v1::Search StoredSearchView(const SearchRecord& rec, const std::vector<TrialRecord>& trials);
// An active search, with the frontier and recommendation of what has been measured so far.
v1::Search ActiveSearchView(const SearchRun& s);

// The progress of an active search; `last` is the trial that just changed (may be null);
// elapsed and ETA are measured up to `unix_now_ms`.
v1::SearchProgress ProgressView(const SearchRun& s, const RunTrial* last, int64_t unix_now_ms);
// The one (final) progress update of a search that is no longer in memory.
v1::SearchProgress StoredProgressView(const SearchRecord& rec,
                                      const std::vector<TrialRecord>& trials);

v1::SearchSummary SummaryView(const SearchSummaryRecord& row);

}  // namespace remat::server
