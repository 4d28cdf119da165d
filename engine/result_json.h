// One trial result as one line of JSON: what `remat-trial --json` prints and what
// remat-bench-engine (bench/engine) prints per policy. The one writer of this format.
//
// Keys: policy, predicted, proxies[] (num_layers, step_time_s, ranks[]), status,
// peak_allocated_bytes, peak_reserved_bytes, static_bytes, alloc_retries (each the maximum over
// ranks), ranks[]
// (rank, peak_allocated_bytes, peak_reserved_bytes, static_bytes, alloc_retries,
// failing_request_bytes, step_time_s, step_times_s), step_time_s, step_time_spread_s,
// step_time_low_s, step_time_high_s, noise_target_met, measured_steps, forced_load_balancing,
// tokens_per_s, model_tflops, loss, grad_norm, setup_s, wall_s, message.
// Thread-safety: a pure function. Needs no LibTorch (its own library, remat_engine_json).
#pragma once

#include <string>

#include "search/trial.h"

namespace remat::engine {

// Compact JSON, no trailing newline.
std::string TrialResultJson(const search::TrialResult& result);

}  // namespace remat::engine
