#include "server/search_views.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "proto/convert.h"
#include "search/frontier.h"
#include "search/provenance.h"
#include "search/remeasure.h"

namespace remat::server {
namespace {

// The domain results of the final trials.
std::vector<search::TrialResult> FinalResults(const std::vector<TrialRecord>& trials) {
  std::vector<search::TrialResult> out;
  for (const TrialRecord& t : trials) {
    if (IsFinal(t.status) && t.result) out.push_back(ResultToDomain(t.policy, *t.result));
  }
  return out;
}

// The spec of a stored search; a spec that can no longer be read (a search failed for that
// reason at resume) gives the defaults.
search::SearchSpec StoredSpec(const SearchRecord& rec) {
  auto spec = proto::FromProto(rec.spec);
  return spec.ok() ? *spec : search::SearchSpec();
}

// Why the recommendation fell where it did: the rule (search::RecommendPolicy) applied again to
// the finished trials, so nothing more is stored. Left out when it does not name the recorded
// recommendation (a search concluded by an older coordinator under the old rule).
void FillRecommendationDetail(const SearchRecord& rec, const search::SearchSpec& spec,
                              const std::vector<search::TrialResult>& results, v1::Search* out) {
  if (!rec.recommendation) return;
  auto detail = search::RecommendPolicy(spec, results);
  if (!detail || detail->choice.policy.ToString() != *rec.recommendation) return;
  *out->mutable_recommendation_detail() = proto::ToProto(*detail);
}

}  // namespace

v1::Trial TrialView(const TrialRecord& t) {
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

v1::Search SearchView(const SearchRecord& rec, const std::vector<const TrialRecord*>& trials,
                      int planned, const search::SearchSpec& spec,
                      const std::vector<search::TrialResult>& results) {
  v1::Search out;
  out.set_id(rec.id);
  out.set_owner(rec.owner);
  out.set_state(rec.state);
  *out.mutable_spec() = rec.spec;
  for (const std::string& p : rec.frontier) out.add_frontier(p);
  if (rec.recommendation) out.set_recommendation(*rec.recommendation);
  *out.mutable_apply() = rec.apply;
  out.set_message(rec.message);
  out.set_memory_budget_bytes(spec.search.MemoryBudgetBytes());
  out.set_memory_metric(search::Name(spec.search.memory_metric));
  for (const search::TrialResult& r : results) {
    for (std::string& f : search::DiagnoseFragmentation(r, spec.search.MemoryBudgetBytes())) {
      out.add_fragmentation(std::move(f));
    }
  }
  out.set_created_unix_ms(rec.created_unix_ms);
  out.set_updated_unix_ms(rec.updated_unix_ms);
  int done = 0;
  std::vector<search::TrialResult> final_results;  // in trial order, for the numerics check
  std::vector<int> final_trial;                    // the index in out.trials of each
  std::set<std::string> seen;
  std::map<std::string, int> last_of;  // policy -> index of its last trial, when measured again
  for (const TrialRecord* t : trials) {
    *out.add_trials() = TrialView(*t);
    if (!seen.insert(t->policy).second) {
      out.mutable_trials(out.trials_size() - 1)->set_remeasure(true);
      last_of[t->policy] = out.trials_size() - 1;
    }
    if (IsFinal(t->status)) ++done;
    if (IsFinal(t->status) && t->result) {
      final_results.push_back(ResultToDomain(t->policy, *t->result));
      final_trial.push_back(out.trials_size() - 1);
    }
  }
  // Numerical sanity and provenance (search/provenance.h), decided here so clients only render.
  const search::NumericsCheck numerics = search::CheckNumerics(spec, final_results);
  out.set_numerics_compared(numerics.compared);
  out.set_numerics_tolerance(search::NumericsTolerance(spec.train.precision));
  out.set_numerics_reference(numerics.reference);
  for (const auto& [index, sentence] : numerics.mismatches) {
    out.mutable_trials(final_trial[index])->set_numerics_mismatch(sentence);
    out.add_numerics_mismatches(sentence);
  }
  for (const auto& [key, value] : search::SearchVersions(final_results)) {
    (*out.mutable_versions())[key] = value;
  }
  out.set_trials_done(done);
  out.set_trials_planned(std::max<int>(planned, static_cast<int>(trials.size())));
  // A policy measured more than once: what its runs came to, on its last trial.
  for (const search::TrialResult& r : results) {
    auto it = last_of.find(r.policy.ToString());
    if (it != last_of.end()) *out.mutable_trials(it->second)->mutable_combined() = proto::ToProto(r);
  }
  FillRecommendationDetail(rec, spec, results, &out);
  return out;
}

v1::Search ActiveSearchView(const SearchRun& s) {
  SearchRecord rec = s.rec;
  s.FillFrontier(&rec);
  std::vector<const TrialRecord*> trials;
  for (const auto& t : s.trials) trials.push_back(&t->rec);
  return SearchView(rec, trials, s.PlannedTotal(), s.spec, s.Measured());
}

v1::Search StoredSearchView(const SearchRecord& rec, const std::vector<TrialRecord>& trials) {
  std::vector<const TrialRecord*> ptrs;
  for (const auto& t : trials) ptrs.push_back(&t);
  const search::SearchSpec spec = StoredSpec(rec);
  return SearchView(rec, ptrs, rec.trials_planned, spec,
                    search::CombineRemeasured(spec, FinalResults(trials)));
}

v1::SearchProgress ProgressView(const SearchRun& s, const RunTrial* last, int64_t unix_now_ms) {
  v1::SearchProgress p;
  p.set_id(s.rec.id);
  p.set_state(s.rec.state);
  p.set_trials_done(s.done);
  const int planned =
      s.rec.state == v1::SEARCH_STATE_QUEUED || s.rec.state == v1::SEARCH_STATE_RUNNING
          ? s.PlannedTotal()
          : static_cast<int>(s.trials.size());
  p.set_trials_planned(planned);
  if (!IsFinished(s.rec.state)) p.set_trials_planned_revised_from(s.planned_revised_from);
  // A trial joined to another search's identical one is in progress as far as its user can tell.
  p.set_trials_running(s.running + s.joined);
  if (!IsFinished(s.rec.state)) p.set_message(s.rec.message);
  std::vector<search::FrontierPoint> frontier = s.Frontier();
  for (const auto& f : frontier) p.add_frontier(f.policy.ToString());
  if (auto rec = search::RecommendPolicy(s.spec, s.Measured())) {
    p.set_best_policy(rec->choice.policy.ToString());
    p.set_best_tokens_per_s(rec->choice.tokens_per_s);
    p.set_best_peak_bytes(rec->choice.memory_bytes);
  }
  if (last != nullptr) *p.mutable_last_trial() = TrialView(last->rec);
  const double elapsed = std::max<int64_t>(0, unix_now_ms - s.rec.created_unix_ms) / 1000.0;
  p.set_elapsed_s(elapsed);
  if (!IsFinished(s.rec.state) && s.done > 0 && planned > s.done) {
    p.set_eta_s(elapsed / s.done * (planned - s.done));
  }
  return p;
}

v1::SearchProgress StoredProgressView(const SearchRecord& rec,
                                      const std::vector<TrialRecord>& trials) {
  v1::SearchProgress p;
  p.set_id(rec.id);
  p.set_state(rec.state);
  int done = 0;
  for (const auto& t : trials) done += IsFinal(t.status) ? 1 : 0;
  p.set_trials_done(done);
  p.set_trials_planned(static_cast<int32_t>(trials.size()));
  for (const auto& f : rec.frontier) p.add_frontier(f);
  if (rec.recommendation) {
    p.set_best_policy(*rec.recommendation);
    const search::MemoryMetric metric = StoredSpec(rec).search.memory_metric;
    for (const auto& t : trials) {
      if (t.policy == *rec.recommendation && t.result) {
        p.set_best_tokens_per_s(t.result->tokens_per_s());
        p.set_best_peak_bytes(ResultToDomain(t.policy, *t.result).PeakBytes(metric));
      }
    }
  }
  p.set_elapsed_s(std::max<int64_t>(0, rec.updated_unix_ms - rec.created_unix_ms) / 1000.0);
  return p;
}

v1::SearchSummary SummaryView(const SearchSummaryRecord& row) {
  v1::SearchSummary s;
  s.set_id(row.search.id);
  s.set_name(row.search.spec.name());
  s.set_owner(row.search.owner);
  s.set_state(row.search.state);
  s.set_trials_done(row.trials_done);
  s.set_trials_planned(std::max(row.search.trials_planned, row.trials_done));
  if (row.search.recommendation) s.set_recommendation(*row.search.recommendation);
  if (!IsFinished(row.search.state)) s.set_message(row.search.message);
  s.set_created_unix_ms(row.search.created_unix_ms);
  return s;
}

}  // namespace remat::server
