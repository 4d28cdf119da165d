#include "cli/render_svg.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "cli/render_format.h"

namespace remat::cli {
namespace {

using render::Format;
using render::IsLayoutProxy;
using render::MemoryOf;
using render::MemUnit;
using render::StagePeaks;
using render::StatusOf;
using render::UnitFor;

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

// The throughput of a trial's slowest and fastest measured step, from the steps of its slowest
// rank (the one that sets step_time_s) when they were reported; otherwise from
// step_time_spread_s, taken as spread evenly around the median (which side is unknown).
std::pair<double, double> ThroughputSpread(const v1::TrialResult& r) {
  const double median = r.step_time_s(), tps = r.tokens_per_s();
  if (!(median > 0) || !(tps > 0)) return {tps, tps};
  double slow = median, fast = median;
  const v1::RankResult* slowest = nullptr;
  for (const v1::RankResult& rank : r.ranks()) {
    if (rank.step_times_s_size() > 0 &&
        (slowest == nullptr || rank.step_time_s() > slowest->step_time_s())) {
      slowest = &rank;
    }
  }
  if (slowest != nullptr) {
    for (double t : slowest->step_times_s()) {
      if (t > 0) {
        slow = std::max(slow, t);
        fast = std::min(fast, t);
      }
    }
  } else if (r.step_time_spread_s() > 0) {
    slow = median + r.step_time_spread_s() / 2;
    fast = std::max(median - r.step_time_spread_s() / 2, median / 2);
  }
  return {tps * median / slow, tps * median / fast};
}

// A label's box as drawn (text baseline at y; 12 px font, about 6.6 px a character).
struct Box {
  double x0, y0, x1, y1;
  bool Overlaps(const Box& o) const { return !(x1 < o.x0 || o.x1 < x0 || y1 < o.y0 || o.y1 < y0); }
};
constexpr double kCharWidth = 6.6, kLineHeight = 13;
Box LabelBox(double x, double y, const std::string& text) {
  return Box{x, y - kLineHeight + 2, x + kCharWidth * static_cast<double>(text.size()), y + 2};
}

// One policy's point: a trial that ran (ok) or ran out of memory.
struct Point {
  std::string policy;
  double mem = 0, tps = 0;        // mem in bytes, then in the plot's unit
  double tps_lo = 0, tps_hi = 0;  // the throughput of the slowest and fastest measured step
  bool ok = false, oom = false, on_frontier = false;
  // A layout proxy's trial (search/layout_proxy.h): each pipeline stage's peak, drawn as ticks
  // on a line left of the point (the point is the highest stage, which decides the fit).
  std::vector<double> stage_mem;
};

// The points of the search's trials that ran or ran out of memory, memory in bytes. A
// re-measured policy has two trials; it is drawn once, from its last trial, with the pooled
// figures the frontier and the recommendation use (Trial.combined).
std::vector<Point> CollectPoints(const v1::Search& s) {
  const std::string& metric = s.memory_metric();
  const std::set<std::string> frontier(s.frontier().begin(), s.frontier().end());
  std::vector<Point> points;
  std::map<std::string, int> last_of;
  for (int i = 0; i < s.trials_size(); ++i) last_of[s.trials(i).policy().canonical()] = i;
  for (int i = 0; i < s.trials_size(); ++i) {
    const v1::Trial& t = s.trials(i);
    if (last_of[t.policy().canonical()] != i) continue;
    const v1::TrialResult& result = t.has_combined() ? t.combined() : t.result();
    const v1::TrialStatus st = StatusOf(t);
    Point p;
    p.policy = t.policy().canonical();
    p.mem = static_cast<double>(MemoryOf(result, metric));
    p.tps = result.tokens_per_s();
    p.ok = st == v1::TRIAL_STATUS_OK && p.tps > 0;
    p.oom = st == v1::TRIAL_STATUS_OOM;
    p.on_frontier = frontier.count(p.policy) > 0;
    if (p.ok) std::tie(p.tps_lo, p.tps_hi) = ThroughputSpread(result);
    if (p.oom && p.mem <= 0) p.mem = static_cast<double>(s.memory_budget_bytes());  // hit the budget
    if (p.ok && IsLayoutProxy(result)) {
      const int pp = s.spec().parallel().pipeline_model_parallel_size();
      for (uint64_t m : StagePeaks(result, pp, metric)) p.stage_mem.push_back(static_cast<double>(m));
    }
    if (p.ok || p.oom) points.push_back(p);
  }
  return points;
}

// The plot's frame and scales: the picture is 960 x 600 (it grows to the right when labels need
// a column), the plot inside its margins.
struct Plot {
  static constexpr double width = 960, height = 600, left = 90, right = 40, top = 66, bottom = 70;
  static constexpr double pw = width - left - right, ph = height - top - bottom;
  Axis xa, ya;
  MemUnit unit;
  double budget = 0;             // in the unit
  bool budget_on_chart = false;  // false: the budget is far right of every point, only named
  double X(double v) const { return left + (v - xa.lo) / (xa.hi - xa.lo) * pw; }
  double Y(double v) const { return top + ph - (v - ya.lo) / (ya.hi - ya.lo) * ph; }
};

// Chooses the unit and the axes, and converts the points' memory into the unit.
Plot MakePlot(uint64_t budget_bytes, std::vector<Point>& points) {
  double max_mem = 0;
  for (const Point& p : points) max_mem = std::max(max_mem, p.mem);
  Plot plot;
  // The budget is drawn when it is near the points; far beyond them (a tiny model under a big
  // budget) it would squash every point into the left edge, so it is only named.
  plot.budget_on_chart = points.empty() || budget_bytes <= 1.5 * max_mem;
  plot.unit = UnitFor(static_cast<uint64_t>(
      plot.budget_on_chart ? std::max<double>(max_mem, budget_bytes) : max_mem));
  plot.budget = budget_bytes / plot.unit.bytes;
  for (Point& p : points) {
    p.mem /= plot.unit.bytes;
    for (double& m : p.stage_mem) m /= plot.unit.bytes;
  }
  double x_lo = plot.budget_on_chart ? plot.budget : max_mem / plot.unit.bytes;
  double x_hi = x_lo, y_lo = 0, y_hi = 0;
  bool any_ok = false;
  for (const Point& p : points) {
    x_lo = std::min(x_lo, p.mem);
    x_hi = std::max(x_hi, p.mem);
    for (double m : p.stage_mem) x_lo = std::min(x_lo, m);
    if (p.ok) {
      y_lo = any_ok ? std::min(y_lo, p.tps_lo) : p.tps_lo;
      y_hi = any_ok ? std::max(y_hi, p.tps_hi) : p.tps_hi;
      any_ok = true;
    }
  }
  if (!any_ok) {
    y_lo = 0;
    y_hi = 1;
  }
  plot.xa = NiceAxis(std::max(0.0, x_lo - 0.05 * (x_hi - x_lo)), x_hi + 0.05 * (x_hi - x_lo));
  plot.ya = NiceAxis(std::max(0.0, y_lo - 0.1 * (y_hi - y_lo)), y_hi + 0.08 * (y_hi - y_lo));
  return plot;
}

// The title, the grid, the frame, the ticks and the axes' names.
void DrawFrame(const v1::Search& s, const Plot& plot, std::ostream& svg) {
  const double left = plot.left, top = plot.top, pw = plot.pw, ph = plot.ph;
  const Axis& xa = plot.xa;
  const Axis& ya = plot.ya;
  std::string title = "remat: peak memory vs throughput";
  if (!s.spec().name().empty()) title += " — " + s.spec().name();
  if (!s.id().empty()) title += " (" + s.id() + ")";
  svg << "<text x=\"" << left << "\" y=\"28\" font-size=\"16\" font-weight=\"bold\">"
      << XmlEscape(title) << "</text>\n";

  // Grid and axes.
  svg << "<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n";
  for (double v = xa.lo; v <= xa.hi + xa.step / 2; v += xa.step) {
    svg << "<line x1=\"" << Num(plot.X(v)) << "\" y1=\"" << top << "\" x2=\"" << Num(plot.X(v))
        << "\" y2=\"" << top + ph << "\"/>\n";
  }
  for (double v = ya.lo; v <= ya.hi + ya.step / 2; v += ya.step) {
    svg << "<line x1=\"" << left << "\" y1=\"" << Num(plot.Y(v)) << "\" x2=\"" << left + pw
        << "\" y2=\"" << Num(plot.Y(v)) << "\"/>\n";
  }
  svg << "</g>\n";
  svg << "<rect x=\"" << left << "\" y=\"" << top << "\" width=\"" << pw << "\" height=\"" << ph
      << "\" fill=\"none\" stroke=\"#333\"/>\n";
  svg << "<g fill=\"#333\">\n";
  for (double v = xa.lo; v <= xa.hi + xa.step / 2; v += xa.step) {
    svg << "<text x=\"" << Num(plot.X(v)) << "\" y=\"" << top + ph + 18
        << "\" text-anchor=\"middle\">" << TickLabel(v, xa.step) << "</text>\n";
  }
  for (double v = ya.lo; v <= ya.hi + ya.step / 2; v += ya.step) {
    svg << "<text x=\"" << left - 8 << "\" y=\"" << Num(plot.Y(v) + 4) << "\" text-anchor=\"end\">"
        << TickLabel(v, ya.step) << "</text>\n";
  }
  svg << "<text x=\"" << left + pw / 2 << "\" y=\"" << plot.height - 22
      << "\" text-anchor=\"middle\" font-size=\"13\">peak memory per rank (" << plot.unit.name
      << ", " << s.memory_metric() << ", max over ranks)</text>\n";
  svg << "<text transform=\"translate(22," << top + ph / 2
      << ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">throughput (tokens/s)</text>\n";
  svg << "</g>\n";
}

// The budget: a dashed line with its name, or only its name when it is off the chart. Returns
// the name's box, which trial labels keep off.
Box DrawBudget(const Plot& plot, std::ostream& svg) {
  const double left = plot.left, top = plot.top, pw = plot.pw, ph = plot.ph;
  const double budget = plot.budget;
  // One unit on the axis, and the budget named in it.
  const std::string budget_text = "budget " + Format("%.4g", budget) + " " + plot.unit.name;
  if (plot.budget_on_chart) {
    svg << "<line class=\"budget\" x1=\"" << Num(plot.X(budget)) << "\" y1=\"" << top
        << "\" x2=\"" << Num(plot.X(budget)) << "\" y2=\"" << top + ph
        << "\" stroke=\"#c0392b\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n";
    svg << "<text x=\"" << Num(plot.X(budget) - 4) << "\" y=\"" << top + 14
        << "\" text-anchor=\"end\" fill=\"#c0392b\">" << budget_text << "</text>\n";
  } else {
    svg << "<text class=\"budget\" x=\"" << left + pw - 6 << "\" y=\"" << top + 14
        << "\" text-anchor=\"end\" fill=\"#c0392b\">" << budget_text
        << " (off the chart, to the right) \u2192</text>\n";
  }
  const double budget_text_w =
      kCharWidth * static_cast<double>(budget_text.size() + (plot.budget_on_chart ? 0 : 32));
  const double budget_text_x1 = plot.budget_on_chart ? plot.X(budget) - 4 : left + pw - 6;
  return Box{budget_text_x1 - budget_text_w, top + 14 - kLineHeight + 2, budget_text_x1, top + 16};
}

// The frontier as a step line: between two frontier points the best throughput available is
// the lower point's; the last step runs on to the budget.
void DrawFrontier(const Plot& plot, const std::vector<Point>& points, std::ostream& svg) {
  std::vector<Point> fpts;
  for (const Point& p : points) {
    if (p.ok && p.on_frontier) fpts.push_back(p);
  }
  std::sort(fpts.begin(), fpts.end(), [](const Point& a, const Point& b) { return a.mem < b.mem; });
  if (fpts.empty()) return;
  std::ostringstream d;
  d << "M" << Num(plot.X(fpts[0].mem)) << "," << Num(plot.Y(fpts[0].tps));
  for (size_t i = 1; i < fpts.size(); ++i) {
    d << " H" << Num(plot.X(fpts[i].mem)) << " V" << Num(plot.Y(fpts[i].tps));
  }
  d << " H"
    << Num(plot.budget_on_chart ? plot.X(std::max(plot.budget, fpts.back().mem))
                                : plot.left + plot.pw);
  svg << "<path class=\"frontier\" d=\"" << d.str()
      << "\" fill=\"none\" stroke=\"#1f6fb2\" stroke-width=\"2\"/>\n";
}

// Places the trials' labels so that none overlaps a point or another label: each tries eight
// spots around its point and takes the first free one. A frontier or recommended point whose
// spots are all taken gets its label in a column right of the plot, joined to the point by a
// leader line; any other point is labelled only where a spot is free, so an exhaustive search's
// cloud stays legible (its policies are in the table and the JSON).
class Labels {
 public:
  Labels(const Plot& plot, std::vector<Box> placed) : plot_(plot), placed_(std::move(placed)) {}

  // A label near (x, y), written to `svg`; false when every spot is taken.
  bool Near(double x, double y, const std::string& text, const std::string& fill,
            std::ostream& svg) {
    const double w = kCharWidth * static_cast<double>(text.size());
    const double spots[8][2] = {{x + 9, y - 8},      {x + 9, y + 17},    {x - 9 - w, y - 8},
                                {x - 9 - w, y + 17}, {x + 9, y + 4},     {x - 9 - w, y + 4},
                                {x - w / 2, y - 12}, {x - w / 2, y + 22}};
    for (const auto& spot : spots) {
      const Box b = LabelBox(spot[0], spot[1], text);
      bool clash = b.x1 > plot_.left + plot_.pw - 2 || b.x0 < plot_.left + 2 || b.y0 < plot_.top ||
                   b.y1 > plot_.top + plot_.ph;
      for (const Box& o : placed_) clash = clash || b.Overlaps(o);
      if (!clash) {
        placed_.push_back(b);
        Emit(b, text, fill, svg);
        return true;
      }
    }
    return false;
  }

  // A box no label may overlap (a point, a mark).
  void Reserve(const Box& b) { placed_.push_back(b); }

  // A label for the column, placed by Column once every point is drawn.
  void Defer(double x, double y, const std::string& text, const std::string& fill) {
    column_.push_back(Pending{x, y, text, fill});
  }

  // The label column: in the order of their points' heights (few leader lines cross), one row
  // each, a further column where one fills up. Returns the picture's width.
  double Column(std::ostream& svg) {
    double picture_width = plot_.width;
    if (column_.empty()) return picture_width;
    std::stable_sort(column_.begin(), column_.end(),
                     [](const Pending& a, const Pending& b) { return a.y < b.y; });
    const int rows = std::max(1, static_cast<int>((plot_.ph - 4) / (kLineHeight + 2)));
    double col_x = plot_.left + plot_.pw + 14, col_w = 0;
    svg << "<g class=\"label-column\">\n";
    for (size_t i = 0; i < column_.size(); ++i) {
      if (i > 0 && i % rows == 0) {
        col_x += col_w + 18;
        col_w = 0;
      }
      const double row_y = plot_.top + 12 + static_cast<double>(i % rows) * (kLineHeight + 2);
      const Box b = LabelBox(col_x, row_y, column_[i].text);
      col_w = std::max(col_w, b.x1 - b.x0);
      svg << "<line class=\"leader\" x1=\"" << Num(column_[i].x + 6) << "\" y1=\""
          << Num(column_[i].y) << "\" x2=\"" << Num(col_x - 3) << "\" y2=\"" << Num(row_y - 4)
          << "\" stroke=\"#999\" stroke-width=\"0.75\"/>\n";
      Emit(b, column_[i].text, column_[i].fill, svg);
      picture_width = std::max(picture_width, b.x1 + 10);
    }
    svg << "</g>\n";
    return picture_width;
  }

 private:
  struct Pending {
    double x, y;
    std::string text, fill;
  };
  static void Emit(const Box& b, const std::string& text, const std::string& fill,
                   std::ostream& svg) {
    svg << "<text class=\"label\" x=\"" << Num(b.x0) << "\" y=\"" << Num(b.y1 - 2) << "\" fill=\""
        << fill << "\">" << XmlEscape(text) << "</text>\n";
  }

  const Plot& plot_;
  std::vector<Box> placed_;
  std::vector<Pending> column_;
};

// An out-of-memory trial: a cross at its memory on the plot's floor, labelled where a spot is free.
void DrawOom(const Plot& plot, const Point& p, Labels& labels, std::ostream& svg) {
  const double x = plot.X(p.mem), y = plot.Y(plot.ya.lo) - 10;
  svg << "<g class=\"oom\" stroke=\"#d62728\" stroke-width=\"2.5\"><line x1=\"" << Num(x - 6)
      << "\" y1=\"" << Num(y - 6) << "\" x2=\"" << Num(x + 6) << "\" y2=\"" << Num(y + 6)
      << "\"/><line x1=\"" << Num(x - 6) << "\" y1=\"" << Num(y + 6) << "\" x2=\"" << Num(x + 6)
      << "\" y2=\"" << Num(y - 6) << "\"/></g>\n";
  labels.Near(x, y - 12, p.policy + " (oom)", "#d62728", svg);
}

// A trial that ran, with its spread (a vertical bar from the throughput of its slowest measured
// step to its fastest), a layout proxy's stage peaks, the recommendation's ring, and its label.
void DrawTrial(const Plot& plot, const Point& p, const std::string& recommended, Labels& labels,
               std::ostream& svg) {
  const double x = plot.X(p.mem), y = plot.Y(p.tps);
  const bool over = p.mem > plot.budget;
  const char* fill = p.on_frontier ? "#1f6fb2" : (over ? "#bbbbbb" : "white");
  const char* stroke = over ? "#999999" : "#1f6fb2";
  if (p.tps_hi > p.tps_lo) {
    svg << "<line class=\"spread\" x1=\"" << Num(x) << "\" y1=\"" << Num(plot.Y(p.tps_hi))
        << "\" x2=\"" << Num(x) << "\" y2=\"" << Num(plot.Y(p.tps_lo)) << "\" stroke=\"" << stroke
        << "\" stroke-width=\"1\"/>\n";
  }
  if (!p.stage_mem.empty()) {
    const auto [lo, hi] = std::minmax_element(p.stage_mem.begin(), p.stage_mem.end());
    svg << "<g class=\"stages\" stroke=\"" << stroke << "\" stroke-width=\"1\"><line x1=\""
        << Num(plot.X(*lo)) << "\" y1=\"" << Num(y) << "\" x2=\"" << Num(plot.X(*hi))
        << "\" y2=\"" << Num(y) << "\"/>";
    for (double m : p.stage_mem) {
      svg << "<line x1=\"" << Num(plot.X(m)) << "\" y1=\"" << Num(y - 4) << "\" x2=\""
          << Num(plot.X(m)) << "\" y2=\"" << Num(y + 4) << "\"/>";
    }
    svg << "</g>\n";
  }
  svg << "<circle class=\"trial\" cx=\"" << Num(x) << "\" cy=\"" << Num(y) << "\" r=\""
      << (p.policy == recommended ? 7 : 5) << "\" fill=\"" << fill << "\" stroke=\"" << stroke
      << "\" stroke-width=\"2\"/>\n";
  if (p.policy == recommended) {
    svg << "<circle cx=\"" << Num(x) << "\" cy=\"" << Num(y)
        << "\" r=\"11\" fill=\"none\" stroke=\"#2ca02c\" stroke-width=\"2\"/>\n";
  }
  const std::string text = p.policy + (p.policy == recommended ? " (recommended)" : "");
  if (!labels.Near(x, y, text, "#222", svg) && (p.on_frontier || p.policy == recommended)) {
    labels.Defer(x, y, text, "#222");
  }
}

// The legend, in one row above the plot; the stage peaks' entry only when a point has them.
void DrawLegend(const Plot& plot, bool any_stages, std::ostream& svg) {
  const double ly = 48;
  double lx = plot.left;
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
  if (any_stages) {
    lx += 105;
    svg << "<g stroke=\"#1f6fb2\" stroke-width=\"1\"><line x1=\"" << lx << "\" y1=\"" << ly - 4
        << "\" x2=\"" << lx + 14 << "\" y2=\"" << ly - 4 << "\"/><line x1=\"" << lx << "\" y1=\""
        << ly - 8 << "\" x2=\"" << lx << "\" y2=\"" << ly << "\"/><line x1=\"" << lx + 14
        << "\" y1=\"" << ly - 8 << "\" x2=\"" << lx + 14 << "\" y2=\"" << ly
        << "\"/></g><text x=\"" << lx + 19 << "\" y=\"" << ly
        << "\">stage peaks (layout proxy)</text>\n";
  }
  svg << "</g>\n";
}

}  // namespace

std::string ResultSvg(const v1::Search& s) {
  const std::string recommended = s.has_recommendation() ? s.recommendation() : "";
  std::vector<Point> points = CollectPoints(s);
  const Plot plot = MakePlot(s.memory_budget_bytes(), points);

  // The body first: the picture's width is known once the labels are placed (a label column may
  // be added on the right).
  std::ostringstream svg;
  DrawFrame(s, plot, svg);
  Labels labels(plot, {DrawBudget(plot, svg)});
  DrawFrontier(plot, points, svg);
  // Labels keep off every point (and off every out-of-memory mark).
  for (const Point& p : points) {
    const double x = plot.X(p.mem), y = p.oom ? plot.Y(plot.ya.lo) - 10 : plot.Y(p.tps);
    labels.Reserve(Box{x - 7, y - 7, x + 7, y + 7});
  }
  std::vector<const Point*> order;
  for (const Point& p : points) order.push_back(&p);
  // Frontier points label first: they matter most.
  std::stable_sort(order.begin(), order.end(),
                   [](const Point* a, const Point* b) { return a->on_frontier > b->on_frontier; });
  for (const Point* p : order) {
    if (p->oom) {
      DrawOom(plot, *p, labels, svg);
    } else {
      DrawTrial(plot, *p, recommended, labels, svg);
    }
  }
  const double picture_width = labels.Column(svg);
  bool any_stages = false;
  for (const Point& p : points) any_stages = any_stages || !p.stage_mem.empty();
  DrawLegend(plot, any_stages, svg);

  std::ostringstream out;
  out << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << Num(picture_width)
      << "\" height=\"" << plot.height << "\" viewBox=\"0 0 " << Num(picture_width) << " "
      << plot.height << "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  out << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  out << svg.str() << "</svg>\n";
  return out.str();
}

}  // namespace remat::cli
