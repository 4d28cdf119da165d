// Setting up one rank of a trial (engine/trial_runner.cc): the checks that refuse what it cannot
// run, its collectives and its groups. Internal to remat_engine.
#pragma once

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "engine/collectives.h"
#include "engine/ops.h"
#include "engine/trial_runner.h"
#include "search/trial.h"

namespace remat::engine {

// A result that ends the trial early with `status` and `message`.
struct TrialStop {
  search::TrialStatus status;
  std::string message;
};

// Throws TrialStop (invalid) for what this rank cannot run: an invalid policy, what the engine
// cannot measure, a rank outside the spec's layout, fewer than one measured step.
void CheckRunnable(const TrialOptions& o, bool stand_in);

// Throws TrialStop (invalid) for a layout the device's transport cannot run, and for FP8 where
// this build or device has no FP8 GEMM (engine/fp8_linear.h Fp8Unsupported).
void CheckTransport(const search::SearchSpec& spec, const at::Device& device);

// The rank's collectives: stand-ins (*stand_ins set) for a layout proxy's role, none for one
// rank, NCCL on a GPU, TCP on CPU ranks.
std::unique_ptr<Collectives> MakeCollectives(const TrialOptions& o, bool stand_in,
                                             const at::Device& device,
                                             StandInCollectives** stand_ins);

// The rank's groups in Megatron Core's rank order (search/rank_layout.h); stand-ins record every
// call under its group's name (search::CommRecord::group).
Runtime MakeRuntime(const TrialOptions& o, Collectives* comm, StandInCollectives* stand_ins,
                    const at::Device& device);

}  // namespace remat::engine
