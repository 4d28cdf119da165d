#include "search/rank_layout.h"

#include <algorithm>

namespace remat::search {

int RanksPerStage(const ParallelSpec& p) {
  return std::max(1, p.tensor_model_parallel_size * p.context_parallel_size *
                         p.data_parallel_size);
}

RankPlace PlaceOf(const ParallelSpec& p, int rank) {
  const int tp = std::max(1, p.tensor_model_parallel_size);
  const int cp = std::max(1, p.context_parallel_size);
  const int dp = std::max(1, p.data_parallel_size);
  RankPlace at;
  at.tp = rank % tp;
  at.cp = rank / tp % cp;
  at.dp = rank / (tp * cp) % dp;
  at.pp = rank / (tp * cp * dp);
  return at;
}

ParallelGroups GroupsOf(const ParallelSpec& p) {
  const int tp = std::max(1, p.tensor_model_parallel_size);
  const int cp = std::max(1, p.context_parallel_size);
  const int dp = std::max(1, p.data_parallel_size);
  const int pp = std::max(1, p.pipeline_model_parallel_size);
  const int ep = std::max(1, p.expert_model_parallel_size);
  const int etp = std::max(1, p.EffectiveExpertTensorParallelSize());
  const int world = tp * cp * dp * pp;
  ParallelGroups g;
  // Each kind's groups are numbered by the coordinates that stay fixed within a group, the
  // slower coordinate first: ranks visited in ascending order land in ascending order.
  g.tp.resize(world / tp);
  g.cp.resize(world / cp);
  g.dp.resize(world / dp);
  g.pp.resize(world / pp);
  g.dp_cp.resize(world / (dp * cp));
  const int stage = tp * cp * dp;
  // With EP 1 and ETP = TP the expert groups are the dense ones (ep: one rank, expert_tp: tp,
  // expert_dp: dp with CP 1), left empty as for dense models.
  const bool experts = ep > 1 || etp != tp;
  if (experts) {
    g.ep.resize(world / ep);
    g.expert_dp.resize(etp * ep * pp);
    g.expert_tp.resize(world / etp);
    g.expert_tp_ep.resize(world / (etp * ep));
  }
  for (int r = 0; r < world; ++r) {
    const RankPlace at = PlaceOf(p, r);
    g.tp[r / tp].push_back(r);
    g.cp[at.tp + tp * (at.dp + dp * at.pp)].push_back(r);
    g.dp[at.tp + tp * (at.cp + cp * at.pp)].push_back(r);
    g.pp[at.tp + tp * (at.cp + cp * at.dp)].push_back(r);
    g.dp_cp[at.tp + tp * at.pp].push_back(r);
    if (experts) {  // blocks never cross a stage: ETP x EP divides its ranks
      const int s = r % stage, e_tp = s % etp, e_dp = s / (etp * ep);
      g.ep[e_tp + etp * (e_dp + stage / (etp * ep) * at.pp)].push_back(r);
      g.expert_dp[s % (etp * ep) + etp * ep * at.pp].push_back(r);
      g.expert_tp[r / etp].push_back(r);
      g.expert_tp_ep[r / (etp * ep)].push_back(r);
    }
  }
  return g;
}

}  // namespace remat::search
