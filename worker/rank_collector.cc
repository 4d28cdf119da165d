#include "worker/rank_collector.h"

#include <signal.h>

#include <cstdio>

#include "worker/result_combiner.h"
#include "worker/trial_executor.h"

namespace remat::worker {

using search::TrialStatus;

std::string RankLeftNothing(const LaunchPlan& plan, const LaunchOutcome& outcome, int rank,
                            const std::string& program, const std::string& what,
                            double peer_exit_grace_s) {
  const GroupOutcome& group = outcome.group;
  const ChildExit& exit = group.children.at(rank);
  const std::string prefix = "rank " + std::to_string(rank) + ": ";
  if (group.lingered_kill && rank != group.first_ended &&
      (exit.signal == SIGTERM || exit.signal == SIGKILL)) {
    std::string msg = prefix + "killed after rank " + std::to_string(group.first_ended);
    if (group.first_ended_cleanly) {
      char grace[32];
      std::snprintf(grace, sizeof(grace), "%.4g s", peer_exit_grace_s);
      msg += std::string(" had finished and this rank still ran ") + grace +
             " later (stuck in a collective?)";
    } else {
      msg += " failed";
    }
    return msg;
  }
  std::string msg = prefix + program + " " + outcome.Describe(rank);
  if (exit.started) msg += ", no " + what + " file";
  const std::string tail = FileTail(RankStderrPath(plan.run_dir, rank));
  if (!tail.empty()) msg += ": " + tail;
  return msg;
}

search::TrialResult CollectRankResults(const Assignment& a, const LaunchPlan& plan,
                                       const LaunchOutcome& outcome, const std::string& program,
                                       const RankReader& read, double peer_exit_grace_s) {
  // A layout proxy (search/layout_proxy.h) is one process that numbers the layout's ranks
  // itself and speaks for all of them: its ranks and message stay as it wrote them.
  const bool layout_proxy = a.spec.search.layout_proxy;
  std::vector<search::TrialResult> per_rank;
  for (int r = 0; r < static_cast<int>(plan.processes.size()); ++r) {
    const ChildExit& exit = outcome.group.children.at(r);
    const std::string prefix = layout_proxy ? "" : "rank " + std::to_string(r) + ": ";
    std::optional<search::TrialResult> own;
    if (exit.started) own = read(r);
    if (!own) {
      per_rank.push_back(
          StatusResult(TrialStatus::kFailed,
                       RankLeftNothing(plan, outcome, r, program, "result", peer_exit_grace_s)));
      continue;
    }
    if (own->ranks.size() == 1 && !layout_proxy) own->ranks[0].rank = r;
    if (!own->message.empty()) own->message = prefix + own->message;
    if (!exit.ok() && own->status == TrialStatus::kOk) {
      own->status = TrialStatus::kFailed;
      own->message = prefix + program + " " + outcome.Describe(r) + " after writing an ok result";
    }
    per_rank.push_back(std::move(*own));
  }
  return CombineRankResults(a, per_rank);
}

}  // namespace remat::worker
