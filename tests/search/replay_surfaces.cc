#include "tests/search/replay_surfaces.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "search/equivalence.h"
#include "search/memory_model.h"
#include "search/noise.h"
#include "search/planner.h"
#include "search/remeasure.h"
#include "search/rules.h"

namespace remat::search::replay {
namespace {

constexpr double kPi = 3.14159265358979323846;

// FNV-1a: a seed per policy that does not depend on the enumeration order or the library.
uint64_t Hash(uint64_t seed, const std::string& s) {
  uint64_t h = 1469598103934665603ull ^ seed;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// splitmix64's finaliser: every output bit depends on every input bit.
uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double Uniform(std::mt19937_64& rng, double half_width) {
  return std::uniform_real_distribution<double>(-half_width, half_width)(rng);
}

// Extra relative step time of a label's replay that is elementwise and memory-bound: what the
// FLOP model understates (the planner charges 1% each; the "true" cost here is other).
double ElementwiseCost(Label l) {
  if (l == Label::kLayernorm) return 0.02;
  if (l == Label::kMoeAct) return 0.015;
  return 0;
}

SearchSpec Llama70b(AttentionBackend attention) {
  SearchSpec s;
  s.name = attention == AttentionBackend::kFlash ? "llama70b-flash" : "llama70b-unfused";
  ModelSpec& m = s.model;
  m.num_layers = 80;
  m.hidden_size = 8192;
  m.num_attention_heads = 64;
  m.num_query_groups = 8;
  m.ffn_hidden_size = 28672;
  m.gated_linear_unit = true;
  m.normalization = Normalization::kRMSNorm;
  m.seq_length = 4096;
  m.vocab_size = 128256;
  m.attention_backend = attention;
  m.attention_dropout = 0;
  m.hidden_dropout = 0;
  m.add_bias_linear = false;
  m.position_embedding_type = PositionEmbedding::kRope;
  s.train.use_distributed_optimizer = true;
  s.parallel.tensor_model_parallel_size = 8;
  s.parallel.sequence_parallel = true;
  s.parallel.data_parallel_size = 8;
  s.search.memory_budget_gib = attention == AttentionBackend::kFlash ? 80 : 110;
  return s;
}

SearchSpec Dense48() {
  SearchSpec s = Llama70b(AttentionBackend::kUnfused);
  s.name = "dense48";
  ModelSpec& m = s.model;
  m.num_layers = 48;
  m.hidden_size = 5120;
  m.num_attention_heads = 40;
  m.num_query_groups = 8;
  m.ffn_hidden_size = 13824;
  s.parallel.tensor_model_parallel_size = 4;
  s.search.memory_budget_gib = 80;
  return s;
}

SearchSpec MixtralLike() {
  SearchSpec s = Llama70b(AttentionBackend::kFlash);
  s.name = "mixtral-like";
  ModelSpec& m = s.model;
  m.num_layers = 32;
  m.hidden_size = 4096;
  m.num_attention_heads = 32;
  m.num_query_groups = 8;
  m.ffn_hidden_size = 14336;
  m.num_moe_experts = 8;
  m.moe_router_topk = 2;
  m.moe_grouped_gemm = true;
  s.parallel.tensor_model_parallel_size = 1;
  s.parallel.sequence_parallel = false;
  s.parallel.expert_model_parallel_size = 8;
  s.parallel.data_parallel_size = 8;
  s.search.memory_budget_gib = 130;
  return s;
}

}  // namespace

Table SyntheticTable(const SearchSpec& spec, double step_time_s, const Noise& noise,
                     uint64_t seed, int draw) {
  std::mt19937_64 rng(seed);
  // Systematic errors, drawn once per table.
  const double activation_error = Uniform(rng, noise.label_memory_error);
  std::map<Label, double> label_error, label_cost_error;
  for (Label l : AllLabels()) {
    label_error[l] = Uniform(rng, noise.label_memory_error);
    label_cost_error[l] = Uniform(rng, noise.replay_cost_error);
  }
  const double full_cost_error = Uniform(rng, noise.replay_cost_error);
  const double phase_block = Uniform(rng, kPi), phase_uniform = Uniform(rng, kPi);
  const double caching_block = Uniform(rng, kPi), caching_uniform = Uniform(rng, kPi);
  const int layers = std::max(1, LayersPerStage(spec));
  const uint64_t budget = spec.search.MemoryBudgetBytes();
  const MemoryEstimate control = EstimateMemory(spec, Policy::None());

  Table table;
  for (const Policy& member : EnumerateValidPolicies(spec)) {
    // A selective policy is "measured" as its equivalence class's representative (the same
    // tensors, the same replay: search/equivalence.h), with step times of its own.
    const Policy p = member.IsFull() ? member : EquivalenceClassOf(spec, member).representative;
    std::mt19937_64 prng(Hash(seed, p.ToString()));
    std::mt19937_64 member_rng(Hash(seed, member.ToString()));
    const MemoryEstimate e = EstimateMemory(spec, p);
    const double held = e.peak_bytes - e.static_bytes;
    double allocated = e.static_bytes + held * (1 + activation_error);
    double cost = 0;
    if (p.IsFull()) {
      const double phase = p.method == RecomputeMethod::kBlock ? phase_block : phase_uniform;
      allocated += held * noise.full_memory_error *
                   std::sin(phase + kPi * p.num_layers / static_cast<double>(layers));
      cost = e.recompute_flops / control.model_flops * (1 + full_cost_error);
    } else {
      for (Label l : p.labels) {
        allocated -= label_error[l] * LabelSavingBytes(spec, l);
        cost += LabelRecomputeFlops(spec, l) / control.model_flops * (1 + label_cost_error[l]) +
                ElementwiseCost(l);
      }
    }
    allocated *= 1 + Uniform(prng, 0.001);
    // Caching over allocated: independent per selective policy, smooth in N along a family.
    double caching = std::uniform_real_distribution<double>(0, noise.fragmentation)(prng);
    // The member's own stream past the same two draws: its steps (a representative's are as
    // before).
    Uniform(member_rng, 0.001);
    std::uniform_real_distribution<double>(0, noise.fragmentation)(member_rng);
    if (p.IsFull()) {
      const double phase = p.method == RecomputeMethod::kBlock ? caching_block : caching_uniform;
      caching = noise.fragmentation *
                (0.5 + 0.5 * std::sin(phase + kPi * p.num_layers / static_cast<double>(layers)));
    }
    const double grid = noise.reserved_grid_gib * 1024.0 * 1024.0 * 1024.0;
    const double reserved = std::ceil(allocated * (1 + caching) / grid) * grid;

    TrialResult r;
    r.policy = member;
    RankResult rank;
    if (reserved > budget) {
      r.status = TrialStatus::kOom;
      r.message = "synthetic: out of memory";
      rank.peak_reserved_bytes = budget;
      rank.peak_allocated_bytes = static_cast<uint64_t>(0.98 * budget);
    } else {
      r.status = TrialStatus::kOk;
      rank.peak_allocated_bytes = static_cast<uint64_t>(allocated);
      rank.peak_reserved_bytes = static_cast<uint64_t>(reserved);
      const double t = step_time_s * (1 + cost);
      // Another run of the table draws its steps from a stream of its own; draw 0 keeps the
      // table's stream, so tables with and without draws are the same.
      std::mt19937_64 redraw(
          Hash(seed * 1000003ull + static_cast<uint64_t>(draw), member.ToString()));
      std::mt19937_64& srng = draw > 0 ? redraw : member_rng;
      std::normal_distribution<double> jitter(0, noise.step_jitter);
      std::uniform_real_distribution<double> unit(0, 1);
      // At least noise.measure_steps, then as the adaptive rule measures (search/noise.h): the
      // first steps are the same draws whatever the rule, so tables with and without it differ
      // only in the steps measured beyond them.
      SearchOptions rule = spec.search;
      rule.measure_steps = noise.measure_steps;
      std::vector<double> steps;
      for (int i = 0; i < MeasureStepCap(rule); ++i) {
        double step = t * (1 + jitter(srng));
        if (unit(srng) < noise.outlier_step) step *= 1.3;
        steps.push_back(step);
      }
      rank.step_times_s = AdaptiveMeasuredSteps(steps, 0, rule);
      std::vector<double> sorted = rank.step_times_s;
      std::sort(sorted.begin(), sorted.end());
      rank.step_time_s = sorted[sorted.size() / 2];
      r.step_time_s = rank.step_time_s;
      r.step_time_spread_s = sorted.back() - sorted.front();
      r.tokens_per_s = TokensPerSecond(spec, r.step_time_s);
    }
    r.ranks.push_back(rank);
    table[member.ToString()] = std::move(r);
  }
  return table;
}

Draws SyntheticDraws(const SearchSpec& spec, double step_time_s, const Noise& noise,
                     uint64_t seed, int count) {
  Draws out;
  for (int d = 1; d <= count; ++d) {
    for (auto& [policy, r] : SyntheticTable(spec, step_time_s, noise, seed, d)) {
      if (r.status == TrialStatus::kOk) out[policy].push_back(std::move(r));
    }
  }
  return out;
}

std::vector<std::string> SurfaceNames() {
  return {"llama70b-unfused", "llama70b-flash", "dense48", "mixtral-like"};
}

std::optional<Surface> MakeSurface(const std::string& name) {
  Surface s;
  if (name == "llama70b-unfused") {
    s.spec = Llama70b(AttentionBackend::kUnfused);
    s.step_time_s = 9.0;
  } else if (name == "llama70b-flash") {
    s.spec = Llama70b(AttentionBackend::kFlash);
    s.step_time_s = 7.5;
  } else if (name == "dense48") {
    s.spec = Dense48();
    s.step_time_s = 3.0;
  } else if (name == "mixtral-like") {
    s.spec = MixtralLike();
    s.step_time_s = 1.2;
    // MoE step times scatter more (routing of random tokens; docs/results.md).
    s.noise.step_jitter = 0.03;
    s.noise.outlier_step = 0.05;
  } else {
    return std::nullopt;
  }
  return s;
}

namespace {

// The coordinator's re-measure round (search/remeasure.h), each policy served a different
// recorded measurement: its next draw, else an unmeasured class member's figure (see the header).
void RemeasureRound(const SearchSpec& spec, const Table& table, const Draws& draws,
                    std::vector<TrialResult>* guided, Outcome* o) {
  std::set<std::string> used;  // policies whose table figure the search has seen
  for (const TrialResult& r : *guided) used.insert(r.policy.ToString());
  std::map<std::string, size_t> next_draw;
  std::vector<TrialResult> served;
  for (const Remeasure& pick : RemeasureCandidates(spec, *guided)) {
    const std::string key = pick.policy.ToString();
    const TrialResult* source = nullptr;
    std::string from;
    auto d = draws.find(key);
    if (d != draws.end() && next_draw[key] < d->second.size()) {
      source = &d->second[next_draw[key]++];
      from = "its next recorded run";
    } else {
      const Policy cls = EquivalenceClassOf(spec, pick.policy).representative;
      for (const auto& [member, r] : table) {
        if (used.count(member) || r.status != TrialStatus::kOk) continue;
        auto parsed = ParsePolicy(member);
        if (!parsed.ok() || !(EquivalenceClassOf(spec, *parsed).representative == cls)) continue;
        used.insert(member);
        source = &r;
        from = "class member " + member;
        break;
      }
    }
    if (source == nullptr) {
      ++o->remeasures_without_draw;
      continue;
    }
    TrialResult r = *source;
    r.policy = pick.policy;
    r.tokens_per_s = TokensPerSecond(spec, r.step_time_s);
    r.step_time_low_s = r.step_time_high_s = 0;
    FillStepTimeInterval(spec.search, &r);
    served.push_back(std::move(r));
    o->order.push_back(key + "(re-measure: " + from + ")");
    ++o->remeasures;
  }
  for (auto& r : served) guided->push_back(std::move(r));
}

}  // namespace

Outcome Replay(const SearchSpec& spec, const Table& table, const Draws& draws) {
  auto answer = [&](const Policy& p) {
    auto it = table.find(p.ToString());
    if (it != table.end()) {
      TrialResult r = it->second;
      r.policy = p;
      r.tokens_per_s = TokensPerSecond(spec, r.step_time_s);
      FillStepTimeInterval(spec.search, &r);  // as the replay backend does
      return r;
    }
    TrialResult r;
    r.policy = p;
    r.status = TrialStatus::kFailed;
    r.message = "not in replay table";
    return r;
  };
  Outcome o;
  auto strategy = MakeGuidedStrategy(spec);
  std::vector<TrialResult> guided;
  // Everything the strategy proposes until it is done, each answered before the next proposal.
  auto run_strategy = [&](const std::string& mark) {
    for (int guard = 0; guard < 1000 && !strategy->Done(); ++guard) {
      const auto batch = strategy->Propose(1);
      if (batch.empty()) break;
      for (const auto& c : batch) {
        guided.push_back(answer(c.policy));
        o.order.push_back(c.policy.ToString() + mark);
        strategy->Observe(guided.back());
      }
    }
  };
  run_strategy("");
  const size_t before_round = guided.size();
  RemeasureRound(spec, table, draws, &guided, &o);
  if (guided.size() > before_round) {
    // As the coordinator does once every re-measure is in (server/search_run.cc): the strategy
    // takes the pooled runs, and may go on.
    std::set<std::string> again;
    for (size_t i = before_round; i < guided.size(); ++i) {
      again.insert(guided[i].policy.ToString());
    }
    std::vector<TrialResult> pooled;
    for (TrialResult& r : CombineRemeasured(spec, guided)) {
      if (again.count(r.policy.ToString())) pooled.push_back(std::move(r));
    }
    strategy->ObserveRemeasured(pooled);
    run_strategy("(after the re-measures)");
  }
  o.notes = strategy->Notes();
  for (const TrialResult& r : guided) {
    if (r.status != TrialStatus::kOk) continue;
    o.measured_steps += r.measured_steps;
    o.ok_trials += 1;
    if (r.PeakBytes(spec.search.memory_metric) > spec.search.MemoryBudgetBytes()) {
      ++o.over_budget_trials;
    }
  }
  for (const TrialResult& r : guided) {
    if (r.status == TrialStatus::kOom) ++o.over_budget_trials;
  }
  std::vector<TrialResult> all;
  for (const auto& p : EnumerateValidPolicies(spec)) all.push_back(answer(p));
  const uint64_t budget = spec.search.MemoryBudgetBytes();
  const auto fe = ComputeFrontier(all, spec.search.memory_metric, budget);
  const std::vector<TrialResult> guided_pooled = CombineRemeasured(spec, guided);
  const auto fg = ComputeFrontier(guided_pooled, spec.search.memory_metric, budget);
  double t_min = 0;
  for (const auto& p : fe) t_min = t_min == 0 ? p.tokens_per_s : std::min(t_min, p.tokens_per_s);
  o.guided_frontier = fg;
  o.exhaustive_frontier = fe;
  o.guided_trials = guided.size() - o.remeasures;
  o.exhaustive_trials = all.size();
  const double hv_e = Hypervolume(fe, budget, 0.9 * t_min);
  o.hypervolume_ratio = hv_e > 0 ? Hypervolume(fg, budget, 0.9 * t_min) / hv_e : 1;
  // The exhaustive table with each class's members pooled into its representative.
  // Every recorded measurement of the class: the table's members and their further draws.
  std::vector<TrialResult> by_class = all;
  for (const auto& [policy, runs] : draws) {
    auto parsed = ParsePolicy(policy);
    if (!parsed.ok()) continue;
    for (TrialResult r : runs) {
      r.policy = *parsed;
      r.tokens_per_s = TokensPerSecond(spec, r.step_time_s);
      by_class.push_back(std::move(r));
    }
  }
  for (auto& r : by_class) r.policy = EquivalenceClassOf(spec, r.policy).representative;
  const auto pooled = CombineRemeasured(spec, by_class);
  o.exhaustive_classes = pooled.size();
  const auto fp = ComputeFrontier(pooled, spec.search.memory_metric, budget);
  double tp_min = 0;
  for (const auto& p : fp) tp_min = tp_min == 0 ? p.tokens_per_s : std::min(tp_min, p.tokens_per_s);
  const double hv_p = Hypervolume(fp, budget, 0.9 * tp_min);
  o.pooled_hypervolume_ratio = hv_p > 0 ? Hypervolume(fg, budget, 0.9 * tp_min) / hv_p : 1;
  // A policy at its class's pooled figure, when that ran and fits the budget.
  std::map<std::string, const TrialResult*> by_representative;
  for (const TrialResult& r : pooled) by_representative[r.policy.ToString()] = &r;
  auto pooled_point = [&](const Policy& policy) -> std::optional<FrontierPoint> {
    const auto it =
        by_representative.find(EquivalenceClassOf(spec, policy).representative.ToString());
    if (it == by_representative.end() || it->second->status != TrialStatus::kOk) return {};
    const uint64_t memory = it->second->PeakBytes(spec.search.memory_metric);
    if (memory > budget) return {};
    return FrontierPoint{policy, memory, it->second->tokens_per_s};
  };
  std::vector<FrontierPoint> delivered;
  for (const FrontierPoint& f : fg) {
    if (auto point = pooled_point(f.policy)) delivered.push_back(*point);
  }
  o.delivered_hypervolume_ratio =
      hv_p > 0 ? Hypervolume(ParetoFrontier(delivered), budget, 0.9 * tp_min) / hv_p : 1;
  if (hv_p > 0) {
    o.goal_trials = static_cast<size_t>(GoalShare(all.size()) * all.size());
    o.best_pooled_at_goal = BestHypervolumeOf(fp, o.goal_trials, budget, 0.9 * tp_min) / hv_p;
    std::vector<FrontierPoint> plan;
    for (const Candidate& c : InitialPlan(spec)) {
      ++o.plan_trials;
      if (auto point = pooled_point(c.policy)) plan.push_back(*point);
    }
    const size_t rest = o.goal_trials > o.plan_trials ? o.goal_trials - o.plan_trials : 0;
    o.best_pooled_at_goal_after_plan =
        BestHypervolumeOf(fp, rest, budget, 0.9 * tp_min, plan) / hv_p;
  }
  for (size_t k = 1; k <= o.order.size() && hv_p > 0; ++k) {
    std::vector<TrialResult> first(guided.begin(), guided.begin() + k);
    const auto fk = ComputeFrontier(CombineRemeasured(spec, first), spec.search.memory_metric,
                                    budget);
    o.pooled_by_trials.push_back(Hypervolume(fk, budget, 0.9 * tp_min) / hv_p);
  }
  o.guided = RecommendPolicy(spec, guided_pooled);
  o.exhaustive = RecommendPolicy(spec, all);
  {
    const uint64_t fit = spec.search.RecommendBudgetBytes();
    double best = 0, chosen = 0;
    const Policy choice = o.guided ? EquivalenceClassOf(spec, o.guided->choice.policy).representative
                                   : Policy::None();
    for (const auto& r : pooled) {
      if (r.status != TrialStatus::kOk || r.ranks.empty() ||
          r.PeakBytes(spec.search.memory_metric) > fit) {
        continue;
      }
      best = std::max(best, r.tokens_per_s);
      if (o.guided && r.policy == choice) chosen = r.tokens_per_s;
    }
    o.recommendation_throughput_ratio = best > 0 ? chosen / best : (o.guided ? 0 : 1);
    const Policy ex = o.exhaustive
                          ? EquivalenceClassOf(spec, o.exhaustive->choice.policy).representative
                          : Policy::None();
    double ex_t = 0;
    for (const auto& r : pooled) {
      if (o.exhaustive && r.policy == ex) ex_t = r.tokens_per_s;
    }
    o.exhaustive_throughput_ratio = best > 0 ? ex_t / best : (o.exhaustive ? 0 : 1);
  }
  if (!o.guided || !o.exhaustive) {
    o.recommendation_matches = !o.guided && !o.exhaustive;
  } else {
    for (const auto& c : o.exhaustive->tied) {
      if (c.policy == o.guided->choice.policy) o.recommendation_matches = true;
    }
  }
  return o;
}

Deal Redeal(const Table& table, const Draws& draws, uint64_t seed) {
  Deal out{table, draws};
  if (seed == 0) return out;
  for (auto& [policy, runs] : out.draws) {
    auto it = out.table.find(policy);
    if (it == out.table.end() || runs.empty()) continue;
    // Run 0 is the table's; 1..n its draws. The chosen one moves to the table, the others keep
    // their order.
    std::vector<TrialResult> all{it->second};
    all.insert(all.end(), runs.begin(), runs.end());
    // FNV-1a's low bits follow the seed's (an odd multiplier keeps bit 0): mixed first.
    const size_t pick = Mix(Hash(seed, policy)) % all.size();
    it->second = all[pick];
    runs.clear();
    for (size_t i = 0; i < all.size(); ++i) {
      if (i != pick) runs.push_back(all[i]);
    }
  }
  return out;
}

bool HasFurtherRunOfEach(const Table& table, const Draws& draws) {
  bool any = false;
  for (const auto& [policy, r] : table) {
    if (r.status != TrialStatus::kOk) continue;
    auto it = draws.find(policy);
    if (it == draws.end() || it->second.empty()) return false;
    any = true;
  }
  return any;
}

// An exact dynamic programme over the points by memory: the area a chosen point adds runs from
// its memory to the next chosen point's (or the budget), at its throughput. That is Hypervolume's
// sweep when each chosen point is faster than the ones before it; a chosen point that is not
// (a forced one may be dominated) is counted low, and the best choice leaves it out: it adds
// nothing, and a forced point costs nothing to leave out either.
double BestHypervolumeOf(const std::vector<FrontierPoint>& frontier, size_t k, uint64_t budget,
                         double t_ref, const std::vector<FrontierPoint>& forced) {
  struct Item {
    uint64_t memory;
    double height;  // throughput over t_ref
    size_t cost;    // 1 for a frontier point, 0 for a forced one
  };
  std::vector<Item> items;
  for (const auto* set : {&frontier, &forced}) {
    for (const FrontierPoint& p : *set) {
      if (p.memory_bytes > budget || !(p.tokens_per_s > t_ref)) continue;
      items.push_back({p.memory_bytes, p.tokens_per_s - t_ref, set == &forced ? 0u : 1u});
    }
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.memory < b.memory; });
  const size_t n = items.size();
  // area[c * n + i]: the largest area from the first chosen point's memory to item i's, with i
  // chosen last and c free points used.
  constexpr double kUnreached = -1;
  std::vector<double> area((k + 1) * n, kUnreached);
  for (size_t i = 0; i < n; ++i) {
    if (items[i].cost <= k) area[items[i].cost * n + i] = 0;
  }
  double best = 0;
  for (size_t i = 0; i < n; ++i) {
    for (size_t c = 0; c <= k; ++c) {
      const double so_far = area[c * n + i];
      if (so_far == kUnreached) continue;
      best = std::max(best,
                      so_far + (static_cast<double>(budget) - items[i].memory) * items[i].height);
      for (size_t j = i + 1; j < n; ++j) {
        if (c + items[j].cost > k) continue;
        double& next = area[(c + items[j].cost) * n + j];
        next = std::max(next, so_far + static_cast<double>(items[j].memory - items[i].memory) *
                                           items[i].height);
      }
    }
  }
  return best;
}

std::string Describe(const std::string& name, const Outcome& o, bool frontiers) {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "%s: guided %zu trials of %zu (%.1f%%; %zu classes; with its re-measures %.1f%%); "
                "hypervolume %.4f, pooled "
                "%.4f; recommendation %s at %.3f of the best fitting (exhaustive %s, %zu tied): %s",
                name.c_str(), o.guided_trials, o.exhaustive_trials,
                100.0 * o.guided_trials / std::max<size_t>(1, o.exhaustive_trials),
                o.exhaustive_classes,
                100.0 * (o.guided_trials + o.remeasures) / std::max<size_t>(1, o.exhaustive_trials),
                o.hypervolume_ratio, o.pooled_hypervolume_ratio,
                o.guided ? o.guided->choice.policy.ToString().c_str() : "none",
                o.recommendation_throughput_ratio,
                o.exhaustive ? o.exhaustive->choice.policy.ToString().c_str() : "none",
                o.exhaustive ? o.exhaustive->tied.size() : size_t{0},
                o.recommendation_matches ? "within noise" : "MISSED");
  std::string out = buf;
  std::snprintf(buf, sizeof(buf),
                "; %zu re-measured (%zu more had no other recorded draw); %zu over the budget; "
                "%.1f measured steps per ok trial",
                o.remeasures, o.remeasures_without_draw, o.over_budget_trials,
                o.ok_trials ? static_cast<double>(o.measured_steps) / o.ok_trials : 0.0);
  out += buf;
  std::snprintf(buf, sizeof(buf),
                "; the exhaustive recommendation at %.3f of the best fitting; its frontier's "
                "policies at their pooled figures %.4f",
                o.exhaustive_throughput_ratio, o.delivered_hypervolume_ratio);
  out += buf;
  if (o.goal_trials > 0) {
    const size_t k = std::min(o.goal_trials, o.pooled_by_trials.size());
    std::snprintf(buf, sizeof(buf),
                  "; pooled %.4f after the first %zu measurements, the most any %zu trials reach "
                  "%.4f (%.4f beginning with the plan's %zu)",
                  k > 0 ? o.pooled_by_trials[k - 1] : 0.0, k, o.goal_trials, o.best_pooled_at_goal,
                  o.best_pooled_at_goal_after_plan, o.plan_trials);
    out += buf;
  }
  if (!o.notes.empty()) out += "\n  " + o.notes;
  out += "\n  order:";
  for (size_t i = 0; i < o.order.size(); ++i) {
    out += " " + o.order[i];
    if (i < o.pooled_by_trials.size()) {
      std::snprintf(buf, sizeof(buf), "{%.3f}", o.pooled_by_trials[i]);
      out += buf;
    }
  }
  if (frontiers) {
    for (const auto* f : {&o.exhaustive_frontier, &o.guided_frontier}) {
      out += f == &o.guided_frontier ? "\n  guided frontier:" : "\n  exhaustive frontier:";
      for (const auto& p : *f) {
        std::snprintf(buf, sizeof(buf), " %s %.2fGiB %.0f", p.policy.ToString().c_str(),
                      p.memory_bytes / 1073741824.0, p.tokens_per_s);
        out += buf;
      }
    }
  }
  return out;
}

}  // namespace remat::search::replay
