#include "server/scheduler.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <unordered_map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "proto/convert.h"
#include "search/frontier.h"
#include "search/memory_model.h"
#include "search/policy.h"
#include "server/cache_key.h"
#include "server/logging.h"
#include "server/metrics.h"
#include "server/status_util.h"

namespace remat::server {
namespace {

constexpr int kDefaultListLimit = 100;
constexpr int kMaxListLimit = 1000;
constexpr size_t kMaxPendingUpdates = 256;  // per watcher; older non-final updates are dropped
constexpr int64_t kTickPeriodMs = 250;

bool IsFinal(v1::TrialStatus s) {
  return s != v1::TRIAL_STATUS_PENDING && s != v1::TRIAL_STATUS_RUNNING &&
         s != v1::TRIAL_STATUS_UNSPECIFIED;
}

bool IsFinished(v1::SearchState s) {
  return s == v1::SEARCH_STATE_SUCCEEDED || s == v1::SEARCH_STATE_FAILED ||
         s == v1::SEARCH_STATE_CANCELLED;
}

bool CanSee(const Principal& who, const std::string& owner) {
  return who.sees_all || who.name == owner;
}

uint64_t BudgetBytes(const v1::SearchSpec& spec) {
  return static_cast<uint64_t>(spec.search().memory_budget_gib() * 1024.0 * 1024.0 * 1024.0);
}

// The domain form of a stored result; a result that cannot be read becomes a failed one, so the
// strategy still observes every trial it proposed.
search::TrialResult ToDomain(const std::string& policy, const v1::TrialResult& msg) {
  v1::TrialResult copy = msg;
  copy.mutable_policy()->set_canonical(policy);
  auto converted = proto::FromProto(copy);
  if (converted.ok()) return *converted;
  search::TrialResult r;
  if (auto p = search::ParsePolicy(policy); p.ok()) r.policy = *p;
  r.status = search::TrialStatus::kFailed;
  r.message = "unreadable result: " + converted.status().message();
  return r;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

class Scheduler::State {
 public:
  struct Trial {
    TrialRecord rec;
    int64_t leased_ms = 0;     // monotonic time of the current lease
    int64_t confirmed_ms = 0;  // last time the holder listed it in a heartbeat (or leased it)
  };

  struct Search {
    SearchRecord rec;
    search::SearchSpec spec;
    std::unique_ptr<search::Strategy> strategy;
    int world_size = 1;
    std::string backend;
    std::vector<std::unique_ptr<Trial>> trials;  // proposal order
    std::deque<Trial*> queue;                    // pending, in the order they should run
    int running = 0;
    int done = 0;
    std::vector<search::TrialResult> results;    // finished, for the frontier and Done()
    std::vector<search::Candidate> unsaved;      // proposed, not yet written to the store
    std::vector<uint64_t> watchers;
    bool finalize_pending = false;               // finished, but the store write failed
  };

  struct Worker {
    WorkerRecord rec;
    int slots = 1;
    int busy = 0;
    int64_t last_seen_ms = 0;
    bool connected = false;
    std::set<std::string> leases;
    std::set<std::string> backends;   // empty: any
    std::set<std::string> templates;
  };

  struct Watcher {
    std::string search_id;
    std::deque<v1::SearchProgress> pending;
    bool final_queued = false;
    bool closed = false;
    std::function<void()> wake;
  };

  struct Waiter {
    uint64_t id;
    v1::LeaseTrialRequest request;
    LeaseDone done;
    int64_t deadline_ms;
    int64_t started_ms;
  };

  State(SchedulerOptions options, JobStore* store, Metrics* metrics)
      : opt_(std::move(options)),
        store_(store),
        metrics_(metrics),
        log_(ComponentLogger("scheduler")),
        rng_(std::random_device{}()) {}

  // Holds the mutex; runs the callbacks deferred under it after releasing it.
  class Locked {
   public:
    explicit Locked(State* s) : s_(s), lock_(s->mu_) {}
    ~Locked() {
      std::vector<std::function<void()>> run;
      run.swap(s_->deferred_);
      lock_.unlock();
      for (auto& f : run) f();
    }

   private:
    State* s_;
    std::unique_lock<std::mutex> lock_;
  };

  // ------------------------------------------------------------------------- helpers (locked)

  int64_t Now() const { return opt_.monotonic_ms(); }
  int64_t UnixNow() const { return opt_.unix_ms(); }

  std::string NewId(const char* prefix) {
    return absl::StrFormat("%s%012x", prefix, rng_() & 0xffffffffffffULL);
  }

  void Defer(std::function<void()> f) { deferred_.push_back(std::move(f)); }

  // Free slots of connected workers, kept up to date by the three helpers below (a refill
  // target is computed on every event; summing over a thousand workers each time is not free).
  int64_t FreeSlots() const { return std::max<int64_t>(0, free_slots_); }
  void AddBusy(Worker& w, int delta) {
    w.busy += delta;
    if (w.connected) free_slots_ -= delta;
  }
  void SetConnected(Worker& w, bool connected) {
    if (w.connected == connected) return;
    w.connected = connected;
    free_slots_ += (connected ? 1 : -1) * static_cast<int64_t>(w.slots - w.busy);
  }
  void SetSlots(Worker& w, int slots) {
    if (w.connected) free_slots_ += slots - w.slots;
    w.slots = slots;
  }

  void PublishGauges() {
    if (metrics_ == nullptr) return;
    int64_t queued = 0, leased = 0, connected = 0, free = 0, busy = 0;
    for (const auto& [id, s] : active_) {
      queued += static_cast<int64_t>(s->queue.size());
      leased += s->running;
    }
    for (const auto& [id, w] : workers_) {
      if (!w.connected) continue;
      ++connected;
      free += std::max(0, w.slots - w.busy);
      busy += w.busy;
    }
    metrics_->SetQueueDepth(queued);
    metrics_->SetTrialsLeased(leased);
    metrics_->SetWorkersConnected(connected);
    metrics_->SetGpus(free, busy);
    for (const auto& [state, n] : state_counts_) metrics_->SetSearches(state, n);
  }

  void CountState(v1::SearchState from, v1::SearchState to) {
    if (from != v1::SEARCH_STATE_UNSPECIFIED) --state_counts_[from];
    ++state_counts_[to];
  }

  Worker* FindWorker(const std::string& id) {
    auto it = workers_.find(id);
    return it == workers_.end() ? nullptr : &it->second;
  }

  void Touch(Worker& w) {
    w.last_seen_ms = Now();
    SetConnected(w, true);
  }

  void UpdateReady(Search& s) {
    if (s.queue.empty()) {
      ready_.erase(s.rec.id);
    } else {
      ready_.insert(s.rec.id);
    }
  }

  std::vector<search::FrontierPoint> Frontier(const Search& s) const {
    return search::ComputeFrontier(s.results, s.spec.search.memory_metric,
                                   s.spec.search.MemoryBudgetBytes());
  }

  int PlannedTotal(const Search& s) const {
    return std::max<int>(s.strategy->PlannedTotal(), static_cast<int>(s.trials.size()));
  }

  v1::Trial TrialProto(const TrialRecord& t) const {
    v1::Trial out;
    out.set_id(t.id);
    out.mutable_policy()->set_canonical(t.policy);
    out.set_status(t.status);
    if (t.result) {
      *out.mutable_result() = *t.result;
      out.mutable_result()->mutable_policy()->set_canonical(t.policy);
    }
    out.set_attempts(t.attempts);
    out.set_worker_id(t.worker_id);
    out.set_reason(t.reason);
    return out;
  }

  // The API form of a search from its record and trials (active or finished).
  v1::Search SearchProto(const SearchRecord& rec, const std::vector<const TrialRecord*>& trials,
                         int planned) const {
    v1::Search out;
    out.set_id(rec.id);
    out.set_owner(rec.owner);
    out.set_state(rec.state);
    *out.mutable_spec() = rec.spec;
    for (const std::string& p : rec.frontier) out.add_frontier(p);
    if (rec.recommendation) out.set_recommendation(*rec.recommendation);
    *out.mutable_apply() = rec.apply;
    out.set_message(rec.message);
    out.set_memory_budget_bytes(BudgetBytes(rec.spec));
    out.set_created_unix_ms(rec.created_unix_ms);
    out.set_updated_unix_ms(rec.updated_unix_ms);
    int done = 0;
    for (const TrialRecord* t : trials) {
      *out.add_trials() = TrialProto(*t);
      if (IsFinal(t->status)) ++done;
    }
    out.set_trials_done(done);
    out.set_trials_planned(std::max<int>(planned, static_cast<int>(trials.size())));
    return out;
  }

  v1::Search ActiveSearchProto(const Search& s) const {
    SearchRecord rec = s.rec;
    rec.frontier.clear();
    std::vector<search::FrontierPoint> frontier = Frontier(s);
    for (const auto& p : frontier) rec.frontier.push_back(p.policy.ToString());
    if (auto best = search::Recommend(frontier)) {
      rec.recommendation = best->policy.ToString();
      rec.apply.set_megatron_bridge(best->policy.MegatronBridgeOverrides());
      rec.apply.set_megatron_lm(best->policy.MegatronLmFlags());
    }
    std::vector<const TrialRecord*> trials;
    for (const auto& t : s.trials) trials.push_back(&t->rec);
    return SearchProto(rec, trials, PlannedTotal(s));
  }

  v1::SearchProgress Progress(const Search& s, const Trial* last) const {
    v1::SearchProgress p;
    p.set_id(s.rec.id);
    p.set_state(s.rec.state);
    p.set_trials_done(s.done);
    const int planned = s.rec.state == v1::SEARCH_STATE_QUEUED ||
                                s.rec.state == v1::SEARCH_STATE_RUNNING
                            ? PlannedTotal(s)
                            : static_cast<int>(s.trials.size());
    p.set_trials_planned(planned);
    p.set_trials_running(s.running);
    std::vector<search::FrontierPoint> frontier = Frontier(s);
    for (const auto& f : frontier) p.add_frontier(f.policy.ToString());
    if (auto best = search::Recommend(frontier)) {
      p.set_best_policy(best->policy.ToString());
      p.set_best_tokens_per_s(best->tokens_per_s);
      p.set_best_peak_bytes(best->memory_bytes);
    }
    if (last != nullptr) *p.mutable_last_trial() = TrialProto(last->rec);
    const double elapsed = std::max<int64_t>(0, UnixNow() - s.rec.created_unix_ms) / 1000.0;
    p.set_elapsed_s(elapsed);
    if (!IsFinished(s.rec.state) && s.done > 0 && planned > s.done) {
      p.set_eta_s(elapsed / s.done * (planned - s.done));
    }
    return p;
  }

  void Push(uint64_t watch_id, v1::SearchProgress update, bool final) {
    auto it = watchers_.find(watch_id);
    if (it == watchers_.end() || it->second.final_queued) return;
    Watcher& w = it->second;
    if (w.pending.size() >= kMaxPendingUpdates) w.pending.pop_front();  // slow reader
    w.pending.push_back(std::move(update));
    w.final_queued = final;
    if (w.wake) Defer(w.wake);
  }

  void Notify(Search& s, const Trial* last) {
    if (s.watchers.empty()) return;
    const bool final = IsFinished(s.rec.state);
    v1::SearchProgress p = Progress(s, last);
    for (uint64_t id : s.watchers) Push(id, p, final);
  }

  // Writes the search's state and derived fields.
  absl::Status SaveSearch(Search& s) {
    s.rec.updated_unix_ms = UnixNow();
    s.rec.trials_planned = PlannedTotal(s);
    return store_->UpdateSearch(s.rec);
  }

  // Proposes trials until the search's queue holds its share of the free slots, and writes
  // them to the store. Candidates that could not be written are kept and written next time.
  void Refill(Search& s, int64_t free_slots = -1) {
    if (IsFinished(s.rec.state) || s.finalize_pending) return;
    if (free_slots < 0) free_slots = FreeSlots();
    const int64_t active = std::max<int64_t>(1, static_cast<int64_t>(active_.size()));
    const int64_t target = std::max<int64_t>(1, (free_slots + active - 1) / active);
    const int64_t want = target - static_cast<int64_t>(s.queue.size() + s.unsaved.size());
    if (want > 0 && !s.strategy->Done()) {
      for (auto& c : s.strategy->Propose(static_cast<int>(want))) s.unsaved.push_back(std::move(c));
    }
    if (s.unsaved.empty()) return;
    std::vector<TrialRecord> records;
    for (const search::Candidate& c : s.unsaved) {
      TrialRecord t;
      t.id = NewId("t-");
      t.search_id = s.rec.id;
      t.seq = static_cast<int32_t>(s.trials.size() + records.size());
      t.policy = c.policy.ToString();
      t.reason = c.reason;
      t.status = v1::TRIAL_STATUS_PENDING;
      records.push_back(std::move(t));
    }
    absl::Status st = store_->AddTrials(records);
    if (!st.ok()) {
      log_->error("search={} could not record {} proposed trials (will retry): {}", s.rec.id,
                  records.size(), st.ToString());
      return;
    }
    s.unsaved.clear();
    for (TrialRecord& r : records) {
      auto t = std::make_unique<Trial>();
      t->rec = std::move(r);
      log_->debug("search={} trial={} queued policy={} reason=\"{}\"", s.rec.id, t->rec.id,
                 t->rec.policy, t->rec.reason);
      s.queue.push_back(t.get());
      trial_index_[t->rec.id] = {&s, t.get()};
      s.trials.push_back(std::move(t));
    }
    UpdateReady(s);
  }

  // Ends the search when nothing is outstanding and the strategy is done (or can propose
  // nothing more). Returns true when the search left memory.
  bool MaybeFinish(Search& s) {
    if (!s.queue.empty() || s.running > 0 || !s.unsaved.empty()) return false;
    if (!s.strategy->Done()) {
      // Refill asked for more and got nothing while nothing is outstanding: the strategy cannot
      // go on. Finish with what was measured rather than leave the search stuck.
      log_->warn("search={} strategy proposes nothing more but is not done; finishing",
                 s.rec.id);
    }
    return Finish(s);
  }

  // Computes frontier, recommendation and apply, and records the final state.
  bool Finish(Search& s) {
    std::vector<search::FrontierPoint> frontier = Frontier(s);
    SearchRecord& rec = s.rec;
    const v1::SearchState old_state = rec.state;
    rec.frontier.clear();
    for (const auto& p : frontier) rec.frontier.push_back(p.policy.ToString());
    const MemoryMetricAndBudget mb{s.spec.search.memory_metric, s.spec.search.MemoryBudgetBytes()};
    if (auto best = search::Recommend(frontier)) {
      rec.recommendation = best->policy.ToString();
      rec.apply.set_megatron_bridge(best->policy.MegatronBridgeOverrides());
      rec.apply.set_megatron_lm(best->policy.MegatronLmFlags());
      rec.message.clear();
    } else {
      rec.recommendation.reset();
      rec.apply.Clear();
      rec.message = search::NothingFitsMessage(s.results, mb.metric, mb.budget);
    }
    bool measured = false;
    std::string first_failure;
    for (const search::TrialResult& r : s.results) {
      if (r.status == search::TrialStatus::kOk || r.status == search::TrialStatus::kOom) {
        measured = true;
      } else if (first_failure.empty()) {
        first_failure = absl::StrCat(r.policy.ToString(), ": ", search::Name(r.status),
                                     r.message.empty() ? "" : " (" + r.message + ")");
      }
    }
    rec.state = measured ? v1::SEARCH_STATE_SUCCEEDED : v1::SEARCH_STATE_FAILED;
    if (!measured) {
      rec.message = s.results.empty()
                        ? "no trial ran: the strategy proposed none"
                        : absl::StrCat("no trial produced a measurement; first failure: ",
                                       first_failure);
    }
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

  // Removes a finished search from memory after telling its watchers.
  void Retire(Search& s) {
    Notify(s, nullptr);
    for (uint64_t id : s.watchers) {
      if (auto it = watchers_.find(id); it != watchers_.end()) it->second.search_id.clear();
    }
    if (metrics_ != nullptr) metrics_->RemoveFrontier(s.rec.id);
    frontier_series_.erase(s.rec.id);
    for (const auto& t : s.trials) trial_index_.erase(t->rec.id);
    ready_.erase(s.rec.id);
    active_.erase(s.rec.id);  // destroys s
  }

  struct MemoryMetricAndBudget {
    search::MemoryMetric metric;
    uint64_t budget;
  };

  void PublishFrontier(Search& s) {
    if (metrics_ == nullptr) return;
    if (frontier_series_.count(s.rec.id) == 0) {
      if (static_cast<int>(frontier_series_.size()) >= opt_.max_frontier_series) return;
      frontier_series_.insert(s.rec.id);
    }
    metrics_->SetFrontierPoints(s.rec.id, static_cast<int64_t>(Frontier(s).size()));
  }

  // Applies a final result that the store has recorded. Returns true when the search ended.
  bool Apply(Search& s, Trial& t, const v1::TrialResult& result, const std::string& by_worker) {
    double duration_s = 0;
    if (t.rec.status == v1::TRIAL_STATUS_RUNNING) {
      --s.running;
      duration_s = (Now() - t.leased_ms) / 1000.0;
      if (Worker* holder = FindWorker(t.rec.worker_id)) {
        if (holder->leases.erase(t.rec.id) != 0) AddBusy(*holder, -s.world_size);
      }
    } else if (t.rec.status == v1::TRIAL_STATUS_PENDING) {
      s.queue.erase(std::remove(s.queue.begin(), s.queue.end(), &t), s.queue.end());
      UpdateReady(s);
    }
    t.rec.status = result.status();
    t.rec.result = result;
    t.rec.result->mutable_policy()->set_canonical(t.rec.policy);
    if (!by_worker.empty()) t.rec.worker_id = by_worker;
    ++s.done;
    search::TrialResult domain = ToDomain(t.rec.policy, result);
    s.strategy->Observe(domain);
    s.results.push_back(std::move(domain));
    if (metrics_ != nullptr) metrics_->TrialFinished(result.status(), result.reused(), duration_s);
    log_->info("search={} trial={} {} policy={} step_time_s={:.4f} tokens_per_s={:.1f}{}{}",
               s.rec.id, t.rec.id, StatusLabel(result.status()), t.rec.policy,
               result.step_time_s(), result.tokens_per_s(), result.reused() ? " (reused)" : "",
               result.message().empty() ? "" : " message=\"" + result.message() + "\"");
    Refill(s);
    Notify(s, &t);
    PublishFrontier(s);
    return MaybeFinish(s);
  }

  // A lease was lost (silent worker, or the worker no longer runs it): requeue the trial, or
  // fail it after max_trial_attempts. Returns false when the store refused (retry later).
  bool LoseLease(Search& s, Trial& t, const std::string& reason) {
    if (t.rec.attempts >= opt_.max_trial_attempts) {
      v1::TrialResult failed;
      failed.mutable_policy()->set_canonical(t.rec.policy);
      failed.set_status(v1::TRIAL_STATUS_FAILED);
      failed.set_message(absl::StrCat("lost its worker ", t.rec.attempts, " times (limit ",
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
    if (Worker* holder = FindWorker(t.rec.worker_id)) {
      if (holder->leases.erase(t.rec.id) != 0) AddBusy(*holder, -s.world_size);
    }
    --s.running;
    t.rec.status = v1::TRIAL_STATUS_PENDING;
    s.queue.push_front(&t);
    UpdateReady(s);
    log_->warn("search={} trial={} requeued after attempt {}: {}", s.rec.id, t.rec.id,
               t.rec.attempts, reason);
    return true;
  }

  bool Supports(const Worker& w, const Search& s) const {
    if (!w.backends.empty() && w.backends.count(s.backend) == 0) return false;
    if (s.spec.search.backend == search::Backend::kCommand &&
        w.templates.count(s.spec.search.command_template) == 0) {
      return false;
    }
    return true;
  }

  // The next search (round robin after the last one served) with a queued trial that fits.
  Search* NextReady(const Worker& w, int free) {
    if (ready_.empty()) return nullptr;
    auto start = ready_.upper_bound(cursor_);
    auto it = start;
    for (size_t n = 0; n < ready_.size(); ++n) {
      if (it == ready_.end()) it = ready_.begin();
      Search& s = *active_.at(*it);
      if (s.world_size <= free && Supports(w, s)) {
        cursor_ = *it;
        return &s;
      }
      ++it;
    }
    return nullptr;
  }

  // Hands queued trials to worker `w` while they fit in `free` slots. Trials found in the
  // results cache are recorded as reused on the way.
  absl::StatusOr<v1::LeaseTrialResponse> Allocate(Worker& w, int free) {
    v1::LeaseTrialResponse out;
    while (free > 0) {
      Search* s = NextReady(w, free);
      if (s == nullptr) break;
      Trial& t = *s->queue.front();
      const v1::ReplayEntry* replay = nullptr;
      if (s->spec.search.backend == search::Backend::kReplay) {
        auto it = s->rec.replay_table.trials().find(t.rec.policy);
        if (it != s->rec.replay_table.trials().end()) replay = &it->second;
      }
      const std::string key = ResultsCacheKey(s->rec.spec, t.rec.policy, w.rec.registration,
                                              replay);
      auto cached = store_->LookupCache(key);
      if (!cached.ok()) {
        log_->warn("results cache lookup failed (running the trial): {}",
                   cached.status().ToString());
      } else if (cached->has_value()) {
        v1::TrialResult result = **cached;
        result.set_reused(true);
        result.mutable_policy()->set_canonical(t.rec.policy);
        auto recorded = store_->RecordResult(t.rec.id, result, "", "");
        if (!recorded.ok()) return recorded.status();
        Apply(*s, t, result, "");  // may retire *s
        continue;
      }
      const int32_t attempt = t.rec.attempts + 1;
      absl::Status st = store_->LeaseTrial(t.rec.id, attempt, w.rec.id);
      if (!st.ok()) {
        if (out.trials_size() > 0) break;
        return st;
      }
      s->queue.pop_front();
      UpdateReady(*s);
      t.rec.status = v1::TRIAL_STATUS_RUNNING;
      t.rec.attempts = attempt;
      t.rec.worker_id = w.rec.id;
      t.leased_ms = t.confirmed_ms = Now();
      ++s->running;
      AddBusy(w, s->world_size);
      w.leases.insert(t.rec.id);
      free -= s->world_size;

      v1::TrialAssignment* a = out.add_trials();
      a->set_trial_id(t.rec.id);
      a->set_search_id(s->rec.id);
      *a->mutable_spec() = s->rec.spec;
      a->mutable_policy()->set_canonical(t.rec.policy);
      a->set_world_size(s->world_size);
      a->set_attempt(attempt);
      if (s->spec.search.backend == search::Backend::kReplay) {
        a->set_replay_found(replay != nullptr);
        if (replay != nullptr) *a->mutable_replay() = *replay;
      }
      log_->info("search={} trial={} leased to worker={} attempt={} policy={}", s->rec.id,
                 t.rec.id, w.rec.id, attempt, t.rec.policy);

      if (s->rec.state == v1::SEARCH_STATE_QUEUED) {
        s->rec.state = v1::SEARCH_STATE_RUNNING;
        absl::Status saved = SaveSearch(*s);
        if (!saved.ok()) {
          log_->warn("search={} could not record state running: {}", s->rec.id, saved.ToString());
        }
        CountState(v1::SEARCH_STATE_QUEUED, v1::SEARCH_STATE_RUNNING);
        Notify(*s, nullptr);
      }
      Refill(*s);
    }
    return out;
  }

  int FreeFor(const Worker& w, int32_t asked) const {
    return std::max(0, std::min<int>(asked, w.slots - w.busy));
  }

  // Gives newly queued work to parked LeaseTrial calls, oldest first.
  void ServeWaiters() {
    for (auto it = waiters_.begin(); it != waiters_.end() && !ready_.empty();) {
      Worker* w = FindWorker(it->request.worker_id());
      if (w == nullptr) {
        ++it;
        continue;
      }
      auto got = Allocate(*w, FreeFor(*w, it->request.free_slots()));
      if (got.ok() && got->trials_size() == 0) {
        ++it;
        continue;
      }
      Complete(*it, std::move(got));
      waiter_index_.erase(it->id);
      it = waiters_.erase(it);
    }
  }

  void Complete(Waiter& waiter, absl::StatusOr<v1::LeaseTrialResponse> response) {
    Defer([done = std::move(waiter.done), r = std::move(response)]() mutable { done(std::move(r)); });
  }

  void RefillAll() {
    std::vector<Search*> searches;
    for (auto& [id, s] : active_) searches.push_back(s.get());
    const int64_t free = FreeSlots();
    for (Search* s : searches) {
      Refill(*s, free);
      MaybeFinish(*s);
    }
  }

  // ------------------------------------------------------------------------- state

  SchedulerOptions opt_;
  JobStore* store_;
  Metrics* metrics_;
  std::shared_ptr<spdlog::logger> log_;

  std::mutex mu_;
  std::vector<std::function<void()>> deferred_;
  std::mt19937_64 rng_;
  bool shutdown_ = false;

  std::map<std::string, std::unique_ptr<Search>> active_;
  std::unordered_map<std::string, std::pair<Search*, Trial*>> trial_index_;
  std::set<std::string> ready_;  // searches with queued trials
  std::string cursor_;           // round robin: the search served last
  std::unordered_map<std::string, Worker> workers_;
  int64_t free_slots_ = 0;  // see FreeSlots()
  std::map<v1::SearchState, int64_t> state_counts_;
  std::set<std::string> frontier_series_;

  std::unordered_map<uint64_t, Watcher> watchers_;
  std::list<Waiter> waiters_;
  std::unordered_map<uint64_t, std::list<Waiter>::iterator> waiter_index_;
  uint64_t next_handle_ = 1;
};

// ---------------------------------------------------------------------------------------------

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
  State& st = *state_;
  State::Locked lock(&st);
  REMAT_ASSIGN_OR_RETURN(auto counts, st.store_->CountSearchesByState());
  for (v1::SearchState s : {v1::SEARCH_STATE_QUEUED, v1::SEARCH_STATE_RUNNING,
                            v1::SEARCH_STATE_SUCCEEDED, v1::SEARCH_STATE_FAILED,
                            v1::SEARCH_STATE_CANCELLED}) {
    st.state_counts_[s] = counts.count(s) ? counts[s] : 0;
  }
  REMAT_ASSIGN_OR_RETURN(std::vector<WorkerRecord> workers, st.store_->LoadWorkers());
  for (WorkerRecord& rec : workers) {
    State::Worker w;
    w.slots = std::max(1, rec.registration.gpus_size());  // not connected: no free slots yet
    for (const auto& b : rec.registration.backends()) w.backends.insert(b);
    for (const auto& t : rec.registration.command_templates()) w.templates.insert(t);
    w.rec = std::move(rec);
    st.workers_.emplace(w.rec.id, std::move(w));
  }
  REMAT_ASSIGN_OR_RETURN(std::vector<SearchRecord> searches, st.store_->LoadUnfinishedSearches());
  int resumed = 0, requeued = 0, kept = 0;
  for (SearchRecord& rec : searches) {
    auto s = std::make_unique<State::Search>();
    s->rec = std::move(rec);
    auto spec = proto::FromProto(s->rec.spec);
    if (!spec.ok()) {
      st.log_->error("search={} cannot be resumed: {}", s->rec.id, spec.status().message());
      const v1::SearchState old = s->rec.state;
      s->rec.state = v1::SEARCH_STATE_FAILED;
      s->rec.message = "cannot be resumed: " + spec.status().message();
      s->rec.updated_unix_ms = st.UnixNow();
      REMAT_RETURN_IF_ERROR(st.store_->UpdateSearch(s->rec));
      st.CountState(old, v1::SEARCH_STATE_FAILED);
      continue;
    }
    s->spec = *spec;
    s->world_size = std::max(1, s->spec.parallel.WorldSize());
    s->backend = search::Name(s->spec.search.backend);
    s->strategy = st.opt_.make_strategy(s->spec);
    REMAT_ASSIGN_OR_RETURN(std::vector<TrialRecord> trials, st.store_->LoadTrials(s->rec.id));
    std::vector<search::Candidate> proposed;
    std::vector<search::TrialResult> results;
    for (TrialRecord& rec : trials) {
      auto t = std::make_unique<State::Trial>();
      t->rec = std::move(rec);
      search::Candidate c;
      if (auto p = search::ParsePolicy(t->rec.policy); p.ok()) {
        c.policy = *p;
        c.estimate = search::EstimateMemory(s->spec, c.policy);
      }
      c.reason = t->rec.reason;
      proposed.push_back(std::move(c));
      if (IsFinal(t->rec.status) && t->rec.result) {
        results.push_back(ToDomain(t->rec.policy, *t->rec.result));
        ++s->done;
      } else if (t->rec.status == v1::TRIAL_STATUS_RUNNING) {
        State::Worker* w = st.FindWorker(t->rec.worker_id);
        if (w == nullptr) {
          REMAT_RETURN_IF_ERROR(st.store_->RequeueTrial(t->rec.id));
          t->rec.status = v1::TRIAL_STATUS_PENDING;
          s->queue.push_back(t.get());
          ++requeued;
        } else {
          // Still leased: the worker may report it; silent for a lease timeout = requeued.
          st.SetConnected(*w, true);
          w->last_seen_ms = st.Now();
          st.AddBusy(*w, s->world_size);
          w->leases.insert(t->rec.id);
          t->leased_ms = t->confirmed_ms = st.Now();
          ++s->running;
          ++kept;
        }
      } else {
        t->rec.status = v1::TRIAL_STATUS_PENDING;
        s->queue.push_back(t.get());
      }
      st.trial_index_[t->rec.id] = {s.get(), t.get()};
      s->trials.push_back(std::move(t));
    }
    s->strategy->Restore(proposed, results);
    s->results = std::move(results);
    if (s->rec.state == v1::SEARCH_STATE_QUEUED && (s->running > 0 || s->done > 0)) {
      // Killed between a lease and recording the state change it caused.
      s->rec.state = v1::SEARCH_STATE_RUNNING;
      s->rec.updated_unix_ms = st.UnixNow();
      REMAT_RETURN_IF_ERROR(st.store_->UpdateSearch(s->rec));
      st.CountState(v1::SEARCH_STATE_QUEUED, v1::SEARCH_STATE_RUNNING);
    }
    State::Search& ref = *s;
    st.active_.emplace(ref.rec.id, std::move(s));
    st.UpdateReady(ref);
    st.PublishFrontier(ref);
    ++resumed;
    st.log_->info("search={} resumed: {} trials recorded, {} done, {} leased, {} queued", ref.rec.id,
                  ref.trials.size(), ref.done, ref.running, ref.queue.size());
  }
  if (resumed > 0) {
    st.log_->info("resumed {} unfinished searches ({} leases kept, {} trials requeued)", resumed,
                  kept, requeued);
  }
  st.RefillAll();
  return absl::OkStatus();
}

absl::StatusOr<v1::SubmitSearchResponse> Scheduler::SubmitSearch(
    const Principal& who, const v1::SubmitSearchRequest& request) {
  auto spec = proto::FromProto(request.spec());
  if (!spec.ok()) return ToAbsl(spec.status());
  if (spec->search.backend == search::Backend::kReplay && spec->search.replay_table.empty() &&
      request.replay_table().trials_size() > 0) {
    // The table came with the request; the path is only informational here.
    spec->search.replay_table = "(sent with the request)";
  }
  search::Status valid = search::ValidateSpec(*spec);
  if (!valid.ok()) return ToAbsl(valid);

  auto s = std::make_unique<State::Search>();
  s->spec = *spec;
  if (s->spec.search.backend == search::Backend::kReplay) {
    if (request.replay_table().trials().empty()) {
      return absl::InvalidArgumentError(
          "replay_table: backend replay needs the table's entries (the client sends the table)");
    }
    for (const auto& [key, entry] : request.replay_table().trials()) {
      auto policy = search::ParsePolicy(key);
      if (!policy.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("replay_table: \"", key, "\": ", policy.status().message()));
      }
      (*s->rec.replay_table.mutable_trials())[policy->ToString()] = entry;
    }
  }
  if (s->spec.search.backend == search::Backend::kCommand &&
      s->spec.search.command_template.empty()) {
    return absl::InvalidArgumentError(
        "search.command_template: required with backend command (a template configured on the "
        "workers)");
  }
  s->rec.owner = who.name;
  s->rec.spec = proto::ToProto(s->spec);
  s->rec.state = v1::SEARCH_STATE_QUEUED;
  s->world_size = std::max(1, s->spec.parallel.WorldSize());
  s->backend = search::Name(s->spec.search.backend);

  State& st = *state_;
  State::Locked lock(&st);
  if (st.shutdown_) return absl::UnavailableError("coordinator is shutting down");
  s->strategy = st.opt_.make_strategy(s->spec);
  s->rec.id = st.NewId("s-");
  s->rec.created_unix_ms = s->rec.updated_unix_ms = st.UnixNow();
  s->rec.trials_planned = s->strategy->PlannedTotal();
  REMAT_RETURN_IF_ERROR(st.store_->CreateSearch(s->rec));
  st.CountState(v1::SEARCH_STATE_UNSPECIFIED, v1::SEARCH_STATE_QUEUED);
  State::Search& ref = *s;
  const std::string id = ref.rec.id;
  st.active_.emplace(id, std::move(s));
  st.log_->info("search={} submitted by {}: name=\"{}\" strategy={} backend={} world_size={} "
                "planned={}",
                id, who.name.empty() ? "anonymous" : who.name, ref.spec.name,
                search::Name(ref.spec.search.strategy), ref.backend, ref.world_size,
                ref.rec.trials_planned);
  st.PublishFrontier(ref);
  st.Refill(ref);
  if (!st.MaybeFinish(ref)) st.ServeWaiters();
  v1::SubmitSearchResponse out;
  out.set_id(id);
  return out;
}

absl::StatusOr<v1::Search> Scheduler::GetSearch(const Principal& who, const std::string& id) {
  State& st = *state_;
  {
    State::Locked lock(&st);
    auto it = st.active_.find(id);
    if (it != st.active_.end()) {
      if (!CanSee(who, it->second->rec.owner)) {
        return absl::NotFoundError("search " + id + " not found");
      }
      return st.ActiveSearchProto(*it->second);
    }
  }
  // Finished searches are read from the store, outside the lock.
  REMAT_ASSIGN_OR_RETURN(std::optional<SearchRecord> rec, st.store_->LoadSearch(id));
  if (!rec || !CanSee(who, rec->owner)) return absl::NotFoundError("search " + id + " not found");
  REMAT_ASSIGN_OR_RETURN(std::vector<TrialRecord> trials, st.store_->LoadTrials(id));
  std::vector<const TrialRecord*> ptrs;
  for (const auto& t : trials) ptrs.push_back(&t);
  return st.SearchProto(*rec, ptrs, rec->trials_planned);
}

absl::StatusOr<v1::CancelSearchResponse> Scheduler::CancelSearch(const Principal& who,
                                                                 const std::string& id) {
  State& st = *state_;
  State::Locked lock(&st);
  v1::CancelSearchResponse out;
  auto it = st.active_.find(id);
  if (it == st.active_.end()) {
    REMAT_ASSIGN_OR_RETURN(std::optional<SearchRecord> rec, st.store_->LoadSearch(id));
    if (!rec || !CanSee(who, rec->owner)) return absl::NotFoundError("search " + id + " not found");
    if (rec->state == v1::SEARCH_STATE_CANCELLED) {
      out.set_state(rec->state);
      return out;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("search ", id, " already ", StateLabel(rec->state)));
  }
  State::Search& s = *it->second;
  if (!CanSee(who, s.rec.owner)) return absl::NotFoundError("search " + id + " not found");
  const std::string message =
      who.name.empty() ? "cancelled" : absl::StrCat("cancelled by ", who.name);
  REMAT_RETURN_IF_ERROR(st.store_->CancelSearch(id, st.UnixNow(), message));
  for (const auto& t : s.trials) {
    if (IsFinal(t->rec.status)) continue;
    if (t->rec.status == v1::TRIAL_STATUS_RUNNING) {
      if (State::Worker* w = st.FindWorker(t->rec.worker_id)) {
        if (w->leases.erase(t->rec.id) != 0) st.AddBusy(*w, -s.world_size);
      }
    }
    v1::TrialResult cancelled;
    cancelled.mutable_policy()->set_canonical(t->rec.policy);
    cancelled.set_status(v1::TRIAL_STATUS_CANCELLED);
    cancelled.set_message(message);
    t->rec.status = v1::TRIAL_STATUS_CANCELLED;
    t->rec.result = cancelled;
    if (st.metrics_ != nullptr) st.metrics_->TrialFinished(v1::TRIAL_STATUS_CANCELLED, false, 0);
  }
  s.queue.clear();
  s.running = 0;
  s.unsaved.clear();
  st.CountState(s.rec.state, v1::SEARCH_STATE_CANCELLED);
  s.rec.state = v1::SEARCH_STATE_CANCELLED;
  s.rec.message = message;
  st.log_->info("search={} {}", id, message);
  st.Retire(s);
  out.set_state(v1::SEARCH_STATE_CANCELLED);
  return out;
}

absl::StatusOr<v1::ListSearchesResponse> Scheduler::ListSearches(const Principal& who,
                                                                 int limit) {
  if (limit <= 0) limit = kDefaultListLimit;
  limit = std::min(limit, kMaxListLimit);
  std::optional<std::string> owner;
  if (!who.sees_all) owner = who.name;
  REMAT_ASSIGN_OR_RETURN(auto rows, state_->store_->ListSearches(owner, limit));
  v1::ListSearchesResponse out;
  for (const SearchSummaryRecord& row : rows) {
    v1::SearchSummary* s = out.add_searches();
    s->set_id(row.search.id);
    s->set_name(row.search.spec.name());
    s->set_owner(row.search.owner);
    s->set_state(row.search.state);
    s->set_trials_done(row.trials_done);
    s->set_trials_planned(std::max(row.search.trials_planned, row.trials_done));
    if (row.search.recommendation) s->set_recommendation(*row.search.recommendation);
    s->set_created_unix_ms(row.search.created_unix_ms);
  }
  return out;
}

absl::StatusOr<uint64_t> Scheduler::Watch(const Principal& who, const std::string& id,
                                          std::function<void()> wake) {
  State& st = *state_;
  {
    State::Locked lock(&st);
    if (st.shutdown_) return absl::UnavailableError("coordinator is shutting down");
    auto it = st.active_.find(id);
    if (it != st.active_.end()) {
      State::Search& s = *it->second;
      if (!CanSee(who, s.rec.owner)) return absl::NotFoundError("search " + id + " not found");
      const uint64_t handle = st.next_handle_++;
      State::Watcher& w = st.watchers_[handle];
      w.search_id = id;
      w.wake = std::move(wake);
      s.watchers.push_back(handle);
      st.Push(handle, st.Progress(s, nullptr), false);
      return handle;
    }
  }
  REMAT_ASSIGN_OR_RETURN(std::optional<SearchRecord> rec, st.store_->LoadSearch(id));
  if (!rec || !CanSee(who, rec->owner)) return absl::NotFoundError("search " + id + " not found");
  REMAT_ASSIGN_OR_RETURN(std::vector<TrialRecord> trials, st.store_->LoadTrials(id));
  v1::SearchProgress p;
  p.set_id(rec->id);
  p.set_state(rec->state);
  int done = 0;
  for (const auto& t : trials) done += IsFinal(t.status) ? 1 : 0;
  p.set_trials_done(done);
  p.set_trials_planned(static_cast<int32_t>(trials.size()));
  for (const auto& f : rec->frontier) p.add_frontier(f);
  if (rec->recommendation) {
    p.set_best_policy(*rec->recommendation);
    for (const auto& t : trials) {
      if (t.policy == *rec->recommendation && t.result) {
        p.set_best_tokens_per_s(t.result->tokens_per_s());
        uint64_t peak = 0;
        for (const auto& r : t.result->ranks()) {
          peak = std::max<uint64_t>(peak, rec->spec.search().memory_metric() == "allocated"
                                              ? r.peak_allocated_bytes()
                                              : r.peak_reserved_bytes());
        }
        p.set_best_peak_bytes(peak);
      }
    }
  }
  p.set_elapsed_s(std::max<int64_t>(0, rec->updated_unix_ms - rec->created_unix_ms) / 1000.0);
  State::Locked lock(&st);
  const uint64_t handle = st.next_handle_++;
  State::Watcher& w = st.watchers_[handle];
  w.wake = std::move(wake);
  st.Push(handle, std::move(p), true);
  return handle;
}

Scheduler::WatchPoll Scheduler::PollWatch(uint64_t watch_id, v1::SearchProgress* update) {
  State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mu_);
  auto it = st.watchers_.find(watch_id);
  if (it == st.watchers_.end()) return WatchPoll::kClosed;
  State::Watcher& w = it->second;
  if (!w.pending.empty()) {
    *update = std::move(w.pending.front());
    w.pending.pop_front();
    if (w.pending.empty() && w.final_queued) {
      if (auto s = st.active_.find(w.search_id); s != st.active_.end()) {
        auto& ids = s->second->watchers;
        ids.erase(std::remove(ids.begin(), ids.end(), watch_id), ids.end());
      }
      st.watchers_.erase(it);
      return WatchPoll::kFinal;
    }
    return WatchPoll::kUpdate;
  }
  if (w.closed) {
    st.watchers_.erase(it);
    return WatchPoll::kClosed;
  }
  return WatchPoll::kNone;
}

void Scheduler::Unwatch(uint64_t watch_id) {
  State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mu_);
  auto it = st.watchers_.find(watch_id);
  if (it == st.watchers_.end()) return;
  if (auto s = st.active_.find(it->second.search_id); s != st.active_.end()) {
    auto& ids = s->second->watchers;
    ids.erase(std::remove(ids.begin(), ids.end(), watch_id), ids.end());
  }
  st.watchers_.erase(it);
}

absl::StatusOr<v1::RegisterResponse> Scheduler::Register(const v1::RegisterRequest& request) {
  if (request.worker_id().size() > 64) {
    return absl::InvalidArgumentError("worker_id: at most 64 characters");
  }
  for (const v1::Gpu& gpu : request.gpus()) {
    if (gpu.name().empty()) return absl::InvalidArgumentError("gpus.name: must not be empty");
  }
  State& st = *state_;
  State::Locked lock(&st);
  WorkerRecord rec;
  rec.id = request.worker_id().empty() ? st.NewId("w-") : request.worker_id();
  rec.hostname = request.hostname();
  rec.registration = request;
  rec.registration.set_worker_id(rec.id);
  rec.registered_unix_ms = st.UnixNow();
  REMAT_RETURN_IF_ERROR(st.store_->UpsertWorker(rec));
  State::Worker& w = st.workers_[rec.id];
  const bool known = !w.rec.id.empty();
  w.rec = std::move(rec);
  st.SetSlots(w, std::max(1, request.gpus_size()));
  w.backends = {request.backends().begin(), request.backends().end()};
  w.templates = {request.command_templates().begin(), request.command_templates().end()};
  st.Touch(w);
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

absl::StatusOr<v1::HeartbeatResponse> Scheduler::Heartbeat(const v1::HeartbeatRequest& request) {
  State& st = *state_;
  State::Locked lock(&st);
  v1::HeartbeatResponse out;
  State::Worker* w = st.FindWorker(request.worker_id());
  if (w == nullptr) {
    out.set_reregister(true);
    return out;
  }
  const bool was_connected = w->connected;
  st.Touch(*w);
  if (!was_connected) st.RefillAll();
  std::set<std::string> running(request.running_trial_ids().begin(),
                                request.running_trial_ids().end());
  for (const std::string& id : running) {
    auto it = st.trial_index_.find(id);
    if (it == st.trial_index_.end()) {
      out.add_cancel_trial_ids(id);  // finished search, or unknown
      continue;
    }
    auto [s, t] = it->second;
    if (IsFinal(t->rec.status) ||
        (t->rec.status == v1::TRIAL_STATUS_RUNNING && t->rec.worker_id != w->rec.id)) {
      out.add_cancel_trial_ids(id);
    } else if (t->rec.status == v1::TRIAL_STATUS_RUNNING) {
      t->confirmed_ms = st.Now();
    } else if (t->rec.status == v1::TRIAL_STATUS_PENDING && s->world_size <= w->slots - w->busy) {
      // Requeued while this worker still ran it (e.g. a short partition): take it back.
      absl::Status leased = st.store_->LeaseTrial(id, std::max(1, t->rec.attempts), w->rec.id);
      if (!leased.ok()) return leased;
      s->queue.erase(std::remove(s->queue.begin(), s->queue.end(), t), s->queue.end());
      st.UpdateReady(*s);
      t->rec.status = v1::TRIAL_STATUS_RUNNING;
      t->rec.attempts = std::max(1, t->rec.attempts);
      t->rec.worker_id = w->rec.id;
      t->leased_ms = t->confirmed_ms = st.Now();
      ++s->running;
      st.AddBusy(*w, s->world_size);
      w->leases.insert(id);
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

uint64_t Scheduler::LeaseTrial(const v1::LeaseTrialRequest& request, LeaseDone done) {
  State& st = *state_;
  State::Locked lock(&st);
  const int64_t started = st.Now();
  State::Worker* w = st.FindWorker(request.worker_id());
  if (w == nullptr) {
    st.Defer([done = std::move(done), id = request.worker_id()] {
      done(absl::FailedPreconditionError("unknown worker " + id + "; register first"));
    });
    return 0;
  }
  const bool was_connected = w->connected;
  st.Touch(*w);
  if (!was_connected) st.RefillAll();
  absl::StatusOr<v1::LeaseTrialResponse> got = v1::LeaseTrialResponse();
  if (!st.shutdown_) got = st.Allocate(*w, st.FreeFor(*w, request.free_slots()));
  const double wait_s = std::min(request.wait_s(), st.opt_.max_lease_wait_s);
  if (!got.ok() || got->trials_size() > 0 || wait_s <= 0 || st.shutdown_) {
    st.Defer([done = std::move(done), r = std::move(got)]() mutable { done(std::move(r)); });
    return 0;
  }
  const uint64_t id = st.next_handle_++;
  st.waiters_.push_back(State::Waiter{id, request, std::move(done),
                                      started + static_cast<int64_t>(wait_s * 1000), started});
  st.waiter_index_[id] = std::prev(st.waiters_.end());
  return id;
}

void Scheduler::CancelLeaseWait(uint64_t wait_id) {
  State& st = *state_;
  State::Locked lock(&st);
  auto it = st.waiter_index_.find(wait_id);
  if (it == st.waiter_index_.end()) return;
  st.Complete(*it->second, v1::LeaseTrialResponse());
  st.waiters_.erase(it->second);
  st.waiter_index_.erase(it);
}

absl::StatusOr<v1::ReportTrialResponse> Scheduler::ReportTrial(
    const v1::ReportTrialRequest& request) {
  if (!IsFinal(request.result().status())) {
    return absl::InvalidArgumentError("result.status: must be a final status (ok, oom, failed, "
                                      "timeout, invalid or cancelled)");
  }
  State& st = *state_;
  State::Locked lock(&st);
  v1::ReportTrialResponse out;
  State::Worker* w = st.FindWorker(request.worker_id());
  if (w != nullptr) st.Touch(*w);
  auto it = st.trial_index_.find(request.trial_id());
  if (it == st.trial_index_.end()) {
    st.log_->info("trial={} report from worker={} not accepted: not an active trial",
                  request.trial_id(), request.worker_id());
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
  v1::TrialResult result = request.result();
  result.mutable_policy()->set_canonical(t->rec.policy);
  result.set_reused(false);
  std::string cache_key;
  if (w != nullptr &&
      (result.status() == v1::TRIAL_STATUS_OK || result.status() == v1::TRIAL_STATUS_OOM)) {
    const v1::ReplayEntry* replay = nullptr;
    if (s->spec.search.backend == search::Backend::kReplay) {
      auto r = s->rec.replay_table.trials().find(t->rec.policy);
      if (r != s->rec.replay_table.trials().end()) replay = &r->second;
    }
    cache_key = ResultsCacheKey(s->rec.spec, t->rec.policy, w->rec.registration, replay);
  }
  REMAT_ASSIGN_OR_RETURN(bool recorded,
                         st.store_->RecordResult(t->rec.id, result, request.worker_id(),
                                                 cache_key));
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
  for (auto it = st.waiters_.begin(); it != st.waiters_.end();) {
    if (it->deadline_ms > now) {
      ++it;
      continue;
    }
    st.Complete(*it, v1::LeaseTrialResponse());
    st.waiter_index_.erase(it->id);
    it = st.waiters_.erase(it);
  }
  const auto timeout_ms = static_cast<int64_t>(st.opt_.lease_timeout_s * 1000);
  bool changed = false;
  for (auto& [id, w] : st.workers_) {
    if (!w.connected || now - w.last_seen_ms <= timeout_ms) continue;
    const std::string reason = absl::StrFormat("worker %s silent for %.1f s", id,
                                               (now - w.last_seen_ms) / 1000.0);
    st.log_->warn("worker={} lost: silent for {:.1f} s, {} leases", id,
                  (now - w.last_seen_ms) / 1000.0, w.leases.size());
    bool all = true;
    const std::vector<std::string> leases(w.leases.begin(), w.leases.end());
    for (const std::string& trial_id : leases) {
      auto t = st.trial_index_.find(trial_id);
      if (t == st.trial_index_.end()) {
        w.leases.erase(trial_id);
        continue;
      }
      all = st.LoseLease(*t->second.first, *t->second.second, reason) && all;
    }
    if (all) st.SetConnected(w, false);
    changed = true;
  }
  // Retry what a store error left undone.
  std::vector<State::Search*> retry;
  for (auto& [id, s] : st.active_) {
    if (s->finalize_pending || !s->unsaved.empty() || changed) retry.push_back(s.get());
  }
  for (State::Search* s : retry) {
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
  State& st = *state_;
  std::lock_guard<std::mutex> lock(st.mu_);
  int64_t wait = kTickPeriodMs;
  const int64_t now = st.Now();
  for (const auto& w : st.waiters_) wait = std::min(wait, w.deadline_ms - now);
  return std::max<int64_t>(0, wait);
}

void Scheduler::Shutdown() {
  State& st = *state_;
  State::Locked lock(&st);
  st.shutdown_ = true;
  for (auto& w : st.waiters_) st.Complete(w, v1::LeaseTrialResponse());
  st.waiters_.clear();
  st.waiter_index_.clear();
  for (auto& [id, w] : st.watchers_) {
    w.closed = true;
    if (w.wake) st.Defer(w.wake);
  }
}

}  // namespace remat::server
