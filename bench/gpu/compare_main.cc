// remat-compare: search efficiency of a guided search against the exhaustive one.
//
//   remat-compare GUIDED.json EXHAUSTIVE.json
//
// Reads two result JSONs (`remat get ID --json` / `remat search --json`) of the same model and
// prints trials, GPU-seconds (the sum of trial wall times; a trial reused from the results cache
// keeps the wall time of the run that measured it, so it is charged what it cost then) and the hypervolume of the guided frontier as a fraction
// of the exhaustive one, per the contract: area within memory <= budget and throughput >= t_ref,
// t_ref = 0.9 x the lowest throughput on the exhaustive frontier.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>

#include "search/frontier.h"
#include "search/policy.h"

namespace {

using remat::search::TrialResult;

struct Run {
  std::vector<TrialResult> trials;
  double wall_s = 0;  // sum over trials; a reused trial's wall_s is what it cost when it ran
  remat::search::MemoryMetric metric = remat::search::MemoryMetric::kReserved;
  uint64_t budget = 0;
};

// A figure the result JSON may give as null (not measured:), read as 0.
template <typename T>
T Figure(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  return it == j.end() || it->is_null() ? T{} : it->get<T>();
}

bool Load(const char* path, Run* run) {
  std::ifstream in(path);
  if (!in) return false;
  nlohmann::json j = nlohmann::json::parse(in);
  run->budget = j.at("memory_budget_bytes").get<uint64_t>();
  if (j.value("memory_metric", "reserved") == "allocated") {
    run->metric = remat::search::MemoryMetric::kAllocated;
  }
  for (const auto& t : j.at("trials")) {
    auto policy = remat::search::ParsePolicy(t.at("policy").get<std::string>());
    auto status = remat::search::ParseTrialStatus(t.at("status").get<std::string>());
    if (!policy.ok() || !status) continue;  // pending or unparsable: not a measurement
    TrialResult r;
    r.policy = *policy;
    r.status = *status;
    r.tokens_per_s = Figure<double>(t, "tokens_per_s");
    for (const auto& rk : t.at("ranks")) {
      remat::search::RankResult rr;
      rr.rank = rk.value("rank", 0);
      rr.peak_allocated_bytes = Figure<uint64_t>(rk, "peak_allocated_bytes");
      rr.peak_reserved_bytes = Figure<uint64_t>(rk, "peak_reserved_bytes");
      r.ranks.push_back(rr);
    }
    run->wall_s += Figure<double>(t, "wall_s");
    // A near-tie's second run (search/remeasure.h) costs time but is not another policy: the
    // frontiers compared here are of the first runs.
    if (t.value("remeasure", false)) continue;
    run->trials.push_back(std::move(r));
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: remat-compare GUIDED.json EXHAUSTIVE.json\n";
    return 2;
  }
  Run guided, exhaustive;
  for (auto [path, run] : {std::pair{argv[1], &guided}, std::pair{argv[2], &exhaustive}}) {
    try {
      if (!Load(path, run)) {
        std::cerr << "error: cannot read " << path << "\n";
        return 2;
      }
    } catch (const std::exception& e) {
      std::cerr << "error: " << path << ": " << e.what() << "\n";
      return 2;
    }
  }
  const auto fe = remat::search::ComputeFrontier(exhaustive.trials, exhaustive.metric, exhaustive.budget);
  const auto fg = remat::search::ComputeFrontier(guided.trials, guided.metric, guided.budget);
  double t_min = 0;
  for (const auto& p : fe) t_min = t_min == 0 ? p.tokens_per_s : std::min(t_min, p.tokens_per_s);
  const double t_ref = 0.9 * t_min;
  const double hv_e = remat::search::Hypervolume(fe, exhaustive.budget, t_ref);
  const double hv_g = remat::search::Hypervolume(fg, guided.budget, t_ref);
  const double trial_ratio = exhaustive.trials.empty() ? 0 : double(guided.trials.size()) / exhaustive.trials.size();
  std::printf("trials        guided %3zu   exhaustive %3zu   ratio %.3f (goal <= 0.25)\n",
              guided.trials.size(), exhaustive.trials.size(), trial_ratio);
  std::printf("GPU-seconds   guided %7.1f   exhaustive %7.1f   ratio %.3f\n", guided.wall_s,
              exhaustive.wall_s, exhaustive.wall_s > 0 ? guided.wall_s / exhaustive.wall_s : 0);
  std::printf("frontier      guided %zu points, exhaustive %zu points\n", fg.size(), fe.size());
  std::printf("hypervolume   guided/exhaustive %.4f (goal >= 0.95; t_ref %.1f tokens/s)\n",
              hv_e > 0 ? hv_g / hv_e : 0, t_ref);
  return 0;
}
