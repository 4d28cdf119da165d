#include "server/scheduler_state.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "search/limits.h"
#include "search/text.h"
#include "server/cache_key.h"
#include "server/metrics.h"
#include "server/search_views.h"
#include "server/status_util.h"

namespace remat::server {
namespace {

bool Supports(const WorkerEntry& w, const SearchRun& s) {
  return w.Supports(s.backend, s.spec.search.backend == search::Backend::kCommand,
                    s.spec.search.command_template);
}

}  // namespace

Scheduler::State::State(SchedulerOptions options, JobStore* store, Metrics* metrics)
    : opt_(std::move(options)),
      store_(store),
      metrics_(metrics),
      log_(ComponentLogger("scheduler")),
      rng_(std::random_device{}()),
      watches_(&deferred_),
      waiters_(&deferred_) {}

std::string Scheduler::State::NewId(const char* prefix) {
  return absl::StrFormat("%s%012x", prefix, rng_() & 0xffffffffffffULL);
}

bool Scheduler::State::WaitResumed() {
  if (resumed_.load()) return true;
  constexpr int64_t kResumeWaitMs = 5000;  // a client's retry beats a longer wait
  std::unique_lock<std::mutex> lock(resume_mu_);
  return resume_cv_.wait_for(lock, std::chrono::milliseconds(kResumeWaitMs),
                             [this] { return resumed_.load(); });
}

void Scheduler::State::MarkResumed() {
  {
    std::lock_guard<std::mutex> lock(resume_mu_);
    resumed_ = true;
  }
  resume_cv_.notify_all();
}

void Scheduler::State::PublishGauges() {
  if (metrics_ == nullptr) return;
  int64_t queued = 0, leased = 0;
  for (const auto& [id, s] : active_) {
    queued += static_cast<int64_t>(s->queue.size());
    leased += s->running;
  }
  const WorkerRegistry::Gauges g = workers_.Count();
  metrics_->SetQueueDepth(queued);
  metrics_->SetTrialsLeased(leased);
  metrics_->SetWorkersConnected(g.connected);
  metrics_->SetGpus(g.free, g.busy);
  for (const auto& [state, n] : state_counts_) metrics_->SetSearches(state, n);
}

void Scheduler::State::CountState(v1::SearchState from, v1::SearchState to) {
  if (from != v1::SEARCH_STATE_UNSPECIFIED) --state_counts_[from];
  ++state_counts_[to];
}

void Scheduler::State::Touch(WorkerEntry& w) {
  if (workers_.Touch(w, Now())) RefillAll();
}

void Scheduler::State::UpdateReady(SearchRun& s) {
  if (s.queue.empty()) {
    ready_.erase(s.rec.id);
  } else {
    ready_.insert(s.rec.id);
  }
}

void Scheduler::State::Notify(SearchRun& s, const RunTrial* last) {
  if (!watches_.HasWatchers(s.rec.id)) return;
  watches_.PushToSearch(s.rec.id, ProgressView(s, last, UnixNow()), IsFinished(s.rec.state));
}

absl::Status Scheduler::State::SaveSearch(SearchRun& s) {
  s.rec.updated_unix_ms = UnixNow();
  s.rec.trials_planned = s.PlannedTotal();
  return store_->UpdateSearch(s.rec);
}

void Scheduler::State::Refill(SearchRun& s, int64_t free_slots) {
  if (IsFinished(s.rec.state) || s.finalize_pending) return;
  if (free_slots < 0) free_slots = workers_.FreeSlots();
  const int64_t active = std::max<int64_t>(1, static_cast<int64_t>(active_.size()));
  const int64_t target = std::max<int64_t>(1, (free_slots + active - 1) / active);
  std::vector<TrialRecord> records = s.Proposals(target, [this] { return NewId("t-"); });
  if (records.empty()) return;
  absl::Status st = store_->AddTrials(records);
  if (!st.ok()) {
    log_->error("search={} could not record {} proposed trials (will retry): {}", s.rec.id,
                records.size(), st.ToString());
    return;
  }
  bool joined = false;
  for (RunTrial* t : s.Enqueue(std::move(records))) {
    log_->debug("search={} trial={} queued policy={} reason=\"{}\"", s.rec.id, t->rec.id,
                t->rec.policy, t->rec.reason);
    trial_index_[t->rec.id] = {&s, t};
    joined = JoinRunning(s, *t) || joined;
  }
  UpdateReady(s);
  if (joined) {
    MarkRunning(s);
    Refill(s, free_slots);  // joined trials left the queue, as leased ones do
  }
}

bool Scheduler::State::MaybeFinish(SearchRun& s) {
  if (s.Outstanding()) return false;
  if (!s.strategy->Done()) {
    // Refill asked for more and got nothing while nothing is outstanding: the strategy cannot
    // go on. Finish with what was measured rather than leave the search stuck.
    log_->warn("search={} strategy proposes nothing more but is not done; finishing", s.rec.id);
  }
  return Finish(s);
}

bool Scheduler::State::Finish(SearchRun& s) {
  SearchRecord& rec = s.rec;
  const v1::SearchState old_state = rec.state;
  s.Conclude();
  absl::Status st = SaveSearch(s);
  if (!st.ok()) {
    rec.state = old_state;
    s.finalize_pending = true;
    log_->error("search={} could not record its end (will retry): {}", rec.id, st.ToString());
    return false;
  }
  s.finalize_pending = false;
  CountState(old_state, rec.state);
  log_->info("search={} {}: {} trials, frontier [{}], recommendation {}{}", rec.id,
             StateLabel(rec.state), s.trials.size(), absl::StrJoin(rec.frontier, ", "),
             rec.recommendation.value_or("none"), rec.message.empty() ? "" : "; " + rec.message);
  Retire(s);
  return true;
}

void Scheduler::State::Retire(SearchRun& s) {
  Notify(s, nullptr);
  watches_.DetachSearch(s.rec.id);
  if (metrics_ != nullptr) metrics_->RemoveFrontier(s.rec.id);
  frontier_series_.erase(s.rec.id);
  for (const auto& t : s.trials) trial_index_.erase(t->rec.id);
  ready_.erase(s.rec.id);
  active_.erase(s.rec.id);  // destroys s
}

void Scheduler::State::PublishFrontier(SearchRun& s) {
  if (metrics_ == nullptr) return;
  if (frontier_series_.count(s.rec.id) == 0) {
    if (static_cast<int>(frontier_series_.size()) >= opt_.max_frontier_series) return;
    frontier_series_.insert(s.rec.id);
  }
  metrics_->SetFrontierPoints(s.rec.id, static_cast<int64_t>(s.Frontier().size()));
}

bool Scheduler::State::Apply(SearchRun& s, RunTrial& t, const v1::TrialResult& result,
                             const std::string& by_worker) {
  const bool was_running = t.rec.status == v1::TRIAL_STATUS_RUNNING;
  const std::string trial_id = t.rec.id;
  // What a worker measured for the strategy's own trial is what the cache would keep.
  const bool shareable =
      was_running && !by_worker.empty() && !t.remeasure &&
      (result.status() == v1::TRIAL_STATUS_OK || result.status() == v1::TRIAL_STATUS_OOM);
  double duration_s = 0;
  if (was_running) {
    duration_s = (Now() - t.leased_ms) / 1000.0;
    workers_.DropLease(t.rec.worker_id, t.rec.id, s.world_size);
  }
  s.MarkFinal(t, result, by_worker);
  UpdateReady(s);
  if (metrics_ != nullptr) metrics_->TrialFinished(result.status(), result.reused(), duration_s);
  log_->info("search={} trial={} {} policy={} step_time_s={:.4f} tokens_per_s={:.1f}{}{}", s.rec.id,
             t.rec.id, StatusLabel(result.status()), t.rec.policy, result.step_time_s(),
             result.tokens_per_s(), result.reused() ? " (reused)" : "",
             result.message().empty() ? "" : " message=\"" + result.message() + "\"");
  Refill(s);
  Notify(s, &t);
  PublishFrontier(s);
  const bool ended = MaybeFinish(s);  // may destroy s and t
  if (was_running) ReleaseFollowers(trial_id, shareable ? &result : nullptr);
  return ended;
}

bool Scheduler::State::LoseLease(SearchRun& s, RunTrial& t, const std::string& lost) {
  const std::string reason =
      t.refused_report.empty() ? lost : lost + "; its report was refused: " + t.refused_report;
  if (t.rec.attempts >= opt_.max_trial_attempts) {
    v1::TrialResult failed =
        CoordinatorResult(t, v1::TRIAL_STATUS_FAILED,
                          absl::StrCat("lost its worker ", t.rec.attempts, " times (limit ",
                                       opt_.max_trial_attempts, "); last: ", reason));
    auto recorded = store_->RecordResult(t.rec.id, failed, t.rec.worker_id, "");
    if (!recorded.ok()) {
      log_->error("search={} trial={} could not record failure: {}", s.rec.id, t.rec.id,
                  recorded.status().ToString());
      return false;
    }
    log_->warn("search={} trial={} failed: {}", s.rec.id, t.rec.id, failed.message());
    Apply(s, t, failed, "");
    return true;
  }
  absl::Status st = store_->RequeueTrial(t.rec.id);
  if (!st.ok()) {
    log_->error("search={} trial={} could not requeue: {}", s.rec.id, t.rec.id, st.ToString());
    return false;
  }
  workers_.DropLease(t.rec.worker_id, t.rec.id, s.world_size);
  s.Requeue(t);
  UpdateReady(s);
  ReleaseFollowers(t.rec.id, nullptr);
  log_->warn("search={} trial={} requeued after attempt {}: {}", s.rec.id, t.rec.id, t.rec.attempts,
             reason);
  return true;
}

void Scheduler::State::Lease(SearchRun& s, RunTrial& t, WorkerEntry& w, int32_t attempt) {
  s.MarkLeased(t, attempt, w.rec.id, Now());
  UpdateReady(s);
  workers_.AddLease(w, t.rec.id, s.world_size);
  OfferToJoin(s, t, w);
}

void Scheduler::State::MarkRunning(SearchRun& s) {
  if (s.rec.state != v1::SEARCH_STATE_QUEUED) return;
  s.rec.state = v1::SEARCH_STATE_RUNNING;
  absl::Status saved = SaveSearch(s);
  if (!saved.ok()) {
    log_->warn("search={} could not record state running: {}", s.rec.id, saved.ToString());
  }
  CountState(v1::SEARCH_STATE_QUEUED, v1::SEARCH_STATE_RUNNING);
  Notify(s, nullptr);
}

std::string Scheduler::State::UnservedReason(const SearchRun& s, bool* any_connected) const {
  *any_connected = false;
  if (s.queue.empty() || s.running > 0 || s.joined > 0) return "";
  const bool needs_template = s.spec.search.backend == search::Backend::kCommand;
  bool backend_found = false;
  int most_slots = 0;  // over connected workers that run its backend (and template)
  for (const auto& [id, w] : workers_.all()) {
    if (!w.connected) continue;
    *any_connected = true;
    if (!w.backends.empty() && w.backends.count(s.backend) == 0) continue;
    backend_found = true;
    if (needs_template && w.templates.count(s.spec.search.command_template) == 0) continue;
    most_slots = std::max(most_slots, w.slots);
  }
  if (!*any_connected) return "waiting: no worker is connected";
  if (!backend_found) {
    return absl::StrCat("waiting: no connected worker runs backend ", s.backend);
  }
  if (most_slots == 0) {
    return absl::StrCat("waiting: no connected worker offers command template ",
                        search::QuoteForError(s.spec.search.command_template));
  }
  if (most_slots < s.world_size) {
    return absl::StrCat("waiting: no connected worker has ", s.world_size,
                        " slots (the trials' world size; the largest has ", most_slots, ")");
  }
  return "";
}

bool Scheduler::State::CheckServed(SearchRun& s) {
  if (IsFinished(s.rec.state) || s.finalize_pending) return false;
  bool any_connected = false;
  const std::string reason = UnservedReason(s, &any_connected);
  // Only a waiting message is ours to set or clear; a search's other messages are kept.
  const bool ours = s.rec.message.rfind("waiting: ", 0) == 0;
  if (reason != s.rec.message && (ours || s.rec.message.empty())) {
    const std::string old = s.rec.message;
    s.rec.message = reason;
    absl::Status saved = SaveSearch(s);
    if (!saved.ok()) {
      s.rec.message = old;  // written next tick
      log_->warn("search={} could not record its waiting message: {}", s.rec.id, saved.ToString());
    } else {
      if (!reason.empty()) log_->warn("search={} {}", s.rec.id, reason);
      Notify(s, nullptr);
    }
  }
  if (reason.empty() || !any_connected) {
    s.unserved_since_ms = 0;
    return false;
  }
  if (s.unserved_since_ms == 0) s.unserved_since_ms = Now();
  const auto timeout_ms = static_cast<int64_t>(opt_.unserved_search_timeout_s * 1000);
  if (timeout_ms <= 0 || Now() - s.unserved_since_ms < timeout_ms) return false;

  // Waited long enough: the queued trials are not run (cancelled, with the reason), and the
  // search ends with what it measured (failed when nothing).
  const std::string why =
      absl::StrCat(reason.substr(std::string("waiting: ").size()), " for ",
                   absl::StrFormat("%.0f", opt_.unserved_search_timeout_s),
                   " s (rematd --unserved-search-timeout)");
  absl::Status st = store_->CancelSearch(s.rec.id, UnixNow(), "not run: " + why);
  if (!st.ok()) {
    log_->error("search={} could not record that it stopped (will retry): {}", s.rec.id,
                st.ToString());
    return false;
  }
  s.CancelAll("not run: " + why, [&](RunTrial&) {
    if (metrics_ != nullptr) metrics_->TrialFinished(v1::TRIAL_STATUS_CANCELLED, false, 0);
  });
  const v1::SearchState old_state = s.rec.state;
  s.Conclude();
  const std::string concluded = s.rec.message;
  if (s.rec.state == v1::SEARCH_STATE_FAILED) {
    s.rec.message = s.done == 0 ? absl::StrCat("no trial ran: ", why)
                                : absl::StrCat(why, "; ", concluded);
  } else {
    s.rec.message =
        absl::StrCat("stopped early: ", why, concluded.empty() ? "" : "\n" + concluded);
  }
  st = SaveSearch(s);
  if (!st.ok()) {
    log_->error("search={} could not record its end: {}", s.rec.id, st.ToString());
  }
  CountState(old_state, s.rec.state);
  log_->warn("search={} {}: {}", s.rec.id, StateLabel(s.rec.state), s.rec.message);
  Retire(s);
  return true;
}

void Scheduler::State::OfferToJoin(SearchRun& s, RunTrial& t, const WorkerEntry& w) {
  if (t.remeasure) return;
  const std::string key = CacheKey(s, t, w);
  running_keys_[t.rec.id] = key;
  std::vector<SearchRun*> joined_in;
  for (auto& [id, other] : active_) {
    if (other.get() == &s || IsFinished(other->rec.state) || other->finalize_pending) continue;
    const std::vector<RunTrial*> queued(other->queue.begin(), other->queue.end());
    bool any = false;
    for (RunTrial* q : queued) {
      if (q->remeasure || q->rec.policy != t.rec.policy || CacheKey(*other, *q, w) != key) continue;
      other->Join(*q, t.rec.id);
      followers_[t.rec.id].push_back(q->rec.id);
      log_->info("search={} trial={} joined trial={} of search={} (the same measurement)",
                 other->rec.id, q->rec.id, t.rec.id, s.rec.id);
      any = true;
    }
    if (any) joined_in.push_back(other.get());
  }
  for (SearchRun* o : joined_in) {
    UpdateReady(*o);
    MarkRunning(*o);
    Refill(*o);
  }
}

bool Scheduler::State::JoinRunning(SearchRun& s, RunTrial& t) {
  if (t.remeasure) return false;
  for (const auto& [leader_id, key] : running_keys_) {
    auto it = trial_index_.find(leader_id);
    if (it == trial_index_.end()) continue;
    const auto [ls, lt] = it->second;
    if (ls == &s || lt->rec.policy != t.rec.policy || lt->rec.status != v1::TRIAL_STATUS_RUNNING) {
      continue;
    }
    const WorkerEntry* lw = workers_.Find(lt->rec.worker_id);
    if (lw == nullptr || CacheKey(s, t, *lw) != key) continue;
    s.Join(t, leader_id);
    followers_[leader_id].push_back(t.rec.id);
    log_->info("search={} trial={} joined trial={} of search={} (the same measurement)", s.rec.id,
               t.rec.id, leader_id, ls->rec.id);
    return true;
  }
  return false;
}

void Scheduler::State::ReleaseFollowers(const std::string& leader_id,
                                        const v1::TrialResult* result) {
  running_keys_.erase(leader_id);
  auto f = followers_.find(leader_id);
  if (f == followers_.end()) return;
  const std::vector<std::string> ids = std::move(f->second);
  followers_.erase(f);
  for (const std::string& id : ids) {
    auto it = trial_index_.find(id);
    if (it == trial_index_.end()) continue;  // its search ended
    auto [s, t] = it->second;
    if (t->joined_to != leader_id) continue;  // cancelled, or leased since
    if (result != nullptr) {
      v1::TrialResult taken = ResultOfTrial(*t, *result);
      taken.set_reused(true);
      auto recorded = store_->RecordResult(t->rec.id, taken, "", "");
      if (recorded.ok()) {
        Apply(*s, *t, taken, "");
        continue;
      }
      log_->warn("search={} trial={} could not record the joined result (running it): {}",
                 s->rec.id, id, recorded.status().ToString());
    }
    s->Unjoin(*t);
    UpdateReady(*s);
    log_->info("search={} trial={} queued again: trial={} it joined ended without a result",
               s->rec.id, id, leader_id);
  }
}

std::string Scheduler::State::CacheKey(const SearchRun& s, const RunTrial& t,
                                       const WorkerEntry& w) const {
  return ResultsCacheKey(s.rec.spec, t.rec.policy, w.rec.registration, s.ReplayFor(t.rec.policy));
}

SearchRun* Scheduler::State::NextReady(const WorkerEntry& w, int free) {
  if (ready_.empty()) return nullptr;
  auto it = ready_.upper_bound(cursor_);
  for (size_t n = 0; n < ready_.size(); ++n) {
    if (it == ready_.end()) it = ready_.begin();
    SearchRun& s = *active_.at(*it);
    if (s.world_size <= free && Supports(w, s)) {
      cursor_ = *it;
      return &s;
    }
    ++it;
  }
  return nullptr;
}

absl::Status Scheduler::State::CheckQuota(const std::string& owner, int64_t planned) const {
  int searches = 0;
  int64_t trials = 0;
  for (const auto& [id, s] : active_) {
    if (s->rec.owner != owner) continue;
    ++searches;
    trials += std::max<int64_t>(0, s->rec.trials_planned - s->done);
  }
  const std::string who = owner.empty() ? "anonymous callers" : "user " + owner;
  if (opt_.max_searches_per_user > 0 && searches >= opt_.max_searches_per_user) {
    return absl::ResourceExhaustedError(
        absl::StrCat(who, " already has ", searches, " searches queued or running (limit ",
                     opt_.max_searches_per_user, ", rematd --max-searches-per-user)"));
  }
  if (opt_.max_trials_per_user > 0 && trials + planned > opt_.max_trials_per_user) {
    return absl::ResourceExhaustedError(absl::StrCat(
        who, " would have ", trials + planned, " trials to run (limit ", opt_.max_trials_per_user,
        ", rematd --max-trials-per-user)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::LeaseTrialResponse> Scheduler::State::Allocate(WorkerEntry& w, int free) {
  v1::LeaseTrialResponse out;
  size_t reply_bytes = 0;
  while (free > 0) {
    SearchRun* s = NextReady(w, free);
    if (s == nullptr) break;
    RunTrial& t = *s->queue.front();
    // What this trial adds to the reply: its spec and replay entry dominate.
    const v1::ReplayEntry* entry =
        s->spec.search.backend == search::Backend::kReplay ? s->ReplayFor(t.rec.policy) : nullptr;
    const size_t trial_bytes =
        s->rec.spec.ByteSizeLong() + (entry != nullptr ? entry->ByteSizeLong() : 0) + 256;
    if (out.trials_size() > 0 && reply_bytes + trial_bytes > search::limits::kMaxLeaseReplyBytes) {
      break;
    }
    // A re-measure must run: the cache would hand back the measurement it is meant to check.
    auto cached = t.remeasure ? absl::StatusOr<std::optional<v1::TrialResult>>(std::nullopt)
                              : store_->LookupCache(CacheKey(*s, t, w));
    if (!cached.ok()) {
      log_->warn("results cache lookup failed (running the trial): {}", cached.status().ToString());
    } else if (cached->has_value()) {
      v1::TrialResult result = ResultOfTrial(t, **cached);
      result.set_reused(true);
      auto recorded = store_->RecordResult(t.rec.id, result, "", "");
      if (!recorded.ok()) return recorded.status();
      // As a lease would: the trial leaves the queue and the search proposes its next trial
      // before it sees this result, so a search that finds its trials cached chooses what the
      // search that measured them chose (it does not get ahead of what that one knew).
      s->queue.erase(std::remove(s->queue.begin(), s->queue.end(), &t), s->queue.end());
      UpdateReady(*s);
      Refill(*s);
      Apply(*s, t, result, "");  // may retire *s
      continue;
    }
    const int32_t attempt = t.rec.attempts + 1;
    absl::Status st = store_->LeaseTrial(t.rec.id, attempt, w.rec.id);
    if (!st.ok()) {
      if (out.trials_size() > 0) break;
      return st;
    }
    Lease(*s, t, w, attempt);
    free -= s->world_size;
    reply_bytes += trial_bytes;

    v1::TrialAssignment* a = out.add_trials();
    a->set_trial_id(t.rec.id);
    a->set_search_id(s->rec.id);
    *a->mutable_spec() = s->rec.spec;
    a->mutable_policy()->set_canonical(t.rec.policy);
    a->set_world_size(s->world_size);
    a->set_attempt(attempt);
    a->set_owner(s->rec.owner);  // the Slurm executor may charge the owner's account
    if (s->spec.search.backend == search::Backend::kReplay) {
      const v1::ReplayEntry* replay = s->ReplayFor(t.rec.policy);
      a->set_replay_found(replay != nullptr);
      if (replay != nullptr) *a->mutable_replay() = *replay;
    }
    log_->info("search={} trial={} leased to worker={} attempt={} policy={}", s->rec.id, t.rec.id,
               w.rec.id, attempt, t.rec.policy);

    MarkRunning(*s);
    Refill(*s);
  }
  return out;
}

void Scheduler::State::ServeWaiters() {
  waiters_.Serve([this] { return !ready_.empty(); },
                 [this](const v1::LeaseTrialRequest& request)
                     -> std::optional<absl::StatusOr<v1::LeaseTrialResponse>> {
                   WorkerEntry* w = workers_.Find(request.worker_id());
                   if (w == nullptr) return std::nullopt;
                   auto got = Allocate(*w, w->FreeFor(request.free_slots()));
                   if (got.ok() && got->trials_size() == 0) return std::nullopt;
                   return got;
                 });
}

void Scheduler::State::RefillAll() {
  std::vector<SearchRun*> searches;
  for (auto& [id, s] : active_) searches.push_back(s.get());
  const int64_t free = workers_.FreeSlots();
  for (SearchRun* s : searches) {
    Refill(*s, free);
    MaybeFinish(*s);
  }
}

absl::Status Scheduler::State::ResumeFromStore() {
  REMAT_ASSIGN_OR_RETURN(auto counts, store_->CountSearchesByState());
  for (v1::SearchState s :
       {v1::SEARCH_STATE_QUEUED, v1::SEARCH_STATE_RUNNING, v1::SEARCH_STATE_SUCCEEDED,
        v1::SEARCH_STATE_FAILED, v1::SEARCH_STATE_CANCELLED}) {
    state_counts_[s] = counts.count(s) ? counts[s] : 0;
  }
  REMAT_ASSIGN_OR_RETURN(std::vector<WorkerRecord> workers, store_->LoadWorkers());
  for (WorkerRecord& rec : workers) workers_.Load(std::move(rec));
  REMAT_ASSIGN_OR_RETURN(std::vector<SearchRecord> searches, store_->LoadUnfinishedSearches());
  int resumed = 0, requeued = 0, kept = 0;
  for (SearchRecord& rec : searches) {
    auto run = SearchRun::FromRecord(rec);
    if (!run.ok()) {
      log_->error("search={} cannot be resumed: {}", rec.id, std::string(run.status().message()));
      const v1::SearchState old = rec.state;
      rec.state = v1::SEARCH_STATE_FAILED;
      rec.message = absl::StrCat("cannot be resumed: ", run.status().message());
      rec.updated_unix_ms = UnixNow();
      REMAT_RETURN_IF_ERROR(store_->UpdateSearch(rec));
      CountState(old, v1::SEARCH_STATE_FAILED);
      continue;
    }
    SearchRun& s = **run;
    s.strategy = opt_.make_strategy(s.spec);
    REMAT_ASSIGN_OR_RETURN(std::vector<TrialRecord> trials, store_->LoadTrials(s.rec.id));
    REMAT_RETURN_IF_ERROR(
        s.RestoreTrials(std::move(trials), [&](RunTrial& t) -> absl::StatusOr<bool> {
          WorkerEntry* w = workers_.Find(t.rec.worker_id);
          if (w == nullptr) {
            REMAT_RETURN_IF_ERROR(store_->RequeueTrial(t.rec.id));
            ++requeued;
            return false;
          }
          // Still leased: the worker may report it; silent for a lease timeout = requeued.
          workers_.Touch(*w, Now());
          workers_.AddLease(*w, t.rec.id, s.world_size);
          if (!t.remeasure) running_keys_[t.rec.id] = CacheKey(s, t, *w);
          t.leased_ms = t.confirmed_ms = Now();
          ++kept;
          return true;
        }));
    for (const auto& t : s.trials) trial_index_[t->rec.id] = {&s, t.get()};
    if (s.rec.state == v1::SEARCH_STATE_QUEUED && (s.running > 0 || s.done > 0)) {
      // Killed between a lease and recording the state change it caused.
      s.rec.state = v1::SEARCH_STATE_RUNNING;
      s.rec.updated_unix_ms = UnixNow();
      REMAT_RETURN_IF_ERROR(store_->UpdateSearch(s.rec));
      CountState(v1::SEARCH_STATE_QUEUED, v1::SEARCH_STATE_RUNNING);
    }
    active_.emplace(s.rec.id, *std::move(run));
    UpdateReady(s);
    PublishFrontier(s);
    ++resumed;
    log_->info("search={} resumed: {} trials recorded, {} done, {} leased, {} queued", s.rec.id,
               s.trials.size(), s.done, s.running, s.queue.size());
  }
  if (resumed > 0) {
    log_->info("resumed {} unfinished searches ({} leases kept, {} trials requeued)", resumed, kept,
               requeued);
  }
  RefillAll();
  return absl::OkStatus();
}

}  // namespace remat::server
