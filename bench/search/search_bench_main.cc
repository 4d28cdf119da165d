// remat-search-bench: how many trials the guided search needs on large surfaces, and what it
// keeps of the exhaustive search's frontier and recommendation (step 4).
//
//   remat-search-bench [--seeds N] [--first-seed S] [--source DIR] [--frontiers] [--noise-target X]
//                      [--label-costs] [--redeals K]
//
// --first-seed S runs seeds S..S+N-1 of each synthetic surface (default 1): the defaults were
// chosen on seeds 1-5, so `--first-seed 6 --seeds 15` gives held-out figures.
// --noise-target X sets search.noise_target for every surface and table (0: every synthetic
// trial measures exactly its 5 steps, as before adaptive measurement; the default is each spec's).
// --redeals K (default 50; 0: none): each measured table that holds a further run of every ok
// policy (h200-MODEL-rN-redraws-1.json) is dealt again K times from its runs (each policy's table
// figure one of its runs at random, the others its draws: replay::Redeal) and the frontier search
// replayed on every deal; one line says in how many deals each goal is met, with the median and
// the worst figure, beside the exhaustive recommendation's. One recorded table is one draw of its
// noise; the deals are the draws the same machine could as well have given.
// --label-costs (with --source) prints, instead of the replays, what each H200 table measures of
// each label's replay against the step-cost model (search/predict.h StepCost): over every pair of
// ok selective policies that differ by that label alone (and where the model charges it
// something: not moe_act or shared_experts beside moe, which replays them already), the median
// measured charge (the step time with it over the step time without, less 1) and the median
// modelled one, and their ratio.
//
// For each synthetic surface (tests/search/replay_surfaces.h: 70B-class and other large
// models, every valid policy "measured" by the model with realistic errors and step-time noise)
// and N seeds of its noise, and for the measured H200 tables under DIR/docs/results when --source
// names the repository, it replays the guided search with both objectives and prints the trials
// used, the share of the exhaustive trials, the hypervolume ratio (frontier objective) and
// whether the recommendation is the exhaustive one within noise; then the same against the
// exhaustive table with each equivalence class's members pooled (search/equivalence.h): the
// hypervolume ratio and the recommendation's throughput over the best that fits. Beside them,
// what tells a search's miss from the table's: the exhaustive recommendation's throughput on
// the same scale (the recommendation rule given every policy measured once), the pooled ratio
// after the goal's share of the policies (25%, 15% of 150 or more) and the most any that many
// trials could reach (replay::BestHypervolumeOf), alone and beginning with the initial plan's
// trials (what a search that walks the plan can still reach), and after each trial of the order
// {in braces}. After the recorded tables, every goal they miss, each with what it owes to
// (Ledger). The mla-moe16 tables (measured with every policy running) are replayed at 46, 58
// (the spec's) and 68 GiB: the low end of their frontier, the middle, and all but the control's
// end. docs/results.md records them.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <regex>
#include <string>
#include <vector>

#include "search/memory_model.h"
#include "search/predict.h"
#include "search/rules.h"
#include "specfile/spec_file.h"
#include "tests/search/replay_surfaces.h"

namespace {

using remat::search::Objective;
using remat::search::SearchSpec;
namespace replay = remat::search::replay;

bool g_frontiers = false;
bool g_label_costs = false;
double g_noise_target = -1;  // --noise-target: overrides every spec's search.noise_target
int g_redeals = 50;          // --redeals: deals of each table with a further run of every policy

// --label-costs: one line per label of `table` that some pair of its policies differs by, as the
// search's predictions learn it from their own pairs (Predictor::LabelChargeScales), here over
// every ok selective policy of the table; the ratio unbounded.
void PrintLabelCosts(const std::string& name, const SearchSpec& spec, const replay::Table& table) {
  remat::search::Predictor predictor(spec);
  std::map<std::string, remat::search::TrialResult> measured;
  for (const auto& [k, r] : table) {
    if (r.status != remat::search::TrialStatus::kOk || r.policy.IsFull() || !(r.step_time_s > 0)) {
      continue;
    }
    measured[k] = r;
    measured[k].tokens_per_s = remat::search::TokensPerSecond(spec, r.step_time_s);
  }
  for (const auto& [label, s] : predictor.LabelChargeScales(measured)) {
    std::printf("[label-cost] %-40s %-15s pairs %3d  measured %6.2f%%  model %6.2f%%  ratio %.2f\n",
                name.c_str(), remat::search::LabelName(label), s.pairs, 100 * s.measured,
                100 * s.modelled, s.measured / s.modelled);
  }
}

struct Tally {
  int runs = 0, matches = 0;
  // Worst ratios start above any ratio: a guided frontier can beat the pooled exhaustive one
  // (its single draws are luckier than the pooled steps), and a ratio over 1 is then its worst.
  double worst_share = 0, worst_hv = 1e9, sum_share = 0, sum_hv = 0;
  double worst_with_remeasures = 0, sum_with_remeasures = 0;  // trials and re-measures
  double worst_pooled_hv = 1e9, sum_pooled_hv = 0, worst_rec = 1e9;  // pooled classes
};

// The goals on the recorded tables, the frontier objective's replay of each: every check, and
// each miss with what it owes to. A trial share is out of reach for a search that walks the
// initial plan where the plan's trials and the rest of the goal's reach under the hypervolume goal
// at best (Outcome::best_pooled_at_goal_after_plan); a recommendation is the rule's where the rule
// given every policy measured once misses as well (Outcome::exhaustive_throughput_ratio); the
// rest are the search's. The hypervolume by the pooled reading (the search's own draws); the
// delivered reading (its frontier's policies at their pooled figures) is counted beside it.
struct Ledger {
  int replays = 0, checks = 0, after_plan = 0, rule = 0, search = 0, delivered = 0;
  std::vector<std::string> misses;
  void Add(const std::string& name, const replay::Outcome& o) {
    char buf[320];
    ++replays;
    checks += 3;
    auto miss = [&](int* cause, const char* fmt, auto... args) {
      ++*cause;
      std::snprintf(buf, sizeof(buf), fmt, args...);
      misses.push_back(name + " " + buf);
    };
    const size_t policies = o.exhaustive_trials;
    if (static_cast<double>(o.guided_trials) > replay::GoalShare(policies) * policies + 1e-9) {
      if (o.best_pooled_at_goal_after_plan < replay::kTableHypervolumeGoal) {
        miss(&after_plan,
             "trials: %zu of %zu, goal %zu: out of reach after the plan (its %zu trials and the "
             "rest reach %.4f at most; any %zu: %.4f)",
             o.guided_trials, policies, o.goal_trials, o.plan_trials,
             o.best_pooled_at_goal_after_plan, o.goal_trials, o.best_pooled_at_goal);
      } else {
        const size_t k = std::min(o.goal_trials, o.pooled_by_trials.size());
        miss(&search,
             "trials: %zu of %zu, goal %zu: the search's (pooled %.4f after its first %zu)",
             o.guided_trials, policies, o.goal_trials, k > 0 ? o.pooled_by_trials[k - 1] : 0.0, k);
      }
    }
    if (o.pooled_hypervolume_ratio < replay::kTableHypervolumeGoal) {
      miss(&search, "hypervolume: %.4f (delivered %.4f): the search's", o.pooled_hypervolume_ratio,
           o.delivered_hypervolume_ratio);
    } else if (o.delivered_hypervolume_ratio < replay::kTableHypervolumeGoal) {
      miss(&delivered, "hypervolume delivered: %.4f (pooled %.4f: met by that reading)",
           o.delivered_hypervolume_ratio, o.pooled_hypervolume_ratio);
    }
    if (o.recommendation_throughput_ratio < replay::kRecommendationGoal) {
      if (o.exhaustive_throughput_ratio < replay::kRecommendationGoal) {
        miss(&rule, "recommendation: %.3f: the rule's (given every policy measured once: %.3f)",
             o.recommendation_throughput_ratio, o.exhaustive_throughput_ratio);
      } else {
        miss(&search, "recommendation: %.3f: the search's (the rule given every policy: %.3f)",
             o.recommendation_throughput_ratio, o.exhaustive_throughput_ratio);
      }
    }
  }
  void Print() const {
    if (replays == 0) return;
    for (const std::string& m : misses) std::printf("[miss] %s\n", m.c_str());
    std::printf(
        "goals on the recorded tables: %d replays, %d checks, %d missed: %d out of reach after "
        "the plan, %d the recommendation rule's, %d the search's; by the delivered reading of "
        "the hypervolume %d more\n",
        replays, checks, after_plan + rule + search, after_plan, rule, search, delivered);
  }
};

void Run(const std::string& name, SearchSpec spec, const replay::Table& table,
         const replay::Draws& draws, Tally* frontier, Tally* recommend, Ledger* ledger = nullptr) {
  if (g_noise_target >= 0) spec.search.noise_target = g_noise_target;
  for (Objective obj : {Objective::kFrontier, Objective::kRecommend}) {
    spec.search.objective = obj;
    spec.search.max_trials = 1000;  // the bench measures what the strategy asks for
    const replay::Outcome o = replay::Replay(spec, table, draws);
    Tally* t = obj == Objective::kFrontier ? frontier : recommend;
    const double share = static_cast<double>(o.guided_trials) / o.exhaustive_trials;
    ++t->runs;
    t->matches += o.recommendation_matches ? 1 : 0;
    t->worst_share = std::max(t->worst_share, share);
    t->worst_hv = std::min(t->worst_hv, o.hypervolume_ratio);
    t->sum_share += share;
    const double with = static_cast<double>(o.guided_trials + o.remeasures) / o.exhaustive_trials;
    t->worst_with_remeasures = std::max(t->worst_with_remeasures, with);
    t->sum_with_remeasures += with;
    t->sum_hv += o.hypervolume_ratio;
    t->worst_pooled_hv = std::min(t->worst_pooled_hv, o.pooled_hypervolume_ratio);
    t->sum_pooled_hv += o.pooled_hypervolume_ratio;
    t->worst_rec = std::min(t->worst_rec, o.recommendation_throughput_ratio);
    std::printf("[%s] %s\n", remat::search::Name(obj),
                replay::Describe(name, o, g_frontiers).c_str());
    if (ledger != nullptr && obj == Objective::kFrontier) ledger->Add(name, o);
  }
}

void Summary(const char* what, const Tally& f, const Tally& r) {
  if (f.runs == 0) return;
  std::printf(
      "%s: frontier: trials mean %.1f%% worst %.1f%% (with re-measures mean %.1f%% worst "
      "%.1f%%), hypervolume mean %.4f worst %.4f, "
      "pooled mean %.4f worst %.4f, recommendation within noise %d/%d, worst %.3f of the best "
      "fitting | recommend: trials mean %.1f%% worst %.1f%%, recommendation within noise %d/%d, "
      "worst %.3f of the best fitting\n",
      what, 100 * f.sum_share / f.runs, 100 * f.worst_share, 100 * f.sum_with_remeasures / f.runs,
      100 * f.worst_with_remeasures, f.sum_hv / f.runs, f.worst_hv,
      f.sum_pooled_hv / f.runs, f.worst_pooled_hv, f.matches, f.runs, f.worst_rec,
      100 * r.sum_share / r.runs, 100 * r.worst_share, r.matches, r.runs, r.worst_rec);
}

// The fraction of `v` at least `goal` (at most, with `at_most`), its median and its worst.
std::string Share(std::vector<double> v, double goal, bool at_most, const char* fmt) {
  std::sort(v.begin(), v.end());
  size_t met = 0;
  for (double x : v) met += at_most ? x <= goal + 1e-12 : x >= goal - 1e-12;
  char a[32], b[32], buf[160];
  std::snprintf(a, sizeof(a), fmt, v[v.size() / 2]);
  std::snprintf(b, sizeof(b), fmt, at_most ? v.back() : v.front());
  std::snprintf(buf, sizeof(buf), "%zu/%zu (median %s, worst %s)", met, v.size(), a, b);
  return buf;
}

// --redeals K: the table dealt K more times from its recorded runs (replay::Redeal), the frontier
// objective replayed on each; how often each goal is met, beside how often the recommendation rule
// given every policy measured once (the exhaustive search's) meets its goal.
void Redeals(const std::string& label, SearchSpec spec, const replay::Table& table,
             const replay::Draws& draws) {
  spec.search.objective = Objective::kFrontier;
  spec.search.max_trials = 1000;
  std::vector<double> share, hv, delivered, rec, exhaustive_rec;
  for (int seed = 1; seed <= g_redeals; ++seed) {
    const replay::Deal deal = replay::Redeal(table, draws, static_cast<uint64_t>(seed));
    const replay::Outcome o = replay::Replay(spec, deal.table, deal.draws);
    share.push_back(static_cast<double>(o.guided_trials) / o.exhaustive_trials);
    hv.push_back(o.pooled_hypervolume_ratio);
    delivered.push_back(o.delivered_hypervolume_ratio);
    rec.push_back(o.recommendation_throughput_ratio);
    exhaustive_rec.push_back(o.exhaustive_throughput_ratio);
  }
  const double goal_share = replay::GoalShare(table.size());
  std::printf(
      "%s dealt again %d times from its runs: trials within %.0f%% in %s; pooled hypervolume "
      ">= %.2f in %s (its frontier's policies at their pooled figures: %s); recommendation >= "
      "%.2f of the best in %s (the exhaustive rule's: %s)\n",
      label.c_str(), g_redeals, 100 * goal_share, Share(share, goal_share, true, "%.3f").c_str(),
      replay::kTableHypervolumeGoal,
      Share(hv, replay::kTableHypervolumeGoal, false, "%.3f").c_str(),
      Share(delivered, replay::kTableHypervolumeGoal, false, "%.3f").c_str(),
      replay::kRecommendationGoal, Share(rec, replay::kRecommendationGoal, false, "%.3f").c_str(),
      Share(exhaustive_rec, replay::kRecommendationGoal, false, "%.3f").c_str());
}

}  // namespace

int main(int argc, char** argv) {
  int seeds = 5, first_seed = 1;
  std::string source;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seeds") && i + 1 < argc) {
      seeds = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--first-seed") && i + 1 < argc) {
      first_seed = std::atoi(argv[++i]);
    } else if (!std::strcmp(argv[i], "--frontiers")) {
      g_frontiers = true;
    } else if (!std::strcmp(argv[i], "--redeals") && i + 1 < argc) {
      g_redeals = std::atoi(argv[++i]);
      if (g_redeals < 0) {
        std::fprintf(stderr, "error: --redeals: must be 0 or a positive integer\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--label-costs")) {
      g_label_costs = true;
    } else if (!std::strcmp(argv[i], "--source") && i + 1 < argc) {
      source = argv[++i];
    } else if (!std::strcmp(argv[i], "--noise-target") && i + 1 < argc) {
      g_noise_target = std::atof(argv[++i]);
      if (!(g_noise_target >= 0 && g_noise_target < 1)) {
        std::fprintf(stderr, "error: --noise-target: must be 0 or a fraction below 1\n");
        return 2;
      }
    } else {
      std::fprintf(stderr,
                   "error: %s: unknown argument (usage: remat-search-bench [--seeds N] "
                   "[--first-seed S] [--source REPO_DIR] [--frontiers] [--noise-target X] "
                   "[--label-costs] [--redeals K])\n",
                   argv[i]);
      return 2;
    }
  }
  if (seeds < 1) {
    std::fprintf(stderr, "error: --seeds: must be a positive integer\n");
    return 2;
  }
  if (first_seed < 1) {
    std::fprintf(stderr, "error: --first-seed: must be a positive integer\n");
    return 2;
  }
  if (g_label_costs && source.empty()) {
    std::fprintf(stderr, "error: --label-costs: needs --source REPO_DIR (the H200 tables)\n");
    return 2;
  }
  for (const std::string& name : g_label_costs ? std::vector<std::string>{}
                                                : replay::SurfaceNames()) {
    auto surface = replay::MakeSurface(name);
    if (g_noise_target >= 0) surface->spec.search.noise_target = g_noise_target;
    const SearchSpec& spec = surface->spec;
    const auto control = remat::search::EstimateMemory(spec, remat::search::Policy::None());
    std::printf(
        "== %s: %zu valid policies, budget %.0f GiB, model control peak %.1f GiB, "
        "static %.1f GiB\n",
        name.c_str(), remat::search::EnumerateValidPolicies(spec).size(),
        spec.search.memory_budget_gib, control.peak_bytes / (1 << 30),
        control.static_bytes / (1 << 30));
    Tally f, r;
    for (int seed = first_seed; seed < first_seed + seeds; ++seed) {
      const auto table = replay::SyntheticTable(spec, surface->step_time_s, surface->noise, seed);
      // One more run of every policy: what the re-measure round is served (one round, each
      // policy at most once).
      const auto draws =
          replay::SyntheticDraws(spec, surface->step_time_s, surface->noise, seed, 1);
      Run(name + " seed " + std::to_string(seed), spec, table, draws, &f, &r);
    }
    Summary(name.c_str(), f, r);
  }
  if (!source.empty()) {
    // Every measured table under docs/results: h200-MODEL-exhaustive-table[-rN].json, replayed
    // with examples/replay/h200-MODEL.yaml (a table added there is scored without a change here).
    struct TableFile {
      std::string file, model, run;  // run: "" or "-rN"
    };
    std::vector<TableFile> tables;
    const std::regex pattern(R"(h200-([a-z0-9-]+?)-exhaustive-table(-r[0-9]+)?\.json)");
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(source + "/docs/results", ec)) {
      std::smatch m;
      const std::string file = f.path().filename().string();
      if (std::regex_match(file, m, pattern)) tables.push_back({file, m[1].str(), m[2].str()});
    }
    std::sort(tables.begin(), tables.end(),
              [](const TableFile& a, const TableFile& b) { return a.file < b.file; });
    if (ec || tables.empty()) {
      std::fprintf(stderr, "error: --source: no H200 tables under %s/docs/results\n",
                   source.c_str());
      return 2;
    }
    Ledger ledger;
    for (const auto& [file, model, run] : tables) {
      const std::string name = file.substr(0, file.size() - 5);  // less ".json"
      auto spec = remat::spec::LoadSpecFile(source + "/examples/replay/h200-" + model + ".yaml");
      auto table = remat::spec::LoadReplayTableFile(source + "/docs/results/" + file);
      if (!spec.ok() || !table.ok()) {
        std::fprintf(stderr,
                     "error: --source: cannot read %s or examples/replay/h200-%s.yaml: %s\n",
                     file.c_str(), model.c_str(),
                     (!spec.ok() ? spec.status() : table.status()).message().c_str());
        return 2;
      }
      replay::Table t;
      for (const auto& [k, entry] : *table) t[k] = entry.result;
      if (g_label_costs) {
        PrintLabelCosts(name, *spec, t);
        continue;
      }
      // Further recorded runs of the table's policies, when the table has them:
      // h200-MODEL[-rN]-redraws-K.json, K = 1, 2, ... (bench/search/redraws.py writes them from
      // the trials' JSON lines), measured on the machine that measured the table, beside it: a
      // table measured another day (another machine start, perhaps another way) does not borrow
      // another's runs.
      replay::Draws draws;
      for (int n = 1;; ++n) {
        const std::string path = source + "/docs/results/h200-" + model + run + "-redraws-" +
                                 std::to_string(n) + ".json";
        if (!std::filesystem::exists(path)) break;
        auto more = remat::spec::LoadReplayTableFile(path);
        if (!more.ok()) {
          std::fprintf(stderr, "error: --source: cannot read %s: %s\n", path.c_str(),
                       more.status().message().c_str());
          return 2;
        }
        for (const auto& [k, entry] : *more) draws[k].push_back(entry.result);
      }
      // A table measured with a budget above its control's peak (every policy ran) is replayed at
      // budgets across its frontier as well: its frontier and the search's choices differ with
      // each. The spec's own budget is one of them.
      std::vector<double> budgets = {spec->search.memory_budget_gib};
      if (model == "mla-moe16") budgets = {46, spec->search.memory_budget_gib, 68};
      for (double gib : budgets) {
        SearchSpec at = *spec;
        at.search.memory_budget_gib = gib;
        const std::string label =
            budgets.size() > 1 ? name + " @" + std::to_string(static_cast<int>(gib)) + "GiB" : name;
        Tally f, r;
        Run(label, at, t, draws, &f, &r, &ledger);
        Summary(label.c_str(), f, r);
        if (g_redeals > 0 && replay::HasFurtherRunOfEach(t, draws)) {
          Redeals(label, at, t, draws);
        }
      }
    }
    ledger.Print();
  }
  return 0;
}
