// The one per-rank collector: what the W processes of a per-rank run left, whatever launched
// them (this machine or a Slurm job), combined into the run's result (worker/result_combiner.h).
//
// For each rank r: its own result (the backend's reader; a layout proxy's one process speaks
// for every rank of the layout and keeps its ranks and message as it wrote them), else a failed
// rank result saying how the process ended (RankLeftNothing). A rank that wrote ok but then
// exited badly is failed. Thread-safety: pure functions but for reading the ranks' logs.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "search/trial.h"
#include "worker/assignment.h"
#include "worker/launcher.h"

namespace remat::worker {

// Rank r's own result, read from what it wrote in the run folder; nullopt when it left none.
using RankReader = std::function<std::optional<search::TrialResult>(int rank)>;

// `program` names the ranks' program in messages ("remat-trial", "driver").
search::TrialResult CollectRankResults(const Assignment& assignment, const LaunchPlan& plan,
                                       const LaunchOutcome& outcome, const std::string& program,
                                       const RankReader& read, double peer_exit_grace_s);

// "rank R: <program> <how it ended>[, no <what> file][: <stderr tail>]", or, for a rank the
// launcher killed because a peer ended first, who ended it and why ("stuck in a collective?").
std::string RankLeftNothing(const LaunchPlan& plan, const LaunchOutcome& outcome, int rank,
                            const std::string& program, const std::string& what,
                            double peer_exit_grace_s);

}  // namespace remat::worker
