#include "search/provenance.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace remat::search {
namespace {

double Relative(double a, double reference) {
  const double scale = std::max(std::abs(reference), 1e-30);
  return std::abs(a - reference) / scale;
}

std::string Sci(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1e", v);
  return buf;
}

std::string Fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.6g", v);
  return buf;
}

bool Comparable(const TrialResult& r) {
  // Zero stands for "not reported" (a replay or command job without losses): a real training
  // loss is never exactly 0.
  return r.status == TrialStatus::kOk && !r.predicted && r.loss != 0 && std::isfinite(r.loss);
}

}  // namespace

double NumericsTolerance(Precision precision) {
  return precision == Precision::kFp32 ? 1e-5 : 1e-3;
}

std::string NumericsMismatch(const SearchSpec& spec, const TrialResult& control,
                             const TrialResult& trial) {
  if (!Comparable(control) || !Comparable(trial)) return "";
  const std::string whose =
      control.policy.IsNone() ? "the control's" : control.policy.ToString() + "'s";
  const double tolerance = NumericsTolerance(spec.train.precision);
  const std::string band =
      "tolerance " + Sci(tolerance) + ", " + Name(spec.train.precision) + ")";
  std::string out;
  const double loss_off = Relative(trial.loss, control.loss);
  if (!(loss_off <= tolerance)) {
    out = "loss " + Fixed(trial.loss) + " vs " + whose + " " + Fixed(control.loss) + " (" +
          Sci(loss_off) + " relative; " + band;
  }
  if (control.grad_norm != 0 && trial.grad_norm != 0) {
    const double norm_off = Relative(trial.grad_norm, control.grad_norm);
    if (!(norm_off <= tolerance)) {
      if (!out.empty()) out += ", ";
      out += "grad norm " + Fixed(trial.grad_norm) + " vs " + whose + " " +
             Fixed(control.grad_norm) + " (" + Sci(norm_off) + " relative; " + band;
    }
  }
  if (out.empty()) return "";
  return trial.policy.ToString() + ": " + out +
         ": recompute must not change the numbers; this trial computed something else";
}

NumericsCheck CheckNumerics(const SearchSpec& spec, const std::vector<TrialResult>& results) {
  NumericsCheck check;
  const TrialResult* control = nullptr;
  for (const TrialResult& r : results) {
    if (r.policy.IsNone() && Comparable(r)) {
      control = &r;
      break;
    }
  }
  // When the control did not run ok (it often does not fit the budget), the first comparable
  // trial stands in: every policy must still agree with every other.
  for (const TrialResult& r : results) {
    if (control == nullptr && Comparable(r)) control = &r;
  }
  if (control == nullptr) return check;
  check.has_control = control->policy.IsNone();
  check.reference = control->policy.ToString();
  for (size_t i = 0; i < results.size(); ++i) {
    const TrialResult& r = results[i];
    if (&r == control || !Comparable(r)) continue;
    ++check.compared;
    std::string mismatch = NumericsMismatch(spec, *control, r);
    if (!mismatch.empty()) check.mismatches[i] = std::move(mismatch);
  }
  return check;
}

std::map<std::string, std::string> SearchVersions(const std::vector<TrialResult>& results) {
  std::map<std::string, std::vector<std::string>> seen;
  for (const TrialResult& r : results) {
    for (const auto& [key, value] : r.versions) {
      auto& values = seen[key];
      if (std::find(values.begin(), values.end(), value) == values.end()) values.push_back(value);
    }
  }
  std::map<std::string, std::string> out;
  for (const auto& [key, values] : seen) {
    std::string joined;
    for (const std::string& v : values) joined += (joined.empty() ? "" : " | ") + v;
    out[key] = joined;
  }
  return out;
}

}  // namespace remat::search
