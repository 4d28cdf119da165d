#include "cli/render.h"

#include <algorithm>
#include <optional>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "proto/convert.h"
#include "search/frontier.h"
#include "search/policy.h"

namespace remat::cli {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string Format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

// Memory is shown in GiB, or in MiB when everything is under 1 GiB (tiny CPU models).
struct MemUnit {
  double bytes;
  const char* name;
  std::string Of(uint64_t b) const { return Format("%.2f", b / bytes); }
};
MemUnit UnitFor(uint64_t max_bytes) {
  if (max_bytes > 0 && max_bytes < (1ull << 30)) return MemUnit{1024.0 * 1024.0, "MiB"};
  return MemUnit{kGiB, "GiB"};
}
// "61.20 GiB" or "12.34 MiB".
std::string Memory(uint64_t bytes) {
  const MemUnit u = UnitFor(bytes);
  return u.Of(bytes) + " " + u.name;
}

std::string Tokens(double t) { return t >= 100 ? Format("%.0f", t) : Format("%.1f", t); }

std::string StepTime(double s) { return Format(s < 10 ? "%.4f" : "%.2f", s); }

std::string Duration(double s) {
  if (s < 0) s = 0;
  long total = std::lround(s);
  char buf[32];
  if (total < 60) {
    std::snprintf(buf, sizeof(buf), "%lds", total);
  } else if (total < 3600) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", total / 60, total % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", total / 3600, (total % 3600) / 60);
  }
  return buf;
}

std::string MemoryMetric(const v1::Search& s) {
  const auto& so = s.spec().search();
  return so.has_memory_metric() && !so.memory_metric().empty() ? so.memory_metric() : "reserved";
}

uint64_t BudgetBytes(const v1::Search& s) {
  if (s.memory_budget_bytes() > 0) return s.memory_budget_bytes();
  const auto& so = s.spec().search();
  const double gib = so.has_memory_budget_gib() ? so.memory_budget_gib() : 80.0;
  return static_cast<uint64_t>(gib * kGiB);
}

uint64_t MaxAllocated(const v1::TrialResult& r) {
  uint64_t m = 0;
  for (const auto& rank : r.ranks()) m = std::max<uint64_t>(m, rank.peak_allocated_bytes());
  return m;
}

uint64_t MaxReserved(const v1::TrialResult& r) {
  uint64_t m = 0;
  for (const auto& rank : r.ranks()) m = std::max<uint64_t>(m, rank.peak_reserved_bytes());
  return m;
}

uint64_t MemoryOf(const v1::TrialResult& r, const std::string& metric) {
  return metric == "allocated" ? MaxAllocated(r) : MaxReserved(r);
}

// The trial's status: its own while pending/running, the result's once final.
v1::TrialStatus StatusOf(const v1::Trial& t) {
  if (t.has_result() && t.result().status() != v1::TRIAL_STATUS_UNSPECIFIED &&
      t.status() != v1::TRIAL_STATUS_PENDING && t.status() != v1::TRIAL_STATUS_RUNNING) {
    return t.result().status();
  }
  return t.status();
}

bool IsFinalStatus(v1::TrialStatus s) {
  return s != v1::TRIAL_STATUS_UNSPECIFIED && s != v1::TRIAL_STATUS_PENDING &&
         s != v1::TRIAL_STATUS_RUNNING;
}

// Final trials in domain form (for the frontier helpers of search/).
std::vector<search::TrialResult> DomainResults(const v1::Search& s) {
  std::vector<search::TrialResult> out;
  for (const v1::Trial& t : s.trials()) {
    if (!IsFinalStatus(StatusOf(t))) continue;
    v1::TrialResult r = t.result();
    *r.mutable_policy() = t.policy();
    r.set_status(StatusOf(t));
    auto d = proto::FromProto(r);
    if (d.ok()) out.push_back(*d);
  }
  return out;
}

std::string Pad(const std::string& s, size_t width, bool right = false) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

std::string XmlEscape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

const char* StateName(v1::SearchState state) {
  switch (state) {
    case v1::SEARCH_STATE_QUEUED:
      return "queued";
    case v1::SEARCH_STATE_RUNNING:
      return "running";
    case v1::SEARCH_STATE_SUCCEEDED:
      return "succeeded";
    case v1::SEARCH_STATE_FAILED:
      return "failed";
    case v1::SEARCH_STATE_CANCELLED:
      return "cancelled";
    default:
      return "unknown";
  }
}

v1::Apply ApplyFor(const v1::Search& search) {
  if (!search.has_recommendation()) return v1::Apply();
  if (!search.apply().megatron_bridge().empty()) return search.apply();
  v1::Apply apply;
  auto policy = search::ParsePolicy(search.recommendation());
  if (policy.ok()) {
    apply.set_megatron_bridge(policy->MegatronBridgeOverrides());
    apply.set_megatron_lm(policy->MegatronLmFlags());
  }
  return apply;
}

std::vector<std::string> FragmentationFindings(const v1::Search& search) {
  std::vector<std::string> out;
  for (const auto& r : DomainResults(search)) {
    for (auto& f : search::DiagnoseFragmentation(r)) out.push_back(std::move(f));
  }
  return out;
}

// ---- the readable report ---------------------------------------------------------------------

void RenderReport(const v1::Search& s, std::ostream& out) {
  const std::string metric = MemoryMetric(s);
  const uint64_t budget = BudgetBytes(s);
  const std::set<std::string> frontier(s.frontier().begin(), s.frontier().end());
  const std::string recommended = s.has_recommendation() ? s.recommendation() : "";

  out << "search " << s.id();
  if (!s.spec().name().empty()) out << " (" << s.spec().name() << ")";
  out << ": " << StateName(s.state()) << ", " << s.trials_done() << " of "
      << std::max(s.trials_planned(), s.trials_done()) << " trials done, budget " << Memory(budget)
      << " per rank (" << metric << " memory)\n\n";

  size_t policy_width = 6;
  uint64_t max_bytes = 0;
  for (const auto& t : s.trials()) {
    policy_width = std::max(policy_width, t.policy().canonical().size());
    max_bytes = std::max({max_bytes, MaxAllocated(t.result()), MaxReserved(t.result())});
  }
  const MemUnit unit = UnitFor(max_bytes);
  out << "    " << Pad("policy", policy_width) << "  " << Pad("status", 9)
      << Pad(std::string("alloc ") + unit.name, 10, true)
      << Pad(std::string("resv ") + unit.name, 10, true) << Pad("step s", 10, true)
      << Pad("tokens/s", 12, true) << "\n";
  bool any_reused = false, any_predicted = false;
  int noisy = 0;
  double worst_spread = 0;
  std::vector<std::string> notes;
  for (const v1::Trial& t : s.trials()) {
    const v1::TrialStatus status = StatusOf(t);
    const v1::TrialResult& r = t.result();
    const bool on_frontier = frontier.count(t.policy().canonical()) > 0;
    const bool has_memory = r.ranks_size() > 0 && (MaxAllocated(r) > 0 || MaxReserved(r) > 0);
    const bool ok = status == v1::TRIAL_STATUS_OK;
    out << "  " << (on_frontier ? "* " : "  ") << Pad(t.policy().canonical(), policy_width) << "  "
        << Pad(TrialStatusName(status), 9)
        << Pad(has_memory ? unit.Of(MaxAllocated(r)) : "-", 10, true)
        << Pad(has_memory ? unit.Of(MaxReserved(r)) : "-", 10, true)
        << Pad(ok ? StepTime(r.step_time_s()) : "-", 10, true)
        << Pad(ok ? Tokens(r.tokens_per_s()) : "-", 12, true);
    std::vector<std::string> marks;
    if (r.reused()) {
      marks.push_back("reused");
      any_reused = true;
    }
    if (r.predicted()) {
      std::string mark = "predicted";
      for (int i = 0; i < r.proxies_size(); ++i) {
        mark += (i == 0 ? " from " : " and ") + std::to_string(r.proxies(i).num_layers());
      }
      if (r.proxies_size() > 0) mark += " layers";
      marks.push_back(mark);
      any_predicted = true;
    }
    if (ok && has_memory && MemoryOf(r, metric) > budget) marks.push_back("over budget");
    if (ok && !r.predicted() && r.step_time_s() > 0 &&
        r.step_time_spread_s() > search::kNoisyStepSpread * r.step_time_s()) {
      marks.push_back("noisy");
      ++noisy;
      worst_spread = std::max(worst_spread, r.step_time_spread_s() / r.step_time_s());
    }
    if (!recommended.empty() && t.policy().canonical() == recommended) {
      marks.push_back("<- recommended");
    }
    for (const auto& m : marks) out << "  " << m;
    out << "\n";
    if (IsFinalStatus(status) && !ok && !r.message().empty()) {
      std::string msg = r.message();
      if (msg.size() > 300) msg = msg.substr(0, 297) + "...";
      notes.push_back(t.policy().canonical() + " (" + TrialStatusName(status) + "): " + msg);
    }
  }
  out << "  * on the frontier";
  if (any_reused) out << "; reused: taken from the results cache";
  if (any_predicted) out << "; predicted: a depth-proxy prediction, not a measurement";
  out << "\n";
  if (noisy > 0) {
    notes.push_back("noisy: " + std::to_string(noisy) +
                    " trial(s) whose measured steps spread by more than " +
                    Format("%.0f%%", 100 * search::kNoisyStepSpread) + " of the step time (up to " +
                    Format("%.0f%%", 100 * worst_spread) +
                    "); their tokens/s may be off by as much: raise search.measure_steps for "
                    "steadier figures");
  }
  if (!notes.empty()) {
    out << "\nnotes:\n";
    for (const auto& n : notes) out << "  " << n << "\n";
  }

  // The frontier, memory ascending, with its figures.
  std::map<std::string, const v1::Trial*> by_policy;
  for (const auto& t : s.trials()) by_policy[t.policy().canonical()] = &t;
  if (s.frontier_size() > 0) {
    out << "\nfrontier (" << metric << " memory ascending):\n";
    for (const std::string& p : s.frontier()) {
      out << "  " << Pad(p, policy_width);
      auto it = by_policy.find(p);
      if (it != by_policy.end()) {
        out << "  " << Pad(unit.Of(MemoryOf(it->second->result(), metric)), 8, true) << " "
            << unit.name << "  " << Pad(Tokens(it->second->result().tokens_per_s()), 10, true)
            << " tokens/s";
      }
      out << "\n";
    }
  }

  out << "\n";
  if (s.state() == v1::SEARCH_STATE_FAILED) {
    out << "search failed" << (s.message().empty() ? "" : ": " + s.message()) << "\n";
  } else if (s.state() == v1::SEARCH_STATE_CANCELLED) {
    out << "search cancelled" << (s.message().empty() ? "" : ": " + s.message()) << "\n";
  }
  if (!recommended.empty()) {
    out << "recommendation: " << recommended;
    auto it = by_policy.find(recommended);
    if (it != by_policy.end()) {
      out << "  (" << Memory(MemoryOf(it->second->result(), metric)) << " " << metric
          << " peak per rank, " << Tokens(it->second->result().tokens_per_s()) << " tokens/s)";
    }
    out << "\n";
    const v1::Apply apply = ApplyFor(s);
    out << "apply with Megatron Bridge:  " << apply.megatron_bridge() << "\n";
    out << "apply with Megatron-LM:      "
        << (apply.megatron_lm().empty() ? "(no recompute flags: leave --recompute-* unset)"
                                        : apply.megatron_lm())
        << "\n";
  } else if (s.state() == v1::SEARCH_STATE_SUCCEEDED) {
    std::string why = s.message();
    if (why.empty()) {
      why = search::NothingFitsMessage(DomainResults(s),
                                       metric == "allocated" ? search::MemoryMetric::kAllocated
                                                             : search::MemoryMetric::kReserved,
                                       budget);
    }
    out << "no recommendation: " << why << "\n";
  } else if (s.state() == v1::SEARCH_STATE_QUEUED || s.state() == v1::SEARCH_STATE_RUNNING) {
    out << "no recommendation yet\n";
  }

  const auto findings = FragmentationFindings(s);
  if (!findings.empty()) {
    out << "\nfragmentation:\n";
    for (const auto& f : findings) out << "  " << f << "\n";
  }
}

// ---- JSON --------------------------------------------------------------------------------------

std::string ResultJson(const v1::Search& s) {
  using nlohmann::ordered_json;
  const std::string metric = MemoryMetric(s);
  ordered_json j;
  j["id"] = s.id();
  j["name"] = s.spec().name();
  j["state"] = StateName(s.state());
  j["memory_metric"] = metric;
  j["memory_budget_bytes"] = BudgetBytes(s);
  ordered_json trials = ordered_json::array();
  for (const v1::Trial& t : s.trials()) {
    const v1::TrialResult& r = t.result();
    ordered_json tj;
    tj["policy"] = t.policy().canonical();
    tj["status"] = TrialStatusName(StatusOf(t));
    tj["peak_allocated_bytes"] = MaxAllocated(r);
    tj["peak_reserved_bytes"] = MaxReserved(r);
    ordered_json ranks = ordered_json::array();
    for (const auto& rr : r.ranks()) {
      ordered_json rj;
      rj["rank"] = rr.rank();
      rj["peak_allocated_bytes"] = rr.peak_allocated_bytes();
      rj["peak_reserved_bytes"] = rr.peak_reserved_bytes();
      rj["static_bytes"] = rr.static_bytes();
      rj["alloc_retries"] = rr.alloc_retries();
      rj["failing_request_bytes"] = rr.failing_request_bytes();
      rj["step_time_s"] = rr.step_time_s();
      rj["step_times_s"] = std::vector<double>(rr.step_times_s().begin(), rr.step_times_s().end());
      ranks.push_back(std::move(rj));
    }
    tj["ranks"] = std::move(ranks);
    tj["step_time_s"] = r.step_time_s();
    tj["tokens_per_s"] = r.tokens_per_s();
    tj["loss"] = r.loss();
    tj["grad_norm"] = r.grad_norm();
    tj["message"] = r.message();
    tj["id"] = t.id();
    tj["reason"] = t.reason();
    tj["step_time_spread_s"] = r.step_time_spread_s();
    tj["model_tflops"] = r.model_tflops();
    tj["setup_s"] = r.setup_s();
    tj["wall_s"] = r.wall_s();
    tj["reused"] = r.reused();
    tj["predicted"] = r.predicted();
    tj["attempts"] = t.attempts();
    tj["worker_id"] = t.worker_id();
    if (r.proxies_size() > 0) {
      ordered_json proxies = ordered_json::array();
      for (const v1::ProxyMeasurement& p : r.proxies()) {
        ordered_json pj;
        pj["num_layers"] = p.num_layers();
        pj["step_time_s"] = p.step_time_s();
        ordered_json pranks = ordered_json::array();
        for (const auto& rr : p.ranks()) {
          pranks.push_back({{"rank", rr.rank()},
                            {"peak_allocated_bytes", rr.peak_allocated_bytes()},
                            {"peak_reserved_bytes", rr.peak_reserved_bytes()}});
        }
        pj["ranks"] = std::move(pranks);
        proxies.push_back(std::move(pj));
      }
      tj["proxies"] = std::move(proxies);
    }
    trials.push_back(std::move(tj));
  }
  j["trials"] = std::move(trials);
  j["frontier"] = ordered_json(std::vector<std::string>(s.frontier().begin(), s.frontier().end()));
  if (s.has_recommendation()) {
    j["recommendation"] = s.recommendation();
    const v1::Apply apply = ApplyFor(s);
    j["apply"] = {{"megatron_bridge", apply.megatron_bridge()},
                  {"megatron_lm", apply.megatron_lm()}};
  } else {
    j["recommendation"] = nullptr;
    j["apply"] = nullptr;
  }
  std::string message = s.message();
  if (message.empty() && !s.has_recommendation() && s.state() == v1::SEARCH_STATE_SUCCEEDED) {
    message = search::NothingFitsMessage(
        DomainResults(s),
        metric == "allocated" ? search::MemoryMetric::kAllocated : search::MemoryMetric::kReserved,
        BudgetBytes(s));
  }
  j["message"] = message;
  j["trials_done"] = s.trials_done();
  j["trials_planned"] = s.trials_planned();
  j["fragmentation"] = FragmentationFindings(s);
  j["owner"] = s.owner();
  j["created_unix_ms"] = s.created_unix_ms();
  j["updated_unix_ms"] = s.updated_unix_ms();
  return j.dump(2) + "\n";
}

// ---- SVG ---------------------------------------------------------------------------------------

namespace {

// Axis ticks at 1, 2, 2.5 or 5 times a power of ten, covering [lo, hi].
struct Axis {
  double lo = 0, hi = 1, step = 0.2;
};

Axis NiceAxis(double lo, double hi) {
  if (!(hi > lo)) {
    const double pad = std::max(std::abs(hi) * 0.1, 1.0);
    lo -= pad;
    hi += pad;
  }
  const double raw = (hi - lo) / 5;
  const double exp10 = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / exp10;
  const double nice = f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10;
  Axis a;
  a.step = nice * exp10;
  a.lo = std::floor(lo / a.step) * a.step;
  a.hi = std::ceil(hi / a.step) * a.step;
  return a;
}

std::string Num(double v) { return Format("%.1f", v); }

std::string TickLabel(double v, double step) {
  if (step >= 1) return Format("%.0f", v);
  if (step >= 0.1) return Format("%.1f", v);
  if (step >= 0.01) return Format("%.2f", v);
  return Format("%.3g", v);
}

}  // namespace

std::string ResultSvg(const v1::Search& s) {
  const std::string metric = MemoryMetric(s);
  const uint64_t budget_bytes = BudgetBytes(s);
  const std::set<std::string> frontier(s.frontier().begin(), s.frontier().end());
  const std::string recommended = s.has_recommendation() ? s.recommendation() : "";

  struct Point {
    std::string policy;
    double mem = 0, tps = 0;  // mem in bytes, then in the plot's unit
    bool ok = false, oom = false, on_frontier = false;
  };
  std::vector<Point> points;
  double max_mem = 0;
  for (const v1::Trial& t : s.trials()) {
    const v1::TrialStatus st = StatusOf(t);
    Point p;
    p.policy = t.policy().canonical();
    p.mem = static_cast<double>(MemoryOf(t.result(), metric));
    p.tps = t.result().tokens_per_s();
    p.ok = st == v1::TRIAL_STATUS_OK && p.tps > 0;
    p.oom = st == v1::TRIAL_STATUS_OOM;
    p.on_frontier = frontier.count(p.policy) > 0;
    if (p.oom && p.mem <= 0) p.mem = static_cast<double>(budget_bytes);  // hit the budget
    if (p.ok || p.oom) {
      points.push_back(p);
      max_mem = std::max(max_mem, p.mem);
    }
  }
  // The budget is drawn when it is near the points; far beyond them (a tiny model under a big
  // budget) it would squash every point into the left edge, so it is only named.
  const bool budget_on_chart = points.empty() || budget_bytes <= 1.5 * max_mem;
  const MemUnit unit = UnitFor(
      static_cast<uint64_t>(budget_on_chart ? std::max<double>(max_mem, budget_bytes) : max_mem));
  const double budget = budget_bytes / unit.bytes;
  for (Point& p : points) p.mem /= unit.bytes;

  double x_lo = budget_on_chart ? budget : max_mem / unit.bytes;
  double x_hi = x_lo, y_lo = 0, y_hi = 0;
  bool any_ok = false;
  for (const Point& p : points) {
    x_lo = std::min(x_lo, p.mem);
    x_hi = std::max(x_hi, p.mem);
    if (p.ok) {
      y_lo = any_ok ? std::min(y_lo, p.tps) : p.tps;
      y_hi = any_ok ? std::max(y_hi, p.tps) : p.tps;
      any_ok = true;
    }
  }
  if (!any_ok) {
    y_lo = 0;
    y_hi = 1;
  }
  const Axis xa = NiceAxis(std::max(0.0, x_lo - 0.05 * (x_hi - x_lo)), x_hi + 0.05 * (x_hi - x_lo));
  const Axis ya = NiceAxis(std::max(0.0, y_lo - 0.1 * (y_hi - y_lo)), y_hi + 0.08 * (y_hi - y_lo));

  const double width = 960, height = 600, left = 90, right = 40, top = 66, bottom = 70;
  const double pw = width - left - right, ph = height - top - bottom;
  auto X = [&](double v) { return left + (v - xa.lo) / (xa.hi - xa.lo) * pw; };
  auto Y = [&](double v) { return top + ph - (v - ya.lo) / (ya.hi - ya.lo) * ph; };

  std::ostringstream svg;
  svg << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
      << "\" viewBox=\"0 0 " << width << " " << height
      << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  svg << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  std::string title = "remat: peak memory vs throughput";
  if (!s.spec().name().empty()) title += " — " + s.spec().name();
  if (!s.id().empty()) title += " (" + s.id() + ")";
  svg << "<text x=\"" << left << "\" y=\"28\" font-size=\"16\" font-weight=\"bold\">"
      << XmlEscape(title) << "</text>\n";

  // Grid and axes.
  svg << "<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n";
  for (double v = xa.lo; v <= xa.hi + xa.step / 2; v += xa.step) {
    svg << "<line x1=\"" << Num(X(v)) << "\" y1=\"" << top << "\" x2=\"" << Num(X(v)) << "\" y2=\""
        << top + ph << "\"/>\n";
  }
  for (double v = ya.lo; v <= ya.hi + ya.step / 2; v += ya.step) {
    svg << "<line x1=\"" << left << "\" y1=\"" << Num(Y(v)) << "\" x2=\"" << left + pw << "\" y2=\""
        << Num(Y(v)) << "\"/>\n";
  }
  svg << "</g>\n";
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
  svg << "<g fill=\"#333\">\n";
  for (double v = xa.lo; v <= xa.hi + xa.step / 2; v += xa.step) {
    svg << "<text x=\"" << Num(X(v)) << "\" y=\"" << top + ph + 18 << "\" text-anchor=\"middle\">"
        << TickLabel(v, xa.step) << "</text>\n";
  }
  for (double v = ya.lo; v <= ya.hi + ya.step / 2; v += ya.step) {
    svg << "<text x=\"" << left - 8 << "\" y=\"" << Num(Y(v) + 4) << "\" text-anchor=\"end\">"
        << TickLabel(v, ya.step) << "</text>\n";
  }
  svg << "<text x=\"" << left + pw / 2 << "\" y=\"" << height - 22
      << "\" text-anchor=\"middle\" font-size=\"13\">peak memory per rank (" << unit.name << ", "
      << metric << ", max over ranks)</text>\n";
  svg << "<text transform=\"translate(22," << top + ph / 2
      << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">throughput (tokens/s)</text>\n";
  svg << "</g>\n";

  // The budget.
  const std::string budget_text = "budget " + Format("%.4g", budget_bytes / kGiB) + " GiB";
  if (budget_on_chart) {
    svg << "<line class=\"budget\" x1=\"" << Num(X(budget)) << "\" y1=\"" << top << "\" x2=\""
        << Num(X(budget)) << "\" y2=\"" << top + ph
        << "\" stroke=\"#c0392b\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n";
    svg << "<text x=\"" << Num(X(budget) - 4) << "\" y=\"" << top + 14
        << "\" text-anchor=\"end\" fill=\"#c0392b\">" << budget_text << "</text>\n";
  } else {
    svg << "<text class=\"budget\" x=\"" << left + pw - 6 << "\" y=\"" << top + 14
        << "\" text-anchor=\"end\" fill=\"#c0392b\">" << budget_text
        << " (off the chart, to the right) \u2192</text>\n";
  }

  // The frontier as a step line: between two frontier points the best throughput available is
  // the lower point's; the last step runs on to the budget.
  std::vector<Point> fpts;
  for (const Point& p : points) {
    if (p.ok && p.on_frontier) fpts.push_back(p);
  }
  std::sort(fpts.begin(), fpts.end(), [](const Point& a, const Point& b) { return a.mem < b.mem; });
  if (!fpts.empty()) {
    std::ostringstream d;
    d << "M" << Num(X(fpts[0].mem)) << "," << Num(Y(fpts[0].tps));
    for (size_t i = 1; i < fpts.size(); ++i) {
      d << " H" << Num(X(fpts[i].mem)) << " V" << Num(Y(fpts[i].tps));
    }
    d << " H" << Num(budget_on_chart ? X(std::max(budget, fpts.back().mem)) : left + pw);
    svg << "<path class=\"frontier\" d=\"" << d.str()
        << "\" fill=\"none\" stroke=\"#1f6fb2\" stroke-width=\"2\"/>\n";
  }

  // Trials. Labels try four spots around their point and take the first that overlaps no
  // label placed before (a crude but dependable way to keep close points readable). A frontier
  // point is always labelled; any other point only where a free spot is left, so an exhaustive
  // search's cloud of points stays legible (its policies are in the table and the JSON).
  struct Box {
    double x0, y0, x1, y1;
  };
  std::vector<Box> placed;
  auto place_label = [&](double x, double y, const std::string& text,
                         bool must) -> std::optional<std::pair<double, double>> {
    const double w = 6.6 * text.size(), h = 13;
    const double spots[4][2] = {
        {x + 9, y - 8}, {x + 9, y + 17}, {x - 9 - w, y - 8}, {x - 9 - w, y + 17}};
    for (const auto& spot : spots) {
      Box b{spot[0], spot[1] - h + 2, spot[0] + w, spot[1] + 2};
      bool clash = b.x1 > width - 2 || b.x0 < left + 2 || b.y0 < top;
      for (const Box& o : placed) {
        clash = clash || !(b.x1 < o.x0 || o.x1 < b.x0 || b.y1 < o.y0 || o.y1 < b.y0);
      }
      if (!clash) {
        placed.push_back(b);
        return std::pair<double, double>(spot[0], spot[1]);
      }
    }
    if (!must) return std::nullopt;
    placed.push_back(Box{x + 9, y - 19, x + 9 + w, y - 6});
    return std::pair<double, double>(x + 9, y - 8);
  };
  std::vector<const Point*> order;
  for (const Point& p : points) order.push_back(&p);
  // Frontier points label first: they matter most.
  std::stable_sort(order.begin(), order.end(),
                   [](const Point* a, const Point* b) { return a->on_frontier > b->on_frontier; });
  for (const Point* pp : order) {
    const Point& p = *pp;
    if (p.oom) {
      const double x = X(p.mem), y = Y(ya.lo) - 10;
      svg << "<g class=\"oom\" stroke=\"#d62728\" stroke-width=\"2.5\"><line x1=\"" << Num(x - 6)
          << "\" y1=\"" << Num(y - 6) << "\" x2=\"" << Num(x + 6) << "\" y2=\"" << Num(y + 6)
          << "\"/><line x1=\"" << Num(x - 6) << "\" y1=\"" << Num(y + 6) << "\" x2=\"" << Num(x + 6)
          << "\" y2=\"" << Num(y - 6) << "\"/></g>\n";
      const std::string text = p.policy + " (oom)";
      if (auto spot = place_label(x, y - 12, text, false)) {
        svg << "<text x=\"" << Num(spot->first) << "\" y=\"" << Num(spot->second)
            << "\" fill=\"#d62728\">" << XmlEscape(text) << "</text>\n";
      }
      continue;
    }
    const double x = X(p.mem), y = Y(p.tps);
    const bool over = p.mem > budget;
    const char* fill = p.on_frontier ? "#1f6fb2" : (over ? "#bbbbbb" : "white");
    const char* stroke = over ? "#999999" : "#1f6fb2";
    svg << "<circle class=\"trial\" cx=\"" << Num(x) << "\" cy=\"" << Num(y) << "\" r=\""
        << (p.policy == recommended ? 7 : 5) << "\" fill=\"" << fill << "\" stroke=\"" << stroke
        << "\" stroke-width=\"2\"/>\n";
    if (p.policy == recommended) {
      svg << "<circle cx=\"" << Num(x) << "\" cy=\"" << Num(y)
          << "\" r=\"11\" fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"2\"/>\n";
    }
    const std::string text = p.policy + (p.policy == recommended ? " (recommended)" : "");
    if (auto spot = place_label(x, y, text, p.on_frontier || p.policy == recommended)) {
      svg << "<text x=\"" << Num(spot->first) << "\" y=\"" << Num(spot->second)
          << "\" fill=\"#222\">" << XmlEscape(text) << "</text>\n";
    }
  }

  // Legend, in one row above the plot.
  const double ly = 48;
  double lx = left;
  svg << "<g font-size=\"11\" fill=\"#333\">\n"
      << "<circle cx=\"" << lx + 5 << "\" cy=\"" << ly - 4
      << "\" r=\"5\" fill=\"#1f6fb2\" stroke=\"#1f6fb2\"/><text x=\"" << lx + 15 << "\" y=\"" << ly
      << "\">on the frontier (step line)</text>\n";
  lx += 175;
  svg << "<circle cx=\"" << lx + 5 << "\" cy=\"" << ly - 4
      << "\" r=\"5\" fill=\"white\" stroke=\"#1f6fb2\" stroke-width=\"2\"/><text x=\"" << lx + 15
      << "\" y=\"" << ly << "\">dominated</text>\n";
  lx += 85;
  svg << "<circle cx=\"" << lx + 5 << "\" cy=\"" << ly - 4
      << "\" r=\"5\" fill=\"#bbbbbb\" stroke=\"#999999\" stroke-width=\"2\"/><text x=\"" << lx + 15
      << "\" y=\"" << ly << "\">over budget</text>\n";
  lx += 95;
  svg << "<text x=\"" << lx << "\" y=\"" << ly + 1
      << "\" fill=\"#d62728\" font-weight=\"bold\" font-size=\"14\">\u00d7</text><text x=\""
      << lx + 15 << "\" y=\"" << ly << "\">out of memory (at its peak)</text>\n";
  lx += 190;
  svg << "<circle cx=\"" << lx + 5 << "\" cy=\"" << ly - 4
      << "\" r=\"7\" fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"2\"/><text x=\"" << lx + 17
      << "\" y=\"" << ly << "\">recommended</text>\n";
  svg << "</g>\n";
  svg << "</svg>\n";
  return svg.str();
}

// ---- list and progress -----------------------------------------------------------------------

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
        << (s.has_recommendation() ? s.recommendation() : "-") << "\n";
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
  if (tty) {
    constexpr int kWidth = 24;
    const int filled = planned > 0 ? kWidth * p.trials_done() / planned : 0;
    std::string bar = "[" + std::string(filled, '#') + std::string(kWidth - filled, '-') + "]";
    std::string line = bar + " " + std::to_string(p.trials_done()) + "/" + std::to_string(planned) +
                       " trials, " + std::to_string(p.trials_running()) + " running, " +
                       Duration(p.elapsed_s()) + " elapsed, ETA " + eta;
    if (!best.empty()) line += ", best " + best;
    return line;
  }
  std::string line = "progress: " + std::to_string(p.trials_done()) + "/" +
                     std::to_string(planned) + " trials done, " +
                     std::to_string(p.trials_running()) + " running, " + Duration(p.elapsed_s()) +
                     " elapsed, ETA " + eta + ", state " + StateName(p.state());
  line += best.empty() ? "; no point fits yet" : "; best so far: " + best;
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
