#include "search/predict.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "search/rules.h"

namespace remat::search {
namespace {

// A trial whose figures can anchor a prediction: it ran to the end and has memory and a time.
bool Usable(const TrialResult& r) {
  return r.status == TrialStatus::kOk && !r.ranks.empty() && r.tokens_per_s > 0;
}

int SymmetricDifference(const Policy& a, const Policy& b) {
  int d = 0;
  for (Label l : a.labels) d += b.Has(l) ? 0 : 1;
  for (Label l : b.labels) d += a.Has(l) ? 0 : 1;
  return d;
}

}  // namespace

Predictor::Predictor(const SearchSpec& spec)
    : spec_(spec), model_flops_(std::max(ModelFlopsPerStep(spec), 1.0)) {}

const MemoryEstimate& Predictor::Model(const Policy& policy) {
  const std::string key = policy.ToString();
  auto it = cache_.find(key);
  if (it == cache_.end()) it = cache_.emplace(key, EstimateMemory(spec_, policy)).first;
  return it->second;
}

double Predictor::StepCost(const Policy& policy) {
  double elementwise = 0;
  for (Label l : policy.labels) {
    if (l == Label::kLayernorm || l == Label::kMoeAct) elementwise += 0.01;
  }
  return 1.0 + Model(policy).recompute_flops / model_flops_ + elementwise;
}

double Predictor::StepRatio(const Policy& from, const Policy& to, const Charges& charges) {
  if ((charges.discounted.empty() && charges.scales.empty()) || from.IsFull() || to.IsFull()) {
    return StepCost(to) / StepCost(from);
  }
  // The labels `to` drops, then the ones it adds; with every label charged as the model says the
  // steps' product is StepCost's ratio.
  double ratio = 1;
  Policy at = from;
  auto charge = [&](Label l, const Policy& without, const Policy& with) {
    const double c = StepCost(with) / StepCost(without) - 1;
    if (charges.discounted.count(l)) return 1 + c * kUnmeasuredLabelScale;
    const auto it = charges.scales.find(l);
    return 1 + c * (it == charges.scales.end() ? 1.0 : it->second.scale);
  };
  for (Label l : from.labels) {
    if (to.Has(l)) continue;
    const Policy next = at.Without(l);
    ratio /= charge(l, next, at);
    at = next;
  }
  for (Label l : to.labels) {
    if (at.Has(l)) continue;
    const Policy next = at.With(l);
    ratio *= charge(l, at, next);
    at = next;
  }
  return ratio;
}

Prediction Predictor::PredictFrom(const TrialResult& anchor, const Policy& policy,
                                  const Charges& charges) {
  const MemoryMetric metric = spec_.search.memory_metric;
  Prediction out;
  const double model_anchor = Model(anchor.policy).peak_bytes;
  const double ratio = model_anchor > 0 ? Model(policy).peak_bytes / model_anchor : 1;
  out.memory_bytes = anchor.PeakBytes(metric) * ratio;
  out.tokens_per_s = anchor.tokens_per_s / StepRatio(anchor.policy, policy, charges);
  return out;
}

std::optional<Prediction> Predictor::PredictFamily(
    const std::map<std::string, TrialResult>& measured, const Policy& policy,
    const std::string& exclude) {
  const MemoryMetric metric = spec_.search.memory_metric;
  const uint64_t budget = spec_.search.MemoryBudgetBytes();
  const int layers = LayersPerStage(spec_);
  const bool block = policy.method == RecomputeMethod::kBlock;
  // N -> measured member. full:uniform:1 is block's N = layers (each layer checkpointed alone).
  std::map<int, const TrialResult*> family;
  const TrialResult* uniform1 = nullptr;
  for (const auto& [key, r] : measured) {
    if (!r.policy.IsFull() || key == exclude) continue;
    if (r.policy.method == policy.method) {
      family[r.policy.num_layers] = &r;
    } else if (block && r.policy.num_layers == 1) {
      uniform1 = &r;
    }
  }
  // full:uniform:1 keeps what full:block:<layers> keeps and recomputes the same: when both were
  // measured they are two draws of one policy, and the end of the block family is their mean.
  // Anchored on one draw, a slow one hid the family's middle: on the second H200 MLA table
  // full:block:6 ran 9% behind uniform:1, block:5 and 4 were predicted under the gain worth a
  // trial, and the frontier kept 0.947 of the exhaustive one (with the mean 0.992, two trials more).
  TrialResult pooled;
  if (uniform1 != nullptr) {
    const TrialResult*& end = family[layers];
    if (end == nullptr) {
      end = uniform1;
    } else if (Usable(*end) && Usable(*uniform1)) {
      pooled = *end;
      pooled.tokens_per_s = 0.5 * (end->tokens_per_s + uniform1->tokens_per_s);
      end = &pooled;
    }
  }
  Prediction out;
  const int n = policy.num_layers;
  const TrialResult* below = nullptr;  // largest usable N under n
  const TrialResult* above = nullptr;  // smallest usable N over n
  int n_below = 0, n_above = 0;
  for (const auto& [k, r] : family) {
    const bool fits = Usable(*r) && r->PeakBytes(metric) <= budget;
    const bool no_fit = r->status == TrialStatus::kOom || (Usable(*r) && !fits);
    // Block memory falls as N grows, so a block N that did not fit rules out every smaller N.
    if (block && no_fit && k >= n) out.known_not_to_fit = true;
    if (!Usable(*r)) continue;
    if (k < n) {
      below = r;
      n_below = k;
    } else if (k > n && !above) {
      above = r;
      n_above = k;
    }
  }
  if (!below && !above) return out;  // no anchor in the family: only what did not fit
  // Ratios measured/model of memory and of tokens x cost, interpolated linearly in N.
  const double model_mem = Model(policy).peak_bytes;
  const double cost = StepCost(policy);
  auto mem_ratio = [&](const TrialResult* r) {
    const double m = Model(r->policy).peak_bytes;
    return m > 0 ? r->PeakBytes(metric) / m : 1;
  };
  auto speed = [&](const TrialResult* r) { return r->tokens_per_s * StepCost(r->policy); };
  double rm = 0, sp = 0;
  if (below && above) {
    const double w = static_cast<double>(n - n_below) / (n_above - n_below);
    rm = mem_ratio(below) + w * (mem_ratio(above) - mem_ratio(below));
    sp = speed(below) + w * (speed(above) - speed(below));
  } else {
    const TrialResult* a = below ? below : above;
    rm = mem_ratio(a);
    sp = speed(a);
  }
  out.memory_bytes = model_mem * rm;
  out.tokens_per_s = sp / cost;
  if (block) {
    // Monotone: between its measured neighbours in both memory and throughput.
    if (below) {
      out.memory_bytes = std::min(out.memory_bytes, static_cast<double>(below->PeakBytes(metric)));
      out.tokens_per_s = std::min(out.tokens_per_s, below->tokens_per_s);
    }
    if (above) {
      out.memory_bytes = std::max(out.memory_bytes, static_cast<double>(above->PeakBytes(metric)));
      out.tokens_per_s = std::max(out.tokens_per_s, above->tokens_per_s);
    }
  }
  return out;
}

Prediction Predictor::Predict(const std::map<std::string, TrialResult>& measured,
                              const Policy& policy, bool optimistic) {
  return PredictExcluding(measured, policy, "", optimistic, /*measured_charges=*/true);
}

MemoryError Predictor::MeasuredMemoryError(const std::map<std::string, TrialResult>& measured) {
  const MemoryMetric metric = spec_.search.memory_metric;
  std::vector<double> errors;
  for (const auto& [key, r] : measured) {
    if (!Usable(r) || r.predicted) continue;
    const Prediction p = PredictExcluding(measured, r.policy, key);
    if (!(p.memory_bytes > 0) || !(p.tokens_per_s > 0)) continue;  // nothing else anchored it
    errors.push_back((r.PeakBytes(metric) - p.memory_bytes) / p.memory_bytes);
  }
  MemoryError out;
  out.trials = static_cast<int>(errors.size());
  if (errors.empty()) return out;
  std::vector<double> sorted = errors;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  out.bias = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  // The 90th percentile (nearest rank) of the distances from the median: the largest with fewer
  // than ten errors, the largest but one from ten on.
  std::vector<double> distance;
  for (double e : errors) distance.push_back(std::fabs(e - out.bias));
  std::sort(distance.begin(), distance.end());
  const size_t rank = static_cast<size_t>(std::ceil(kMemoryErrorQuantile * distance.size()));
  out.spread = distance[std::clamp<size_t>(rank, 1, distance.size()) - 1];
  return out;
}

FitTest FitTestFrom(const MemoryError& error) {
  FitTest t;
  if (error.trials < kMinErrorTrials) return t;
  t.bias = error.bias;
  t.margin = std::clamp(error.spread, kMinMargin, kModelMargin);
  return t;
}

Prediction Predictor::PredictExcluding(const std::map<std::string, TrialResult>& measured,
                                       const Policy& policy, const std::string& exclude,
                                       bool optimistic, bool measured_charges) {
  bool known_not_to_fit = false;
  if (policy.IsFull()) {
    if (auto p = PredictFamily(measured, policy, exclude)) {
      if (p->tokens_per_s > 0) return *p;
      known_not_to_fit = p->known_not_to_fit;
    }
  }
  // The nearest measured trial: by labels for a selective policy, by the model's peak otherwise.
  const double model_peak = Model(policy).peak_bytes;
  const TrialResult* anchor = nullptr;
  int best_diff = 0;
  double best_gap = 0;
  for (const auto& [key, r] : measured) {
    if (!Usable(r) || key == exclude) continue;
    const int diff = policy.IsFull() || r.policy.IsFull()
                         ? (policy.IsFull() == r.policy.IsFull() ? 0 : kNumLabels + 1)
                         : SymmetricDifference(policy, r.policy);
    const double gap = std::fabs(Model(r.policy).peak_bytes - model_peak);
    if (!anchor || diff < best_diff || (diff == best_diff && gap < best_gap)) {
      anchor = &r;
      best_diff = diff;
      best_gap = gap;
    }
  }
  Prediction out;
  if (anchor) {
    // Optimistic: the labels of `policy` that no selective trial ran, whatever its outcome (a
    // label whose own trial did not fit was still tried, and the plan tries every label but
    // moe and shared_experts).
    Charges charges;
    if (!policy.IsFull()) {
      if (measured_charges) charges.scales = LabelChargeScales(measured);
      if (optimistic) {
        charges.discounted.insert(policy.labels.begin(), policy.labels.end());
        for (const auto& [key, r] : measured) {
          if (r.predicted || r.policy.IsFull() || key == exclude) continue;
          for (Label l : r.policy.labels) charges.discounted.erase(l);
        }
      }
    }
    out = PredictFrom(*anchor, policy, charges);
  } else {
    out.memory_bytes = model_peak;  // nothing measured: the model alone, no time
  }
  out.known_not_to_fit = known_not_to_fit;
  return out;
}

std::map<Label, Predictor::LabelScale> Predictor::LabelChargeScales(
    const std::map<std::string, TrialResult>& measured) {
  // Every pair of trials is O(n^2), and a proposal predicts every untried policy from the same
  // measurements: computed again only when what it reads of them has changed (an O(n) check).
  std::vector<std::tuple<std::string, bool, bool, double>> inputs;
  inputs.reserve(measured.size());
  for (const auto& [key, r] : measured) {
    inputs.emplace_back(key, Usable(r), r.predicted, r.tokens_per_s);
  }
  if (inputs != scales_inputs_ || scales_inputs_.empty()) {
    scales_ = ComputeLabelChargeScales(measured);
    scales_inputs_ = std::move(inputs);
  }
  return scales_;
}

std::map<Label, Predictor::LabelScale> Predictor::ComputeLabelChargeScales(
    const std::map<std::string, TrialResult>& measured) {
  std::vector<const TrialResult*> ok;
  for (const auto& [key, r] : measured) {
    if (Usable(r) && !r.predicted && !r.policy.IsFull()) ok.push_back(&r);
  }
  std::map<Label, std::vector<double>> model, seen;
  for (const TrialResult* without : ok) {
    for (const TrialResult* with : ok) {
      if (with->policy.labels.size() != without->policy.labels.size() + 1) continue;
      std::vector<Label> added;
      for (Label l : with->policy.labels) {
        if (!without->policy.Has(l)) added.push_back(l);
      }
      if (added.size() != 1) continue;
      // A label the model charges nothing beside the others (moe_act or shared_experts beside
      // moe, which replays them already) says nothing about its charge.
      const double charge = StepCost(with->policy) / StepCost(without->policy) - 1;
      if (!(charge > 0)) continue;
      model[added.front()].push_back(charge);
      seen[added.front()].push_back(without->tokens_per_s / with->tokens_per_s - 1);
    }
  }
  std::map<Label, LabelScale> out;
  for (const auto& [label, charges] : model) {
    // MedianStepTime is a plain median of its values.
    const double m = MedianStepTime(charges);
    const double y = MedianStepTime(seen[label]);
    if (!(m > 0)) continue;
    out[label] = {std::clamp(y / m, kMinLabelChargeScale, kMaxLabelChargeScale),
                  static_cast<int>(charges.size()), y, m};
  }
  return out;
}

}  // namespace remat::search
