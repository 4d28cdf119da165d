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
//     (sorted by rank) and the slowest rank's step time.
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "remat/v1/remat.pb.h"

namespace remat::worker {

namespace v1 = ::remat::v1;


// Precedence of a final status for combining (higher is worse).
int StatusSeverity(v1::TrialStatus status);

// micro_batch_size * seq_length * data_parallel_size / step_time_s (0 when step_time_s <= 0).
double TokensPerSecond(const v1::SearchSpec& spec, double step_time_s);

// A result with only a status and a message, for the assignment's policy.
v1::TrialResult StatusResult(const v1::TrialAssignment& assignment, v1::TrialStatus status,
                             const std::string& message);

v1::TrialResult CombineRankResults(const v1::TrialAssignment& assignment,
                                   const std::vector<v1::TrialResult>& per_rank);

}  // namespace remat::worker
