// Layout proxies: one device stands in for every rank of a parallel layout.
//
// The memory of one rank depends only on that rank's shapes, its layers, its pipeline schedule
// and its share of the state; the other ranks matter through the buffers their collectives fill.
// So a rank run alone, with collectives replaced by stand-ins that allocate and fill the same
// output buffers (engine/collectives.h, NewStandInCollectives: PyTorch's fake process group has
// the same idea), holds what it would hold in the real job. `search.layout_proxy: true` makes
// every trial of a layout such a set of rank proxies on one device (one worker slot), and this
// file is the pure part of it: which ranks to measure (the roles), the micro-batch count that
// keeps each stage's peak, the communication-time model, and the result for every rank of the
// layout. docs/layout-proxies.md explains the method, its error sources and its validation.
//
// Roles: every rank of one pipeline stage has the same shapes (TP, CP, DP and EP shards are
// equal; Megatron pads the distributed optimizer's buffer to equal shards), so one rank per
// stage (tp = dp = 0) stands for the stage. Middle stages that build the same layers (counts,
// dense or MoE, MTP) differ only in the micro-batches their schedule keeps in flight, which is
// linear in the stage index, so with more than four stages the first and last stage and the two
// ends of every run of consecutive alike middle stages are measured, and the stages inside a run
// are interpolated linearly between its ends (four roles when every middle stage is alike; five
// for DeepSeek-V3's PP 8, whose stage 1 holds two of its three dense layers).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <string>
#include <vector>

#include "search/spec.h"
#include "search/status.h"
#include "search/trial.h"

namespace remat::search {

// Slots one trial of `spec` leases: 1 with search.layout_proxy, else the layout's world size.
int TrialSlots(const SearchSpec& spec);

// The spec's own rules for search.layout_proxy (builtin backend only) and the link figures are
// ValidateSpec's (search/spec.cc): rules of the spec. With search.proxy_layers too, the engine
// runs the layout proxy at both cut depths and extends every rank's figures to the full depth
// (search/depth_proxy.h): for a stage that does not fit the device even alone.

// One measured rank and the stage it stands for.
struct ProxyRole {
  std::string name;  // "stage 0 (first)", "stage 2", "stage 3 (last)", "stage 0 (only)"
  int rank = 0;      // the global rank measured: tp = cp = dp = 0 of its stage
  int pp_rank = 0;
};

// The roles to measure, in stage order (see the file comment).
std::vector<ProxyRole> ProxyRoles(const SearchSpec& spec);

// The smallest micro-batch count M' <= M (a multiple of PP under interleaving) for which every
// stage's schedule reaches the same in-flight states as with M: the peak is the same, and the
// proxy runs M' micro-batches instead of M. M when nothing smaller keeps them.
int ProxyMicrobatches(const SearchSpec& spec);

// `spec` as a role runs it: global_batch_size cut to M' micro-batches, no layout_proxy.
SearchSpec ProxyRunSpec(const SearchSpec& spec);

// Collectives as the stand-ins saw them on one rank.
enum class CollectiveKind { kAllReduce, kAllGather, kReduceScatter, kAllToAll, kSendRecv };

// One kind of collective on one group, summed over one training step.
struct CommRecord {
  std::string group;      // "tp", "dp", "pp", "ep", "expert_dp", "embedding", "world"
  CollectiveKind kind = CollectiveKind::kAllReduce;
  std::vector<int> ranks;  // the group's global ranks (decides whether it crosses nodes)
  // Bytes per step as the call sees them: AllReduce the buffer, AllGather the gathered output,
  // ReduceScatter the input, AllToAll and SendRecv what this rank sends.
  double bytes = 0;
  double calls = 0;       // per step
};

// What one role measured (engine: RunStandInRank).
struct RoleMeasurement {
  ProxyRole role;
  TrialResult result;              // ranks[0]: the measured rank's peaks and step times
  std::vector<CommRecord> comm;    // per step
  double schedule_s = 0;           // median per step: forward and backward of the M' micro-batches
  double optimizer_s = 0;          // median per step: gradient reduction, norm and Adam
};

// The links of the simulated cluster (search.gpus_per_node, search.nvlink_gb_s,
// search.network_gb_s: H100/H200 HGX defaults).
struct LinkModel {
  int gpus_per_node = 8;
  double nvlink_bytes_per_s = 0;   // per GPU, one direction
  double network_bytes_per_s = 0;  // per GPU, one direction
  double latency_s = 0;            // per call
};
LinkModel LinksOf(const SearchSpec& spec);

// Seconds the collectives of `comm` take on `links` (ring algorithms: all-reduce moves
// 2(n-1)/n of the buffer, all-gather and reduce-scatter (n-1)/n, all-to-all (n-1)/n of what
// is sent, point-to-point what is sent), a group crossing nodes at the network's bandwidth.
double CommSeconds(const LinkModel& links, const std::vector<CommRecord>& comm);

// The trial of the whole layout from its roles' measurements (in ProxyRoles order): every rank
// of the layout in ranks[] (a stage's ranks take its role's peaks, interpolated for unmeasured
// middle stages), the step time of the pipeline with its bubble and the modelled
// communication, throughput of the real global batch, marked predicted, the roles named in
// `proxies`. A role that did not finish ok gives the trial its status and message.
TrialResult CombineLayoutProxies(const SearchSpec& spec,
                                 const std::vector<RoleMeasurement>& measured);

}  // namespace remat::search
