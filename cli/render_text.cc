#include "cli/render_text.h"

#include <algorithm>
#include <map>
#include <set>
#include <vector>

#include "search/frontier.h"

namespace remat::cli {

using render::Duration;
using render::Format;
using render::IsFinalStatus;
using render::IsLayoutProxy;
using render::MaxAllocated;
using render::MaxReserved;
using render::Memory;
using render::MemoryOf;
using render::MemUnit;
using render::Pad;
using render::StageOfRank;
using render::StagePeaks;
using render::StatusOf;
using render::StepTime;
using render::Tokens;
using render::UnitFor;

namespace {

// Layout proxies: each pipeline stage's peak per trial (the ranks of one stage share it), the
// measured stages marked with '*', the others interpolated between them.
void RenderStagePeaks(const v1::Search& s, const std::string& metric, const MemUnit& unit,
                      size_t policy_width, std::ostream& out) {
  const auto& par = s.spec().parallel();
  const int pp = std::max(1, par.pipeline_model_parallel_size());
  out << "\nper pipeline stage (" << metric << " peak " << unit.name
      << "; * measured by a stage proxy, the others interpolated):\n  "
      << Pad("policy", policy_width);
  for (int p = 0; p < pp; ++p) out << Pad("s" + std::to_string(p), 8, true);
  out << "\n";
  for (const auto& t : s.trials()) {
    const v1::TrialResult& r = t.result();
    if (StatusOf(t) != v1::TRIAL_STATUS_OK || !IsLayoutProxy(r) || r.ranks_size() == 0) continue;
    const std::vector<uint64_t> peak = StagePeaks(r, pp, metric);
    std::set<int> measured;
    for (const auto& pm : r.proxies()) measured.insert(StageOfRank(r, pp, pm.rank()));
    out << "  " << Pad(t.policy().canonical(), policy_width);
    for (int p = 0; p < pp; ++p) {
      out << Pad(unit.Of(peak[p]) + (measured.count(p) ? "*" : " "), 8, true);
    }
    out << "\n";
  }
}

// What the trial table saw, for the lines under it.
struct TableTally {
  bool any_reused = false, any_predicted = false, any_layout_proxy = false;
  int noisy = 0, unsettled = 0;
  int warmup_lo = 0, warmup_hi = 0;
  double worst_spread = 0;
  std::vector<std::string> notes;  // failed trials' messages
};

// The marks after a trial's row (reused, predicted, over budget, noisy, ...), counted in `tally`.
std::vector<std::string> TrialMarks(const v1::Search& s, const v1::Trial& t, bool last_of_policy,
                                    TableTally& tally) {
  const std::string& metric = s.memory_metric();
  const std::string recommended = s.has_recommendation() ? s.recommendation() : "";
  const v1::TrialResult& r = t.result();
  const bool ok = StatusOf(t) == v1::TRIAL_STATUS_OK;
  const bool has_memory = r.ranks_size() > 0 && (MaxAllocated(r) > 0 || MaxReserved(r) > 0);
  std::vector<std::string> marks;
  if (r.reused()) {
    marks.push_back("reused");
    tally.any_reused = true;
  }
  if (r.predicted()) {
    std::string mark = "predicted";
    if (IsLayoutProxy(r)) {
      mark += " from " + std::to_string(r.proxies_size()) + " stage prox" +
              (r.proxies_size() == 1 ? "y" : "ies");
      tally.any_layout_proxy = true;
    } else {
      for (int i = 0; i < r.proxies_size(); ++i) {
        mark += (i == 0 ? " from " : " and ") + std::to_string(r.proxies(i).num_layers());
      }
      if (r.proxies_size() > 0) mark += " layers";
    }
    marks.push_back(mark);
    tally.any_predicted = true;
  }
  if (ok && has_memory && MemoryOf(r, metric) > s.memory_budget_bytes()) {
    marks.push_back("over budget");
  }
  if (ok && !r.predicted() && r.step_time_s() > 0 &&
      r.step_time_spread_s() > search::kNoisyStepSpread * r.step_time_s()) {
    marks.push_back("noisy");
    ++tally.noisy;
    tally.worst_spread = std::max(tally.worst_spread, r.step_time_spread_s() / r.step_time_s());
  }
  if (ok && !r.predicted() && r.step_time_high_s() > 0 && r.step_time_s() > 0) {
    // The median's 90% interval (search/noise.h) and the steps it took to get there.
    marks.push_back(Format("median +-%.1f%%", 50 * (r.step_time_high_s() - r.step_time_low_s()) /
                                                  r.step_time_s()) +
                    (r.measured_steps() > 0 ? " of " + std::to_string(r.measured_steps()) +
                                                  " steps"
                                            : std::string()));
  }
  if (r.forced_load_balancing()) marks.push_back("forced expert balance");
  if (t.remeasure()) marks.push_back("re-measure");
  if (ok && r.warmup_steps_taken() > 0 && !r.warmup_settled()) {
    marks.push_back("warm-up unsettled");
    ++tally.unsettled;
  }
  if (!t.numerics_mismatch().empty()) marks.push_back("NUMERICS OFF");
  if (!recommended.empty() && t.policy().canonical() == recommended && last_of_policy) {
    marks.push_back("<- recommended");
  }
  return marks;
}

// The table of trials, one row each in the order they ran (frontier policies starred), with
// each row's marks; failed trials' messages go to the tally's notes.
TableTally RenderTrialTable(const v1::Search& s, const MemUnit& unit, size_t policy_width,
                            std::ostream& out) {
  const std::set<std::string> frontier(s.frontier().begin(), s.frontier().end());
  out << "    " << Pad("policy", policy_width) << "  " << Pad("status", 9)
      << Pad(std::string("alloc ") + unit.name, 10, true)
      << Pad(std::string("resv ") + unit.name, 10, true) << Pad("step s", 10, true)
      << Pad("tokens/s", 12, true) << Pad("warm-up", 9, true) << "\n";
  TableTally tally;
  std::map<std::string, const v1::Trial*> last_trial;  // a re-measured policy is marked once
  for (const v1::Trial& t : s.trials()) last_trial[t.policy().canonical()] = &t;
  for (const v1::Trial& t : s.trials()) {
    const v1::TrialStatus status = StatusOf(t);
    const v1::TrialResult& r = t.result();
    const bool on_frontier = frontier.count(t.policy().canonical()) > 0;
    const bool has_memory = r.ranks_size() > 0 && (MaxAllocated(r) > 0 || MaxReserved(r) > 0);
    const bool ok = status == v1::TRIAL_STATUS_OK;
    if (ok && r.warmup_steps_taken() > 0) {
      tally.warmup_lo = tally.warmup_lo == 0 ? r.warmup_steps_taken()
                                             : std::min(tally.warmup_lo, r.warmup_steps_taken());
      tally.warmup_hi = std::max(tally.warmup_hi, r.warmup_steps_taken());
    }
    out << "  " << (on_frontier ? "* " : "  ") << Pad(t.policy().canonical(), policy_width) << "  "
        << Pad(TrialStatusName(status), 9)
        << Pad(has_memory ? unit.Of(MaxAllocated(r)) : "-", 10, true)
        << Pad(has_memory ? unit.Of(MaxReserved(r)) : "-", 10, true)
        << Pad(ok ? StepTime(r.step_time_s()) : "-", 10, true)
        << Pad(ok ? Tokens(r.tokens_per_s()) : "-", 12, true)
        << Pad(ok && r.warmup_steps_taken() > 0 ? std::to_string(r.warmup_steps_taken()) : "-", 9,
               true);
    const bool last = last_trial[t.policy().canonical()] == &t;
    for (const auto& m : TrialMarks(s, t, last, tally)) out << "  " << m;
    out << "\n";
    if (IsFinalStatus(status) && !ok && !r.message().empty()) {
      std::string msg = r.message();
      if (msg.size() > 300) msg = msg.substr(0, 297) + "...";
      tally.notes.push_back(t.policy().canonical() + " (" + TrialStatusName(status) + "): " + msg);
    }
  }
  return tally;
}

// The table's key and the notes: failed trials, noisy trials, the warm-up, numerics.
void RenderNotes(const v1::Search& s, TableTally tally, std::ostream& out) {
  out << "  * on the frontier";
  if (tally.any_reused) out << "; reused: taken from the results cache";
  if (tally.any_predicted) {
    out << "; predicted: a " << (tally.any_layout_proxy ? "layout" : "depth")
        << "-proxy prediction, not a measurement";
  }
  out << "\n";
  std::vector<std::string>& notes = tally.notes;
  if (tally.noisy > 0) {
    notes.push_back("noisy: " + std::to_string(tally.noisy) +
                    " trial(s) whose measured steps spread by more than " +
                    Format("%.0f%%", 100 * search::kNoisyStepSpread) + " of the step time (up to " +
                    Format("%.0f%%", 100 * tally.worst_spread) +
                    "); their tokens/s may be off by as much: raise search.measure_steps for "
                    "steadier figures");
  }
  if (tally.warmup_hi > 0) {
    notes.push_back("warm-up: " +
                    (tally.warmup_lo == tally.warmup_hi ? std::to_string(tally.warmup_hi)
                                                        : std::to_string(tally.warmup_lo) + "-" +
                                                              std::to_string(tally.warmup_hi)) +
                    " steps before the measured ones (until the last " +
                    std::to_string(s.spec().search().steady_window()) + " agreed within " +
                    Format("%.0f%%", 100 * s.spec().search().steady_tolerance()) + ")" +
                    (tally.unsettled > 0 ? "; " + std::to_string(tally.unsettled) +
                                               " trial(s) reached search.warmup_max_steps "
                                               "unsettled (marked): raise it for steadier figures"
                                         : ""));
  }
  for (const std::string& m : s.numerics_mismatches()) notes.push_back("NUMERICS OFF: " + m);
  if (!notes.empty()) {
    out << "\nnotes:\n";
    for (const auto& n : notes) out << "  " << n << "\n";
  }
}

using ResultsByPolicy = std::map<std::string, const v1::TrialResult*>;

// The frontier, memory ascending, with its figures.
void RenderFrontier(const v1::Search& s, const ResultsByPolicy& by_policy, const MemUnit& unit,
                    size_t policy_width, std::ostream& out) {
  if (s.frontier_size() == 0) return;
  const std::string& metric = s.memory_metric();
  out << "\nfrontier (" << metric << " memory ascending):\n";
  for (const std::string& p : s.frontier()) {
    out << "  " << Pad(p, policy_width);
    auto it = by_policy.find(p);
    if (it != by_policy.end()) {
      out << "  " << Pad(unit.Of(MemoryOf(*it->second, metric)), 8, true) << " "
          << unit.name << "  " << Pad(Tokens(it->second->tokens_per_s()), 10, true)
          << " tokens/s";
    }
    out << "\n";
  }
}

// The recommendation with why, its ties and how to apply it; or why there is none (yet).
void RenderRecommendation(const v1::Search& s, const ResultsByPolicy& by_policy,
                          std::ostream& out) {
  const std::string& metric = s.memory_metric();
  const std::string recommended = s.has_recommendation() ? s.recommendation() : "";
  if (s.state() == v1::SEARCH_STATE_FAILED) {
    out << "search failed" << (s.message().empty() ? "" : ": " + s.message()) << "\n";
  } else if (s.state() == v1::SEARCH_STATE_CANCELLED) {
    out << "search cancelled" << (s.message().empty() ? "" : ": " + s.message()) << "\n";
  }
  if (!recommended.empty()) {
    out << "recommendation: " << recommended;
    auto it = by_policy.find(recommended);
    if (it != by_policy.end()) {
      out << "  (" << Memory(MemoryOf(*it->second, metric)) << " " << metric
          << " peak per rank, " << Tokens(it->second->tokens_per_s()) << " tokens/s)";
    }
    out << "\n";
    if (s.has_recommendation_detail()) {
      const v1::RecommendationDetail& d = s.recommendation_detail();
      out << "why: " << d.reason() << "\n";
      if (d.tied_size() > 1) {
        out << "tied within the noise of the best (least recompute first):\n";
        out << "  " << Pad("policy", 44) << Pad("tokens/s", 10, true) << Pad("below best", 12, true)
            << Pad("band", 7, true) << Pad("replayed GFLOP/step", 21, true)
            << Pad(metric + " peak", 16, true) << "\n";
        for (const v1::RecommendationCandidate& c : d.tied()) {
          out << "  " << Pad(c.policy(), 44) << Pad(Tokens(c.tokens_per_s()), 10, true)
              << Pad(Format("%.1f%%", 100 * c.below_best()), 12, true)
              << Pad(Format("%.1f%%", 100 * c.tolerance()), 7, true)
              << Pad(Format("%.1f", c.recompute_flops() / 1e9), 21, true)
              << Pad(Memory(c.memory_bytes()), 16, true) << "\n";
        }
      }
    }
    const v1::Apply& apply = s.apply();
    out << "apply with Megatron Bridge:  " << apply.megatron_bridge() << "\n";
    out << "apply with Megatron-LM:      "
        << (apply.megatron_lm().empty() ? "(no recompute flags: leave --recompute-* unset)"
                                        : apply.megatron_lm())
        << "\n";
    if (!apply.megatron_lm_remove().empty()) {
      out << "  after removing (with values): " << apply.megatron_lm_remove() << "\n";
    }
  } else if (s.state() == v1::SEARCH_STATE_SUCCEEDED) {
    out << "no recommendation: " << s.message() << "\n";
  } else if (s.state() == v1::SEARCH_STATE_QUEUED || s.state() == v1::SEARCH_STATE_RUNNING) {
    out << "no recommendation yet\n";
    if (!s.message().empty()) out << s.message() << "\n";  // why it waits
  }
}

// Numerical sanity and provenance: the numerics check, the versions, the fragmentation notes.
void RenderProvenance(const v1::Search& s, std::ostream& out) {
  if (s.numerics_compared() > 0) {
    const std::string precision = s.spec().train().precision();
    const std::string whose =
        s.numerics_reference().empty() || s.numerics_reference() == "selective:[]"
            ? "the control's loss and grad norm"
            : "the loss and grad norm of " + s.numerics_reference() + " (the control did not run ok)";
    out << "\nnumerics: "
        << (s.numerics_mismatches_size() == 0
                ? "all " + std::to_string(s.numerics_compared()) + " trials match " + whose
                : std::to_string(s.numerics_mismatches_size()) + " of " +
                      std::to_string(s.numerics_compared()) + " trials DO NOT match " + whose +
                      " (see notes)")
        << " (tolerance " << Format("%.0e", s.numerics_tolerance()) << " relative, " << precision
        << ")\n";
  }
  if (s.versions_size() > 0) {
    out << "ran with:";
    for (const char* key : {"remat", "torch", "cuda", "nccl", "driver", "gpu", "device"}) {
      auto it = s.versions().find(key);
      if (it != s.versions().end()) out << " " << key << " " << it->second << ";";
    }
    out << "\n";
  }
  if (s.fragmentation_size() > 0) {
    out << "\nfragmentation:\n";
    for (const auto& f : s.fragmentation()) out << "  " << f << "\n";
  }
}

}  // namespace

void RenderReport(const v1::Search& s, std::ostream& out) {
  const std::string& metric = s.memory_metric();
  out << "search " << s.id();
  if (!s.spec().name().empty()) out << " (" << s.spec().name() << ")";
  out << ": " << StateName(s.state()) << ", " << s.trials_done() << " of "
      << std::max(s.trials_planned(), s.trials_done()) << " trials done, budget "
      << Memory(s.memory_budget_bytes()) << " per rank (" << metric << " memory)\n\n";

  size_t policy_width = 6;
  uint64_t max_bytes = 0;
  for (const auto& t : s.trials()) {
    policy_width = std::max(policy_width, t.policy().canonical().size());
    max_bytes = std::max({max_bytes, MaxAllocated(t.result()), MaxReserved(t.result())});
  }
  const MemUnit unit = UnitFor(max_bytes);
  const TableTally tally = RenderTrialTable(s, unit, policy_width, out);
  RenderNotes(s, tally, out);

  // A policy measured twice shows its runs combined (what the frontier and the recommendation
  // used).
  ResultsByPolicy by_policy;
  for (const auto& t : s.trials()) {
    by_policy[t.policy().canonical()] = t.has_combined() ? &t.combined() : &t.result();
  }
  RenderFrontier(s, by_policy, unit, policy_width, out);
  if (tally.any_layout_proxy) RenderStagePeaks(s, metric, unit, policy_width, out);
  out << "\n";
  RenderRecommendation(s, by_policy, out);
  RenderProvenance(s, out);
}

void RenderList(const v1::ListSearchesResponse& list, std::ostream& out) {
  if (list.searches_size() == 0) {
    out << "no searches\n";
    return;
  }
  size_t id_w = 2, name_w = 4, owner_w = 5;
  for (const auto& s : list.searches()) {
    id_w = std::max(id_w, s.id().size());
    name_w = std::max(name_w, s.name().size());
    owner_w = std::max(owner_w, s.owner().size());
  }
  out << Pad("id", id_w) << "  " << Pad("name", name_w) << "  " << Pad("owner", owner_w) << "  "
      << Pad("state", 10) << Pad("trials", 9) << "recommendation\n";
  for (const auto& s : list.searches()) {
    out << Pad(s.id(), id_w) << "  " << Pad(s.name(), name_w) << "  " << Pad(s.owner(), owner_w)
        << "  " << Pad(StateName(s.state()), 10)
        << Pad(std::to_string(s.trials_done()) + "/" + std::to_string(s.trials_planned()), 9)
        << (s.has_recommendation() ? s.recommendation() : "-")
        << (s.message().empty() ? "" : "  (" + s.message() + ")") << "\n";
  }
}

std::string ProgressLine(const v1::SearchProgress& p, bool tty) {
  const int planned = std::max(p.trials_planned(), p.trials_done());
  std::string best;
  if (p.has_best_policy()) {
    best = p.best_policy() + " (" + Tokens(p.best_tokens_per_s()) + " tokens/s at " +
           Memory(p.best_peak_bytes()) + ")";
  }
  const std::string eta = p.eta_s() > 0 ? Duration(p.eta_s()) : "?";
  // The total moves only when the strategy proposed more than it said, and the line says so.
  const std::string total =
      std::to_string(planned) +
      (p.trials_planned_revised_from() > 0
           ? " (total revised from " + std::to_string(p.trials_planned_revised_from()) + ")"
           : "");
  if (tty) {
    constexpr int kWidth = 24;
    const int filled = planned > 0 ? kWidth * p.trials_done() / planned : 0;
    std::string bar = "[" + std::string(filled, '#') + std::string(kWidth - filled, '-') + "]";
    std::string line = bar + " " + std::to_string(p.trials_done()) + "/" + total + " trials, " +
                       std::to_string(p.trials_running()) + " running, " + Duration(p.elapsed_s()) +
                       " elapsed, ETA " + eta;
    if (!best.empty()) line += ", best " + best;
    if (!p.message().empty()) line += ", " + p.message();
    return line;
  }
  std::string line = "progress: " + std::to_string(p.trials_done()) + "/" + total +
                     " trials done, " + std::to_string(p.trials_running()) + " running, " +
                     Duration(p.elapsed_s()) + " elapsed, ETA " + eta + ", state " +
                     StateName(p.state());
  line += best.empty() ? "; no point fits yet" : "; best so far: " + best;
  if (!p.message().empty()) line += "; " + p.message();
  return line;
}

std::string TrialLine(const v1::Trial& t, const std::string& memory_metric) {
  const v1::TrialStatus status = StatusOf(t);
  const v1::TrialResult& r = t.result();
  std::string line = "trial " + t.policy().canonical() + ": " + TrialStatusName(status);
  if (r.ranks_size() > 0) {
    line += ", " + Memory(MemoryOf(r, memory_metric)) + " " + memory_metric;
  }
  if (status == v1::TRIAL_STATUS_OK) line += ", " + Tokens(r.tokens_per_s()) + " tokens/s";
  if (r.reused()) line += " (reused)";
  if (status != v1::TRIAL_STATUS_OK && !r.message().empty()) {
    std::string msg = r.message();
    if (msg.size() > 160) msg = msg.substr(0, 157) + "...";
    line += ": " + msg;
  }
  return line;
}

}  // namespace remat::cli
