// Turning what the ranks of one trial reported into the one TrialResult the coordinator records.
//
// A trial of world size W runs W rank processes; each writes its own TrialResult (its ranks
// list holds its own RankResult). CombineRankResults merges them:
//   - ranks: every rank's RankResult, sorted by rank;
//   - step_time_s / step_time_spread_s / setup_s: max over ranks (the slowest rank sets the pace);
//   - tokens_per_s: global_batch_size * seq_length / step_time_s (search::TokensPerSecond);
//   - model_tflops: min over ranks (per GPU, the slowest); loss, grad_norm: the lowest rank's;
//   - status: the worst over ranks, in this order (later is worse, and wins):
//       ok < failed < oom < invalid < timeout < cancelled
//     oom outranks failed because a rank that OOMs usually takes its peers down with it (their
//     collectives fail): the OOM is the cause, their failure the consequence. A trial is ok only
//     when all W ranks reported ok.
//   - message: the ranks' messages, "rank N: ..." joined with "; ";
//   - predicted (depth proxies): when any rank says so; proxies: per depth, every rank's figures
//     (sorted by rank) and the slowest rank's step time. A layout proxy (search/layout_proxy.h)
//     is one process whose result already lists every rank of the layout: its stage proxies are
//     kept one per role, and its message gets no "rank 0: " prefix.
// Thread-safety: pure functions.
#pragma once

#include <vector>

#include "search/trial.h"
#include "worker/assignment.h"

namespace remat::worker {

// Precedence of a final status for combining (higher is worse).
int StatusSeverity(search::TrialStatus status);

// The per-rank results are read with ResultFromWire (worker/assignment.h): a status that was not
// final is already failed. The combined result's policy is not set (MakeReport stamps it).
search::TrialResult CombineRankResults(const Assignment& assignment,
                                       const std::vector<search::TrialResult>& per_rank);

}  // namespace remat::worker
