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
// stage with the same TP rank), over which non-expert gradients are reduced. Expert groups (empty
// with EP 1 and ETP = TP, where they are the dense ones) follow Megatron's expert grid
// etp-ep-edp-pp over a stage's TP x CP x DP ranks (megatron/core/parallel_state.py at d98e8a6:
// decoupled from the dense grid, expert TP fastest; the spec's rules require that ETP x EP
// divides those ranks): `expert_tp` holds blocks of ETP consecutive ranks, `ep` the ranks of one
// stage with the same expert-TP and expert-DP position (stride ETP), `expert_tp_ep` blocks of
// ETP x EP consecutive ranks (the allgather dispatcher's group), `expert_dp` the ranks of one
// stage that hold the same expert shards.
struct ParallelGroups {
  std::vector<std::vector<int>> tp, cp, dp, pp, ep, expert_dp, expert_tp, expert_tp_ep, dp_cp;
};
ParallelGroups GroupsOf(const ParallelSpec& p);

}  // namespace remat::search

#endif  // REMAT_SEARCH_RANK_LAYOUT_H_
