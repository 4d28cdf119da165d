#include "server/search_run.h"

#include <algorithm>
#include <set>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/convert.h"
#include "search/limits.h"
#include "search/capacity.h"
#include "search/layout_proxy.h"
#include "search/memory_model.h"
#include "search/policy.h"
#include "search/remeasure.h"
#include "search/text.h"
#include "server/status_util.h"

namespace remat::server {

bool IsFinal(v1::TrialStatus s) {
  // Named one by one: a proto3 enum field holds any int32 (99, -1) that the wire carries.
  switch (s) {
    case v1::TRIAL_STATUS_OK:
    case v1::TRIAL_STATUS_OOM:
    case v1::TRIAL_STATUS_FAILED:
    case v1::TRIAL_STATUS_TIMEOUT:
    case v1::TRIAL_STATUS_INVALID:
    case v1::TRIAL_STATUS_CANCELLED:
      return true;
    default:
      return false;
  }
}

bool IsFinished(v1::SearchState s) {
  return s == v1::SEARCH_STATE_SUCCEEDED || s == v1::SEARCH_STATE_FAILED ||
         s == v1::SEARCH_STATE_CANCELLED;
}

search::TrialResult ResultToDomain(const std::string& policy, const v1::TrialResult& msg) {
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

namespace {

absl::Status Figure(double v, const std::string& field) {
  if (!std::isfinite(v) || v < 0) {
    return absl::InvalidArgumentError(field + ": must be a finite number, not negative");
  }
  return absl::OkStatus();
}

// A step time is what throughput is divided by: 0 (not measured) or a real duration, never a
// denormal that turns tokens/s infinite.
absl::Status StepTime(double v, const std::string& field) {
  REMAT_RETURN_IF_ERROR(Figure(v, field));
  if (v != 0 && (v < search::limits::kMinStepTimeS || v > search::limits::kMaxTrialTimeoutS)) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", v, " s is not a step time (0, or ",
                                                   search::limits::kMinStepTimeS, " to ",
                                                   search::limits::kMaxTrialTimeoutS, " s)"));
  }
  return absl::OkStatus();
}

absl::Status Ranks(const google::protobuf::RepeatedPtrField<v1::RankResult>& ranks,
                   const std::string& where, int world_size) {
  if (ranks.size() > world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".ranks: ", ranks.size(), " ranks for a world of ", world_size));
  }
  std::set<int32_t> seen;
  for (int i = 0; i < ranks.size(); ++i) {
    const v1::RankResult& r = ranks[i];
    const std::string at = absl::StrCat(where, ".ranks[", i, "]");
    if (r.rank() < 0 || r.rank() >= world_size) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".rank: ", r.rank(), " is not a rank of a world of ", world_size));
    }
    if (!seen.insert(r.rank()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".rank: rank ", r.rank(), " has a result already"));
    }
    REMAT_RETURN_IF_ERROR(StepTime(r.step_time_s(), at + ".step_time_s"));
    if (r.step_times_s_size() > search::limits::kMaxSteps ||
        r.warmup_step_times_s_size() > search::limits::kMaxSteps) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, ".step_times_s: more than ", search::limits::kMaxSteps, " steps"));
    }
    for (double t : r.step_times_s()) REMAT_RETURN_IF_ERROR(StepTime(t, at + ".step_times_s"));
    for (double t : r.warmup_step_times_s()) {
      REMAT_RETURN_IF_ERROR(StepTime(t, at + ".warmup_step_times_s"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateWireResult(const v1::TrialResult& result, const std::string& where,
                                int world_size) {
  constexpr int kMaxVersions = search::limits::kMaxVersionEntries;
  if (!IsFinal(result.status())) {
    return absl::InvalidArgumentError(
        where + ".status: must be a final status (ok, oom, failed, timeout, invalid or cancelled)");
  }
  for (const auto& [value, field] :
       {std::pair<double, const char*>{result.step_time_s(), "step_time_s"},
        {result.step_time_spread_s(), "step_time_spread_s"},
        {result.tokens_per_s(), "tokens_per_s"},
        {result.model_tflops(), "model_tflops"},
        {result.setup_s(), "setup_s"},
        {result.wall_s(), "wall_s"}}) {
    REMAT_RETURN_IF_ERROR(Figure(value, where + "." + field));
  }
  REMAT_RETURN_IF_ERROR(StepTime(result.step_time_s(), where + ".step_time_s"));
  if (result.status() == v1::TRIAL_STATUS_OK && result.step_time_s() == 0) {
    return absl::InvalidArgumentError(where +
                                      ".step_time_s: an ok result needs its measured step time");
  }
  REMAT_RETURN_IF_ERROR(Ranks(result.ranks(), where, world_size));
  if (result.versions_size() > kMaxVersions) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ".versions: more than ", kMaxVersions, " entries"));
  }
  for (const auto& [name, version] : result.versions()) {
    if (name.size() > search::limits::kMaxNameBytes ||
        version.size() > search::limits::kMaxNameBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".versions: ", search::QuoteForError(name), ": longer than ",
                       search::limits::kMaxNameBytes, " bytes"));
    }
  }
  if (result.proxies_size() > 16) {
    return absl::InvalidArgumentError(where + ".proxies: more than 16 depths");
  }
  for (int i = 0; i < result.proxies_size(); ++i) {
    const std::string at = absl::StrCat(where, ".proxies[", i, "]");
    REMAT_RETURN_IF_ERROR(StepTime(result.proxies(i).step_time_s(), at + ".step_time_s"));
    REMAT_RETURN_IF_ERROR(Ranks(result.proxies(i).ranks(), at, world_size));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SearchRun>> SearchRun::FromRequest(
    const std::string& owner, const v1::SubmitSearchRequest& request) {
  auto spec = proto::FromProto(request.spec());
  if (!spec.ok()) return ToAbsl(spec.status());
  if (spec->search.backend == search::Backend::kReplay && spec->search.replay_table.empty() &&
      request.replay_table().trials_size() > 0) {
    // The table came with the request; the path is only informational here.
    spec->search.replay_table = "(sent with the request)";
  }
  search::Status valid = search::ValidateSpec(*spec);
  if (!valid.ok()) return ToAbsl(valid);
  if (spec->search.backend == search::Backend::kBuiltin) {
    // Refused here rather than found trial by trial (every trial would come back invalid).
    if (std::string problem = search::BuiltinBackendProblem(*spec); !problem.empty()) {
      return absl::InvalidArgumentError(problem);
    }
  }

  auto s = std::make_unique<SearchRun>();
  s->spec = *std::move(spec);
  if (s->spec.search.backend == search::Backend::kReplay) {
    if (request.replay_table().trials().empty()) {
      return absl::InvalidArgumentError(
          "replay_table: backend replay needs the table's entries (the client sends the table)");
    }
    if (request.replay_table().trials_size() >
        static_cast<int>(search::limits::kMaxReplayTableEntries)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replay_table: more than ", search::limits::kMaxReplayTableEntries, " trials"));
    }
    for (const auto& [key, entry] : request.replay_table().trials()) {
      auto policy = search::ParsePolicy(key);
      if (!policy.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "replay_table: ", search::QuoteForError(key), ": ", policy.status().message()));
      }
      const std::string where = "replay_table[" + policy->ToString() + "].result";
      // What the worker will report: checked now against this search's world size, so that a
      // table no report could deliver is refused here, not trial by trial on the workers.
      REMAT_RETURN_IF_ERROR(
          ValidateWireResult(entry.result(), where, std::max(1, s->spec.parallel.WorldSize())));
      if (!std::isfinite(entry.wall_s()) || entry.wall_s() < 0) {
        return absl::InvalidArgumentError("replay_table[" + policy->ToString() +
                                          "].wall_s: must be a finite number, not negative");
      }
      v1::ReplayEntry& kept = (*s->rec.replay_table.mutable_trials())[policy->ToString()];
      kept = entry;
      kept.mutable_result()->set_message(search::BoundedUtf8(
          entry.result().message(), search::limits::kMaxTrialMessageBytes));
    }
  }
  if (s->spec.search.backend == search::Backend::kCommand &&
      s->spec.search.command_template.empty()) {
    return absl::InvalidArgumentError(
        "search.command_template: required with backend command (a template configured on the "
        "workers)");
  }
  s->rec.owner = owner;
  s->rec.spec = proto::ToProto(s->spec);
  s->rec.state = v1::SEARCH_STATE_QUEUED;
  s->world_size = search::TrialSlots(s->spec);
  s->backend = search::Name(s->spec.search.backend);
  return s;
}

absl::StatusOr<std::unique_ptr<SearchRun>> SearchRun::FromRecord(SearchRecord rec) {
  auto spec = proto::FromProto(rec.spec);
  if (!spec.ok()) return absl::InvalidArgumentError(spec.status().message());
  auto s = std::make_unique<SearchRun>();
  s->rec = std::move(rec);
  s->spec = *std::move(spec);
  s->world_size = search::TrialSlots(s->spec);
  s->backend = search::Name(s->spec.search.backend);
  return s;
}

absl::Status SearchRun::RestoreTrials(
    std::vector<TrialRecord> records,
    const std::function<absl::StatusOr<bool>(RunTrial&)>& keep_lease) {
  std::vector<search::Candidate> proposed;
  std::vector<search::TrialResult> restored, all;
  std::set<std::string> seen;
  for (TrialRecord& record : records) {
    auto t = std::make_unique<RunTrial>();
    t->rec = std::move(record);
    // A policy's second trial is a near-tie re-measure: not the strategy's to restore.
    t->remeasure = !seen.insert(t->rec.policy).second;
    remeasure_proposed = remeasure_proposed || t->remeasure;
    if (!t->remeasure) {
      search::Candidate c;
      if (auto p = search::ParsePolicy(t->rec.policy); p.ok()) {
        c.policy = *p;
        c.estimate = search::EstimateMemory(spec, c.policy);
      }
      c.reason = t->rec.reason;
      proposed.push_back(std::move(c));
    }
    if (IsFinal(t->rec.status) && t->rec.result) {
      all.push_back(ResultToDomain(t->rec.policy, *t->rec.result));
      if (!t->remeasure) restored.push_back(all.back());
      ++done;
    } else if (t->rec.status == v1::TRIAL_STATUS_RUNNING) {
      auto keep = keep_lease(*t);
      if (!keep.ok()) return keep.status();
      if (*keep) {
        ++running;
      } else {
        t->rec.status = v1::TRIAL_STATUS_PENDING;
        queue.push_back(t.get());
      }
    } else {
      t->rec.status = v1::TRIAL_STATUS_PENDING;
      queue.push_back(t.get());
    }
    trials.push_back(std::move(t));
  }
  strategy->Restore(proposed, restored);
  results = std::move(all);
  ObserveRemeasuresOnceFinal();
  return absl::OkStatus();
}

void SearchRun::ObserveRemeasuresOnceFinal() {
  if (!remeasure_proposed || remeasures_observed) return;
  std::set<std::string> again;
  for (const auto& t : trials) {
    if (!t->remeasure) continue;
    if (!IsFinal(t->rec.status)) return;
    again.insert(t->rec.policy);
  }
  if (again.empty()) return;
  remeasures_observed = true;
  std::vector<search::TrialResult> pooled;
  for (search::TrialResult& r : search::CombineRemeasured(spec, results)) {
    if (again.count(r.policy.ToString())) pooled.push_back(std::move(r));
  }
  strategy->ObserveRemeasured(pooled);
}

std::vector<search::FrontierPoint> SearchRun::Frontier() const {
  return search::ComputeFrontier(Measured(), spec.search.memory_metric,
                                 spec.search.MemoryBudgetBytes());
}

std::vector<search::TrialResult> SearchRun::Measured() const {
  return search::CombineRemeasured(spec, results);
}

int SearchRun::PlannedTotal() const {
  if (planned_shown > 0) return planned_shown;
  return std::max<int>(strategy->PlannedTotal(), static_cast<int>(trials.size()));
}

void SearchRun::RevisePlannedTotal() {
  const int proposed = static_cast<int>(trials.size() + unsaved.size());
  if (planned_shown == 0) {
    planned_shown = std::max(strategy->PlannedTotal(), proposed);
  } else if (proposed > planned_shown) {
    planned_revised_from = planned_shown;
    planned_shown = std::max(strategy->PlannedTotal(), proposed);
  }
}

const v1::ReplayEntry* SearchRun::ReplayFor(const std::string& policy) const {
  if (spec.search.backend != search::Backend::kReplay) return nullptr;
  auto it = rec.replay_table.trials().find(policy);
  return it == rec.replay_table.trials().end() ? nullptr : &it->second;
}

std::vector<TrialRecord> SearchRun::Proposals(int64_t target,
                                              const std::function<std::string()>& new_id) {
  const int64_t want = target - static_cast<int64_t>(queue.size() + unsaved.size());
  if (want > 0 && !strategy->Done()) {
    for (auto& c : strategy->Propose(static_cast<int>(want))) unsaved.push_back(std::move(c));
  }
  if (!remeasure_proposed && strategy->Done() && !Outstanding()) {
    // The strategy is done: before concluding, measure the near-ties once more (all at once:
    // the round is bounded by the frontier's and the tie set's size).
    remeasure_proposed = true;
    for (search::Remeasure& r : search::NearTiesToRemeasure(spec, results)) {
      search::Candidate c;
      c.policy = r.policy;
      c.reason = std::move(r.reason);
      unsaved.push_back(std::move(c));
    }
  }
  RevisePlannedTotal();
  std::vector<TrialRecord> out;
  for (const search::Candidate& c : unsaved) {
    TrialRecord t;
    t.id = new_id();
    t.search_id = rec.id;
    t.seq = static_cast<int32_t>(trials.size() + out.size());
    t.policy = c.policy.ToString();
    t.reason = c.reason;
    t.status = v1::TRIAL_STATUS_PENDING;
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<RunTrial*> SearchRun::Enqueue(std::vector<TrialRecord> stored) {
  unsaved.clear();
  std::vector<RunTrial*> out;
  for (TrialRecord& r : stored) {
    auto t = std::make_unique<RunTrial>();
    t->rec = std::move(r);
    t->remeasure = std::any_of(trials.begin(), trials.end(), [&](const auto& earlier) {
      return earlier->rec.policy == t->rec.policy;
    });
    queue.push_back(t.get());
    out.push_back(t.get());
    trials.push_back(std::move(t));
  }
  return out;
}

void SearchRun::MarkLeased(RunTrial& t, int32_t attempt, const std::string& worker_id,
                           int64_t now_ms) {
  queue.erase(std::remove(queue.begin(), queue.end(), &t), queue.end());
  if (!t.joined_to.empty()) {  // re-adopted by a worker that still ran it (Heartbeat)
    t.joined_to.clear();
    --joined;
  }
  t.rec.status = v1::TRIAL_STATUS_RUNNING;
  t.rec.attempts = attempt;
  t.rec.worker_id = worker_id;
  t.leased_ms = t.confirmed_ms = now_ms;
  ++running;
}

void SearchRun::Requeue(RunTrial& t) {
  --running;
  t.rec.status = v1::TRIAL_STATUS_PENDING;
  queue.push_front(&t);
}

void SearchRun::Join(RunTrial& t, const std::string& leader_id) {
  queue.erase(std::remove(queue.begin(), queue.end(), &t), queue.end());
  t.joined_to = leader_id;
  ++joined;
}

void SearchRun::Unjoin(RunTrial& t) {
  t.joined_to.clear();
  --joined;
  queue.push_front(&t);
}
v1::TrialResult ResultOfTrial(const RunTrial& t, v1::TrialResult result) {
  result.mutable_policy()->set_canonical(t.rec.policy);
  return result;
}

v1::TrialResult CoordinatorResult(const RunTrial& t, v1::TrialStatus status, std::string message) {
  v1::TrialResult result;
  result.set_status(status);
  result.set_message(std::move(message));
  return ResultOfTrial(t, std::move(result));
}

void SearchRun::MarkFinal(RunTrial& t, const v1::TrialResult& result,
                          const std::string& by_worker) {
  if (t.rec.status == v1::TRIAL_STATUS_RUNNING) {
    --running;
  } else if (!t.joined_to.empty()) {
    t.joined_to.clear();
    --joined;
  } else if (t.rec.status == v1::TRIAL_STATUS_PENDING) {
    queue.erase(std::remove(queue.begin(), queue.end(), &t), queue.end());
  }
  t.rec.status = result.status();
  t.rec.result = ResultOfTrial(t, result);
  if (!by_worker.empty()) t.rec.worker_id = by_worker;
  ++done;
  search::TrialResult domain = ResultToDomain(t.rec.policy, result);
  if (!t.remeasure) strategy->Observe(domain);
  results.push_back(std::move(domain));
  if (t.remeasure) ObserveRemeasuresOnceFinal();
}

void SearchRun::CancelAll(const std::string& message,
                          const std::function<void(RunTrial&)>& on_cancel) {
  for (const auto& t : trials) {
    if (IsFinal(t->rec.status)) continue;
    on_cancel(*t);
    t->rec.status = v1::TRIAL_STATUS_CANCELLED;
    t->rec.result = CoordinatorResult(*t, v1::TRIAL_STATUS_CANCELLED, message);
    t->joined_to.clear();
  }
  queue.clear();
  running = 0;
  joined = 0;
  unsaved.clear();
}

void SearchRun::FillFrontier(SearchRecord* out) const {
  out->frontier.clear();
  const std::vector<search::TrialResult> measured = Measured();
  std::vector<search::FrontierPoint> frontier = search::ComputeFrontier(
      measured, spec.search.memory_metric, spec.search.MemoryBudgetBytes());
  for (const auto& p : frontier) out->frontier.push_back(p.policy.ToString());
  if (auto rec = search::RecommendPolicy(spec, measured)) {
    const search::Policy& best = rec->choice.policy;
    out->recommendation = best.ToString();
    out->apply.set_megatron_bridge(best.MegatronBridgeOverrides());
    out->apply.set_megatron_lm(best.MegatronLmFlags());
    out->apply.set_megatron_lm_remove(best.MegatronLmFlagsToRemove());
  } else {
    out->recommendation.reset();
    out->apply.Clear();
  }
}

void SearchRun::Conclude() {
  FillFrontier(&rec);
  rec.message = rec.recommendation ? ""
                                   : search::NothingFitsMessage(Measured(), spec.search.memory_metric,
                                                                spec.search.MemoryBudgetBytes());
  if (!rec.recommendation) {
    // Said first when static memory alone is over the budget: no policy could have fit.
    if (const auto capacity = search::StaticCapacityProblem(spec)) {
      rec.message = absl::StrCat(absl::StrJoin(search::CapacityLines(*capacity), "\n"), "\n",
                                 rec.message);
    }
  }
  bool measured = false;
  std::string first_failure;
  for (const search::TrialResult& r : results) {
    if (r.status == search::TrialStatus::kOk || r.status == search::TrialStatus::kOom) {
      measured = true;
    } else if (first_failure.empty()) {
      first_failure = absl::StrCat(r.policy.ToString(), ": ", search::Name(r.status),
                                   r.message.empty() ? "" : " (" + r.message + ")");
    }
  }
  rec.state = measured ? v1::SEARCH_STATE_SUCCEEDED : v1::SEARCH_STATE_FAILED;
  if (!measured) {
    rec.message = results.empty() ? "no trial ran: the strategy proposed none"
                                  : absl::StrCat("no trial produced a measurement; first failure: ",
                                                 first_failure);
  }
}

}  // namespace remat::server
