// The trial engine's entry point: runs one rank of one trial (one recompute policy on one model)
// and reports what the allocator saw.
//
// One process runs one rank (LibTorch's RNG, allocator statistics and the CPU counting allocator
// are process-wide). RunTrial builds the model (bf16 parameters with fp32 or bf16 main gradients
// and an Adam with fp32 master weights and states or the precision-aware optimizer's dtypes,
// engine/te_optimizer.h; or fp32 throughout), runs warmup_steps + measure_steps
// training steps on random tokens and measures peaks over the whole trial: build, optimizer-state
// initialisation and every step. The memory budget is enforced (CPU: a counting allocator; CUDA:
// the caching allocator's memory fraction). Ranks of a multi-rank trial meet through files in
// `rendezvous_dir` (engine/README.md, "Rendezvous").
//
// Thread-safety: call RunTrial from one thread at a time per process.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "search/layout_proxy.h"
#include "search/policy.h"
#include "search/spec.h"
#include "search/trial.h"

namespace remat::engine {

struct TrialOptions {
  search::SearchSpec spec;      // validated, Megatron defaults resolved
  search::Policy policy;        // validated by search::ValidatePolicy (checked again here)
  int rank = 0, world_size = 1;
  std::string rendezvous_dir;   // ranks of one trial meet here (files); unused with one rank
  double collective_timeout_s = 300;  // a collective slower than this is aborted -> status failed
  // CPU ranks: TCP point-to-point with NCCL's semantics (CollectivesOptions::nccl_point_to_point);
  // remat-trial sets it from REMAT_TCP_NCCL_P2P=1.
  bool nccl_point_to_point = false;
};

// Runs one rank of one trial. With spec.search.layout_proxy the trial is a layout proxy instead
// (search/layout_proxy.h; one worker slot, options.rank and world_size are ignored): every role of
// search::ProxyRoles runs alone in this process, one after the other, on search::ProxyRunSpec,
// and the result (search::CombineLayoutProxies) lists every rank of the layout, predicted.
// Never throws: an OOM is status oom (with the failing request size in
// ranks[0].failing_request_bytes), a policy or model this engine cannot run is status invalid, and
// anything else is failed with a message. `ranks` holds this rank only; step_time_s is this rank's
// median (the caller takes the max over ranks).
search::TrialResult RunTrial(const TrialOptions& options);

// Runs rank o.rank of the spec's layout (o.world_size = the layout's world size) ALONE, with
// the stand-in collectives (engine/collectives.h, StandInCollectives) in place of the other
// ranks: no rendezvous. That rank's shapes, layers, schedule and share of the state are those of
// the real job, so its peaks are too (a layout proxy's role, search/layout_proxy.h). Never
// throws. Fills `result` (ranks[0]: this rank's peaks and step times; loss and gradient norm
// come from stand-in data and mean nothing), `comm` (the calls of one step: summed over the
// measured steps, divided by their number), `schedule_s` and `optimizer_s` (medians over the
// measured steps of the forward/backward part and of the optimizer part: gradient reduction,
// norm, Adam). `role` holds the rank, its pipeline rank and the name "rank <r>".
search::RoleMeasurement RunStandInRank(const TrialOptions& options);

// What this engine is built from, for `remat-trial --version`: remat, torch, cuda, nccl, driver,
// gpu (the first GPU's model) and device (cuda or cpu); "none" for what a CPU-only engine lacks.
std::vector<std::pair<std::string, std::string>> EngineVersions();

// The same keys for one trial, as it ran: on a CUDA device (its model as gpu), or on the CPU
// (cuda, nccl, driver and gpu "none", whatever the build could do). RunTrial records them in
// TrialResult::versions.
std::map<std::string, std::string> TrialVersions(bool on_cuda, int device_index);

}  // namespace remat::engine
