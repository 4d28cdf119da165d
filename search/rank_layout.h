// Where a global rank sits in a Megatron layout, and which ranks form each parallel group: the
// one home of Megatron Core's default rank order, tp-cp-ep-dp-pp (TP fastest, then CP, then DP,
// pipeline stages slowest; expert parallelism carved out of DP). The engine builds its
// communication groups from it, layout proxies and validation count a stage's ranks with it.
// Thread-safety: pure functions.
#ifndef REMAT_SEARCH_RANK_LAYOUT_H_
#define REMAT_SEARCH_RANK_LAYOUT_H_

#include <vector>

#include "search/spec.h"

namespace remat::search {

// rank = tp + TP x (cp + CP x (dp + DP x pp)).
struct RankPlace {
  int tp = 0;
  int cp = 0;
  int dp = 0;
  int pp = 0;
};

// TP x CP x DP: the ranks of one pipeline stage, which are the global ranks
// [stage x this, (stage + 1) x this).
int RanksPerStage(const ParallelSpec& p);

// `rank` in [0, p.WorldSize()).
RankPlace PlaceOf(const ParallelSpec& p, int rank);

// Every group of each kind, each group's ranks ascending; every rank of the world is in exactly
// one group of each kind. The data-parallel groups hold one CP rank (Megatron's dp group);
// `dp_cp` is Megatron's dp-cp group (data_parallel_group with context parallel: the ranks of one
// stage with the same TP rank), over which non-expert gradients are reduced. Expert groups (EP > 1 only; empty otherwise) follow Megatron's expert grid
// etp-ep-edp-pp over a stage's TP x CP x DP ranks with expert tensor parallelism 1 (what the
// spec's rules require: EP divides that product): `ep` holds blocks of EP consecutive ranks of
// one stage, `expert_dp` the ranks of one stage that hold the same experts (the same position
// modulo EP).
struct ParallelGroups {
  std::vector<std::vector<int>> tp, cp, dp, pp, ep, expert_dp, dp_cp;
};
ParallelGroups GroupsOf(const ParallelSpec& p);

}  // namespace remat::search

#endif  // REMAT_SEARCH_RANK_LAYOUT_H_
