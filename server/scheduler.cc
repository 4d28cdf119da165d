#include "server/scheduler.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "search/limits.h"
#include "search/text.h"
#include "server/cache_key.h"
#include "server/metrics.h"
#include "server/scheduler_state.h"
#include "server/search_views.h"
#include "server/status_util.h"

namespace remat::server {
namespace {

constexpr int kDefaultListLimit = 100;
constexpr int kMaxListLimit = 1000;
constexpr int64_t kTickPeriodMs = 250;
constexpr int kMinListedTrials = 1024;  // Heartbeat.running_trial_ids, whatever the slots

bool CanSee(const Principal& who, const std::string& owner) {
  return who.sees_all || who.name == owner;
}

// The id quoted, cut to limits::kMaxQuotedValueBytes on one line: a 10 KB id is not found like
// any other, not a reply whose status outgrows gRPC's metadata.
absl::Status NotFound(const std::string& id) {
  return absl::NotFoundError("search " + search::QuoteForError(id) + " not found");
}

// Every call before Resume returned: the coordinator listens first and resumes after, so a
// restart with many searches to re-plan answers at once (clients retry UNAVAILABLE).
absl::Status Resuming() {
  return absl::UnavailableError("coordinator is starting: resuming its searches (retry)");
}

}  // namespace

Scheduler::Scheduler(SchedulerOptions options, JobStore* store, Metrics* metrics) {
  if (!options.monotonic_ms) {
    options.monotonic_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
  if (!options.unix_ms) {
    options.unix_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
  }
  if (!options.make_strategy) options.make_strategy = search::MakeStrategy;
  state_ = std::make_unique<State>(std::move(options), store, metrics);
  if (metrics != nullptr) {
    State* st = state_.get();
    metrics->SetCollectHook([st] {
      std::lock_guard<std::mutex> lock(st->mu_);
      st->PublishGauges();
    });
  }
}

Scheduler::~Scheduler() {
  if (state_->metrics_ != nullptr) state_->metrics_->SetCollectHook(nullptr);
}

absl::Status Scheduler::Resume() {
  State::Locked lock(state_.get());
  REMAT_RETURN_IF_ERROR(state_->ResumeFromStore());
  state_->MarkResumed();
  return absl::OkStatus();
}

absl::StatusOr<v1::SubmitSearchResponse> Scheduler::SubmitSearch(
    const Principal& who, const v1::SubmitSearchRequest& request) {
  State& st = *state_;
  if (!st.WaitResumed()) return Resuming();
  // Validating and planning touch nothing shared: done before the lock, so a large spec never
  // holds up other users' calls or the workers' heartbeats.
  REMAT_ASSIGN_OR_RETURN(std::unique_ptr<SearchRun> run, SearchRun::FromRequest(who.name, request));
  SearchRun& s = *run;
  s.strategy = st.opt_.make_strategy(s.spec);
  const int planned = s.strategy->PlannedTotal();
  State::Locked lock(&st);
  if (st.shutdown_) return absl::UnavailableError("coordinator is shutting down");
  s.rec.id = st.NewId("s-");
  s.rec.created_unix_ms = s.rec.updated_unix_ms = st.UnixNow();
  s.rec.trials_planned = planned;
  REMAT_RETURN_IF_ERROR(st.CheckQuota(who.name, s.rec.trials_planned));
  REMAT_RETURN_IF_ERROR(st.store_->CreateSearch(s.rec));
  st.CountState(v1::SEARCH_STATE_UNSPECIFIED, v1::SEARCH_STATE_QUEUED);
  const std::string id = s.rec.id;
  st.active_.emplace(id, std::move(run));
  st.log_->info(
      "search={} submitted by {}: name=\"{}\" strategy={} backend={} world_size={} "
      "planned={}",
      id, who.name.empty() ? "anonymous" : who.name, s.spec.name,
      search::Name(s.spec.search.strategy), s.backend, s.world_size, s.rec.trials_planned);
  st.PublishFrontier(s);
  st.Refill(s);
  if (!st.MaybeFinish(s)) st.ServeWaiters();
  v1::SubmitSearchResponse out;
  out.set_id(id);
  return out;
}

absl::StatusOr<v1::Search> Scheduler::GetSearch(const Principal& who, const std::string& id) {
  State& st = *state_;
  if (!st.WaitResumed()) return Resuming();
  {
    State::Locked lock(&st);
    auto it = st.active_.find(id);
    if (it != st.active_.end()) {
      if (!CanSee(who, it->second->rec.owner)) return NotFound(id);
      return ActiveSearchView(*it->second);
    }
  }
  // Finished searches are read from the store, outside the lock.
  REMAT_ASSIGN_OR_RETURN(std::optional<SearchRecord> rec, st.store_->LoadSearch(id));
  if (!rec || !CanSee(who, rec->owner)) return NotFound(id);
  REMAT_ASSIGN_OR_RETURN(std::vector<TrialRecord> trials, st.store_->LoadTrials(id));
  return StoredSearchView(*rec, trials);
}

absl::StatusOr<v1::CancelSearchResponse> Scheduler::CancelSearch(const Principal& who,
                                                                 const std::string& id) {
  State& st = *state_;
  if (!st.WaitResumed()) return Resuming();
  State::Locked lock(&st);
  v1::CancelSearchResponse out;
  auto it = st.active_.find(id);
  if (it == st.active_.end()) {
    REMAT_ASSIGN_OR_RETURN(std::optional<SearchRecord> rec, st.store_->LoadSearch(id));
    if (!rec || !CanSee(who, rec->owner)) return NotFound(id);
    if (rec->state == v1::SEARCH_STATE_CANCELLED) {
      out.set_state(rec->state);
      return out;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("search ", id, " already ", StateLabel(rec->state)));
  }
  SearchRun& s = *it->second;
  if (!CanSee(who, s.rec.owner)) return NotFound(id);
  const std::string message =
      who.name.empty() ? "cancelled" : absl::StrCat("cancelled by ", who.name);
  REMAT_RETURN_IF_ERROR(st.store_->CancelSearch(id, st.UnixNow(), message));
  std::vector<std::string> stopped;  // its running trials: others' joined trials run instead
  s.CancelAll(message, [&](RunTrial& t) {
    if (t.rec.status == v1::TRIAL_STATUS_RUNNING) {
      st.workers_.DropLease(t.rec.worker_id, t.rec.id, s.world_size);
      stopped.push_back(t.rec.id);
    }
    if (st.metrics_ != nullptr) st.metrics_->TrialFinished(v1::TRIAL_STATUS_CANCELLED, false, 0);
  });
  st.CountState(s.rec.state, v1::SEARCH_STATE_CANCELLED);
  s.rec.state = v1::SEARCH_STATE_CANCELLED;
  s.rec.message = message;
  st.log_->info("search={} {}", id, message);
  st.Retire(s);
  for (const std::string& trial_id : stopped) st.ReleaseFollowers(trial_id, nullptr);
  if (!stopped.empty()) st.ServeWaiters();
  out.set_state(v1::SEARCH_STATE_CANCELLED);
  return out;
}

absl::StatusOr<v1::ListSearchesResponse> Scheduler::ListSearches(const Principal& who, int limit) {
  if (!state_->WaitResumed()) return Resuming();
  if (limit <= 0) limit = kDefaultListLimit;
  limit = std::min(limit, kMaxListLimit);
  std::optional<std::string> owner;
  if (!who.sees_all) owner = who.name;
  REMAT_ASSIGN_OR_RETURN(auto rows, state_->store_->ListSearches(owner, limit));
  v1::ListSearchesResponse out;
  for (const SearchSummaryRecord& row : rows) *out.add_searches() = SummaryView(row);
  return out;
}

absl::StatusOr<uint64_t> Scheduler::Watch(const Principal& who, const std::string& id,
                                          std::function<void()> wake) {
  State& st = *state_;
  if (!st.WaitResumed()) return Resuming();
  {
    State::Locked lock(&st);
    if (st.shutdown_) return absl::UnavailableError("coordinator is shutting down");
    auto it = st.active_.find(id);
    if (it != st.active_.end()) {
      SearchRun& s = *it->second;
      if (!CanSee(who, s.rec.owner)) return NotFound(id);
      const uint64_t handle = st.watches_.Add(id, std::move(wake));
      st.watches_.Push(handle, ProgressView(s, nullptr, st.UnixNow()), false);
      return handle;
    }
  }
  REMAT_ASSIGN_OR_RETURN(std::optional<SearchRecord> rec, st.store_->LoadSearch(id));
  if (!rec || !CanSee(who, rec->owner)) return NotFound(id);
  REMAT_ASSIGN_OR_RETURN(std::vector<TrialRecord> trials, st.store_->LoadTrials(id));
  v1::SearchProgress p = StoredProgressView(*rec, trials);
  State::Locked lock(&st);
  const uint64_t handle = st.watches_.Add("", std::move(wake));
  st.watches_.Push(handle, std::move(p), true);
  return handle;
}

Scheduler::WatchPoll Scheduler::PollWatch(uint64_t watch_id, v1::SearchProgress* update) {
  std::lock_guard<std::mutex> lock(state_->mu_);
  return state_->watches_.Poll(watch_id, update);
}

void Scheduler::Unwatch(uint64_t watch_id) {
  std::lock_guard<std::mutex> lock(state_->mu_);
  state_->watches_.Remove(watch_id);
}

namespace {

// Worker ids as the coordinator issues them are short and plain; anything else is refused before
// it can reach a message, a log line or reply metadata (a 10 KB id once turned NOT_FOUND into
// RESOURCE_EXHAUSTED).
absl::Status CheckWorkerId(const std::string& id) {
  const bool plain = id.size() <= 64 && std::all_of(id.begin(), id.end(), [](char c) {
                       return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' ||
                              c == '_' || c == '.';
                     });
  if (plain) return absl::OkStatus();
  return absl::InvalidArgumentError("worker_id: at most 64 letters, digits, '-', '_' or '.'");
}

// A registration is stored and kept in memory for as long as the worker is known: every field
// bounded as a spec's are (search/limits.h), so no caller can grow the coordinator with one.
absl::Status CheckRegistration(const v1::RegisterRequest& r) {
  namespace limits = search::limits;
  auto name = [](const std::string& value, const std::string& field) -> absl::Status {
    if (value.size() <= limits::kMaxNameBytes) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", search::QuoteForError(value),
                                                   " is longer than ", limits::kMaxNameBytes,
                                                   " bytes"));
  };
  auto count = [](int n, int64_t max, const std::string& field) -> absl::Status {
    if (n <= max) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", n, " entries, at most ", max));
  };
  if (r.ByteSizeLong() > limits::kMaxRegistrationBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "registration: ", r.ByteSizeLong(), " bytes, at most ", limits::kMaxRegistrationBytes));
  }
  REMAT_RETURN_IF_ERROR(name(r.hostname(), "hostname"));
  REMAT_RETURN_IF_ERROR(count(r.gpus_size(), limits::kMaxWorldSize, "gpus"));
  REMAT_RETURN_IF_ERROR(count(r.backends_size(), limits::kMaxWorkerBackends, "backends"));
  REMAT_RETURN_IF_ERROR(
      count(r.command_templates_size(), limits::kMaxWorkerCommandTemplates, "command_templates"));
  REMAT_RETURN_IF_ERROR(count(r.versions_size(), limits::kMaxVersionEntries, "versions"));
  for (const v1::Gpu& gpu : r.gpus()) {
    if (gpu.name().empty()) return absl::InvalidArgumentError("gpus.name: must not be empty");
    REMAT_RETURN_IF_ERROR(name(gpu.name(), "gpus.name"));
  }
  for (const std::string& b : r.backends()) REMAT_RETURN_IF_ERROR(name(b, "backends"));
  for (const std::string& t : r.command_templates()) {
    REMAT_RETURN_IF_ERROR(name(t, "command_templates"));
  }
  for (const auto& [key, value] : r.versions()) {
    REMAT_RETURN_IF_ERROR(name(key, "versions"));
    REMAT_RETURN_IF_ERROR(name(value, "versions[" + search::QuoteForError(key) + "]"));
  }
  return absl::OkStatus();
}

// Whether the caller holding `credential` may act as worker `w` (Scheduler::Register's rule).
absl::Status CheckOwner(const WorkerEntry& w, const std::string& credential) {
  const std::string& bound = w.rec.registration.credential();
  if (credential.empty() || bound.empty() || bound == credential) return absl::OkStatus();
  return absl::PermissionDeniedError("worker_id " + w.rec.id +
                                     ": registered by another worker token");
}

}  // namespace

absl::StatusOr<v1::RegisterResponse> Scheduler::Register(const v1::RegisterRequest& request,
                                                         const std::string& credential) {
  REMAT_RETURN_IF_ERROR(CheckWorkerId(request.worker_id()));
  REMAT_RETURN_IF_ERROR(CheckRegistration(request));
  State& st = *state_;
  if (!st.WaitResumed()) return Resuming();
  State::Locked lock(&st);
  if (!request.worker_id().empty()) {
    if (const WorkerEntry* known = st.workers_.Find(request.worker_id())) {
      REMAT_RETURN_IF_ERROR(CheckOwner(*known, credential));
    }
  }
  WorkerRecord rec;
  rec.id = request.worker_id().empty() ? st.NewId("w-") : request.worker_id();
  rec.hostname = request.hostname();
  rec.registration = request;
  rec.registration.set_worker_id(rec.id);
  rec.registration.set_credential(credential);  // never what the request says
  rec.registered_unix_ms = st.UnixNow();
  REMAT_RETURN_IF_ERROR(st.store_->UpsertWorker(rec));
  bool known = false;
  WorkerEntry& w = st.workers_.Register(std::move(rec), st.Now(), &known);
  st.log_->info("worker={} {}: host={} slots={} hardware=\"{}\" backends=[{}]", w.rec.id,
                known ? "re-registered" : "registered", w.rec.hostname, w.slots,
                HardwareSignature(request), absl::StrJoin(request.backends(), ","));
  st.RefillAll();
  st.ServeWaiters();
  v1::RegisterResponse out;
  out.set_worker_id(w.rec.id);
  out.set_heartbeat_interval_s(st.opt_.heartbeat_interval_s);
  out.set_lease_timeout_s(st.opt_.lease_timeout_s);
  return out;
}

absl::StatusOr<v1::HeartbeatResponse> Scheduler::Heartbeat(const v1::HeartbeatRequest& request,
                                                           const std::string& credential) {
  REMAT_RETURN_IF_ERROR(CheckWorkerId(request.worker_id()));
  State& st = *state_;
  if (!st.WaitResumed()) return Resuming();
  State::Locked lock(&st);
  v1::HeartbeatResponse out;
  WorkerEntry* w = st.workers_.Find(request.worker_id());
  if (w == nullptr) {
    out.set_reregister(true);
    return out;
  }
  REMAT_RETURN_IF_ERROR(CheckOwner(*w, credential));
  // A worker runs at most one trial per slot: a list far longer is not a worker's (the answer
  // would echo it).
  const int most = std::max(kMinListedTrials, 4 * w->slots);
  if (request.running_trial_ids_size() > most) {
    return absl::InvalidArgumentError(absl::StrCat("running_trial_ids: ",
                                                   request.running_trial_ids_size(),
                                                   " trials, at most ", most, " for its slots"));
  }
  st.Touch(*w);
  std::set<std::string> running;
  for (const std::string& id : request.running_trial_ids()) {
    // Trial ids the coordinator issues are short; a longer one names no trial and is not echoed.
    if (id.size() <= search::limits::kMaxQuotedValueBytes) running.insert(id);
  }
  for (const std::string& id : running) {
    auto it = st.trial_index_.find(id);
    if (it == st.trial_index_.end()) {
      out.add_cancel_trial_ids(id);  // finished search, or unknown
      continue;
    }
    auto [s, t] = it->second;
    // Only the worker a trial was last leased to may name it: a heartbeat never leases a trial
    // this worker was not handed (any other trial it names, it is told to stop).
    const bool its_lease = t->rec.attempts > 0 && t->rec.worker_id == w->rec.id;
    if (IsFinal(t->rec.status) || !its_lease) {
      out.add_cancel_trial_ids(id);
    } else if (t->rec.status == v1::TRIAL_STATUS_RUNNING) {
      t->confirmed_ms = st.Now();
    } else if (t->rec.status == v1::TRIAL_STATUS_PENDING && s->world_size <= w->slots - w->busy) {
      // Requeued while this worker still ran it (e.g. a short partition), and leased to no one
      // since: take its own lease back, same attempt.
      const int32_t attempt = t->rec.attempts;
      absl::Status leased = st.store_->LeaseTrial(id, attempt, w->rec.id);
      if (!leased.ok()) return leased;
      st.Lease(*s, *t, *w, attempt);
      st.log_->info("search={} trial={} re-adopted by worker={}", s->rec.id, id, w->rec.id);
    }
  }
  // Leases this worker has not listed for a whole lease timeout are lost.
  const int64_t now = st.Now();
  const auto timeout_ms = static_cast<int64_t>(st.opt_.lease_timeout_s * 1000);
  std::vector<std::string> lost;
  for (const std::string& id : w->leases) {
    if (running.count(id) != 0) continue;
    auto it = st.trial_index_.find(id);
    if (it != st.trial_index_.end() && now - it->second.second->confirmed_ms > timeout_ms) {
      lost.push_back(id);
    }
  }
  for (const std::string& id : lost) {
    auto it = st.trial_index_.find(id);
    if (it == st.trial_index_.end()) continue;
    auto [s, t] = it->second;
    const std::string sid = s->rec.id;
    st.LoseLease(*s, *t, "worker " + w->rec.id + " no longer lists it as running");
    if (auto a = st.active_.find(sid); a != st.active_.end()) {
      st.Refill(*a->second);
      if (st.MaybeFinish(*a->second)) continue;
    }
  }
  if (!lost.empty()) st.ServeWaiters();
  return out;
}

uint64_t Scheduler::LeaseTrial(const v1::LeaseTrialRequest& request, LeaseDone done,
                               const std::string& credential) {
  State& st = *state_;
  const bool resumed = st.WaitResumed();  // before the lock: Resume holds it
  State::Locked lock(&st);
  const int64_t started = st.Now();
  absl::Status refused = resumed ? CheckWorkerId(request.worker_id()) : Resuming();
  WorkerEntry* w = refused.ok() ? st.workers_.Find(request.worker_id()) : nullptr;
  if (refused.ok() && w == nullptr) {
    refused = absl::FailedPreconditionError("unknown worker " + request.worker_id() +
                                            "; register first");
  }
  if (refused.ok()) refused = CheckOwner(*w, credential);
  if (!refused.ok()) {
    st.deferred_.Add([done = std::move(done), refused] { done(refused); });
    return 0;
  }
  st.Touch(*w);
  absl::StatusOr<v1::LeaseTrialResponse> got = v1::LeaseTrialResponse();
  if (!st.shutdown_) got = st.Allocate(*w, w->FreeFor(request.free_slots()));
  const double wait_s = std::min(request.wait_s(), st.opt_.max_lease_wait_s);
  if (!got.ok() || got->trials_size() > 0 || wait_s <= 0 || st.shutdown_) {
    st.deferred_.Add(
        [done = std::move(done), r = std::move(got)]() mutable { done(std::move(r)); });
    return 0;
  }
  return st.waiters_.Park(request, std::move(done), started + static_cast<int64_t>(wait_s * 1000));
}

void Scheduler::CancelLeaseWait(uint64_t wait_id) {
  State::Locked lock(state_.get());
  state_->waiters_.Cancel(wait_id);
}

absl::StatusOr<v1::ReportTrialResponse> Scheduler::ReportTrial(
    const v1::ReportTrialRequest& request, const std::string& credential) {
  REMAT_RETURN_IF_ERROR(CheckWorkerId(request.worker_id()));
  if (!IsFinal(request.result().status())) {
    return absl::InvalidArgumentError(
        "result.status: must be a final status (ok, oom, failed, "
        "timeout, invalid or cancelled)");
  }
  State& st = *state_;
  if (!st.WaitResumed()) return Resuming();
  State::Locked lock(&st);
  v1::ReportTrialResponse out;
  WorkerEntry* w = st.workers_.Find(request.worker_id());
  if (w != nullptr) {
    REMAT_RETURN_IF_ERROR(CheckOwner(*w, credential));
    st.workers_.Touch(*w, st.Now());
  }
  auto it = st.trial_index_.find(request.trial_id());
  if (it == st.trial_index_.end()) {
    st.log_->info("trial={} report from worker={} not accepted: not an active trial",
                  search::QuoteForError(request.trial_id()), request.worker_id());
    out.set_accepted(false);
    return out;
  }
  auto [s, t] = it->second;
  if (IsFinal(t->rec.status) || request.attempt() > t->rec.attempts) {
    st.log_->info("search={} trial={} duplicate or stale report (attempt {}) from worker={}",
                  s->rec.id, t->rec.id, request.attempt(), request.worker_id());
    out.set_accepted(false);
    return out;
  }
  // Only the lease it answers: the worker the trial was last leased to, for that attempt (an
  // expired lease not yet handed to another worker still counts: its result is not lost).
  if (w == nullptr || t->rec.worker_id != request.worker_id() ||
      request.attempt() != t->rec.attempts) {
    st.log_->warn("search={} trial={} report from worker={} attempt {} not accepted: the trial "
                  "is leased to worker={} attempt {}",
                  s->rec.id, t->rec.id, request.worker_id(), request.attempt(), t->rec.worker_id,
                  t->rec.attempts);
    out.set_accepted(false);
    return out;
  }
  if (absl::Status valid =
          ValidateWireResult(request.result(), "result", std::max(1, s->spec.parallel.WorldSize()));
      !valid.ok()) {
    // The worker drops a refused report; the trial then loses its lease, and the reason goes
    // with it into the trial's message (Scheduler::State::LoseLease), not only into a log.
    t->refused_report = search::BoundedUtf8(std::string(valid.message()),
                                            search::limits::kMaxTrialMessageBytes / 4);
    st.log_->warn("search={} trial={} report from worker={} refused: {}", s->rec.id, t->rec.id,
                  request.worker_id(), t->refused_report);
    return valid;
  }
  v1::TrialResult result = ResultOfTrial(*t, request.result());
  result.set_reused(false);
  // Our workers bound it already (worker/assignment.h MakeReport); another client may not.
  result.set_message(search::BoundedUtf8(result.message(), search::limits::kMaxTrialMessageBytes));
  std::string cache_key;
  if (w != nullptr && !t->remeasure &&
      (result.status() == v1::TRIAL_STATUS_OK || result.status() == v1::TRIAL_STATUS_OOM)) {
    cache_key = st.CacheKey(*s, *t, *w);
  }
  REMAT_ASSIGN_OR_RETURN(
      bool recorded, st.store_->RecordResult(t->rec.id, result, request.worker_id(), cache_key));
  out.set_accepted(recorded);
  if (!recorded) return out;
  st.Apply(*s, *t, result, request.worker_id());
  st.ServeWaiters();
  return out;
}

void Scheduler::Tick() {
  State& st = *state_;
  State::Locked lock(&st);
  const int64_t now = st.Now();
  st.waiters_.Expire(now);
  const auto timeout_ms = static_cast<int64_t>(st.opt_.lease_timeout_s * 1000);
  bool changed = false;
  for (WorkerEntry* w : st.workers_.Silent(now, timeout_ms)) {
    const std::string& id = w->rec.id;
    const std::string reason =
        absl::StrFormat("worker %s silent for %.1f s", id, (now - w->last_seen_ms) / 1000.0);
    st.log_->warn("worker={} lost: silent for {:.1f} s, {} leases", id,
                  (now - w->last_seen_ms) / 1000.0, w->leases.size());
    bool all = true;
    const std::vector<std::string> leases(w->leases.begin(), w->leases.end());
    for (const std::string& trial_id : leases) {
      auto t = st.trial_index_.find(trial_id);
      if (t == st.trial_index_.end()) {
        w->leases.erase(trial_id);
        continue;
      }
      all = st.LoseLease(*t->second.first, *t->second.second, reason) && all;
    }
    if (all) st.workers_.SetConnected(*w, false);
    changed = true;
  }
  // Searches no connected worker can run: say why, and end those that waited too long.
  {
    std::vector<SearchRun*> all;
    for (auto& [id, s] : st.active_) all.push_back(s.get());
    for (SearchRun* s : all) st.CheckServed(*s);
  }
  // Retry what a store error left undone.
  std::vector<SearchRun*> retry;
  for (auto& [id, s] : st.active_) {
    if (s->finalize_pending || !s->unsaved.empty() || changed) retry.push_back(s.get());
  }
  for (SearchRun* s : retry) {
    if (s->finalize_pending) {
      st.Finish(*s);
      continue;
    }
    st.Refill(*s);
    st.MaybeFinish(*s);
  }
  if (changed) st.ServeWaiters();
}

int64_t Scheduler::MsUntilNextTick() {
  std::lock_guard<std::mutex> lock(state_->mu_);
  return state_->waiters_.MsUntilDeadline(state_->Now(), kTickPeriodMs);
}

void Scheduler::Shutdown() {
  State& st = *state_;
  State::Locked lock(&st);
  st.shutdown_ = true;
  st.waiters_.AnswerAllEmpty();
  st.watches_.CloseAll();
}

}  // namespace remat::server
