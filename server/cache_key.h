// The results-cache key: when two trials would measure the same thing, the second reuses the
// first's result (TrialResult.reused = true) instead of running.
//
// The key covers everything that can change what a trial measures:
//   - the model (every ModelSpec field, Megatron defaults resolved), the parallel layout and the
//     train settings (micro batch, precision, distributed optimizer, seed);
//   - the policy (canonical string);
//   - every search option except those listed below: memory budget (a worker may cap memory at
//     it), warmup_steps, measure_steps, backend, command_template, device, depth proxies, and
//     any option added later;
//   - the hardware of the worker that runs it: the kinds of GPU it offers (name and memory);
//   - the worker's software versions (remat, torch, cuda, nccl, driver, ... as registered);
//   - with backend replay, the replay entry itself (two tables may disagree about a policy).
// It leaves out what cannot change a measurement: the search name, strategy, max_trials,
// memory_metric (both peaks are recorded either way), trial_timeout_s and the replay table's
// path. Only results with status ok or oom are cached. Thread-safety: pure function.
#pragma once

#include <string>

#include "remat/v1/remat.pb.h"

namespace remat::server {

// A byte string (deterministic protobuf serialisation of the fields above, prefixed with a
// version tag); equal keys mean interchangeable results. `replay` may be null for other
// backends or a policy missing from the table.
std::string ResultsCacheKey(const v1::SearchSpec& spec, const std::string& policy,
                            const v1::RegisterRequest& worker, const v1::ReplayEntry* replay);

// The worker's hardware as written into the key: its distinct GPU kinds, e.g.
// "NVIDIA H200/150754820096" (a plain CPU slot: "cpu-slot/0").
std::string HardwareSignature(const v1::RegisterRequest& worker);

}  // namespace remat::server
