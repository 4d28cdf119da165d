// What one trial measured: the domain form of a trial result, shared by the planner, the
// frontier, the coordinator and the trial engine. Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "search/policy.h"
#include "search/spec.h"

namespace remat::search {

enum class TrialStatus { kOk, kOom, kFailed, kTimeout, kInvalid, kCancelled };
const char* Name(TrialStatus s);  // "ok", "oom", ...
std::optional<TrialStatus> ParseTrialStatus(const std::string& s);

// One rank's measurements over the whole trial (build, optimizer init and every step).
struct RankResult {
  int rank = 0;
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;  // CPU: equals allocated (no caching allocator)
  uint64_t static_bytes = 0;         // weights + gradients + optimizer state
  uint64_t alloc_retries = 0;        // caching-allocator retries (fragmentation signal)
  uint64_t failing_request_bytes = 0;  // with status oom: the allocation that failed
  double step_time_s = 0;            // this rank's median measured step
  std::vector<double> step_times_s;  // each measured step, in order (warm-up excluded)
  int warmup_steps_taken = 0;        // warm-up steps before the measured ones (steady_state.h)
  std::vector<double> warmup_step_times_s;  // each warm-up step, in order
};

// What one proxy depth measured (depth proxies, search/depth_proxy.h).
struct ProxyMeasurement {
  int num_layers = 0;  // depth proxies: the cut depth; layout proxies: the stage's layers
  std::string role;    // layout proxies: the stage the rank stands for, e.g. "stage 0 (first)"
  int rank = -1;       // layout proxies: the global rank measured
  std::vector<RankResult> ranks;
  double step_time_s = 0;
};

struct TrialResult {
  Policy policy;
  TrialStatus status = TrialStatus::kFailed;
  std::vector<RankResult> ranks;
  double step_time_s = 0;         // median of the measured steps (max over ranks)
  double step_time_spread_s = 0;  // max - min of the measured steps
  // The 90% distribution-free interval of the median step (search/noise.h), from the slowest
  // rank's measured steps; 0 when unknown. noise_target_met: the interval reached the
  // confidence within search.noise_target (false: the trial stopped at its step cap, or the
  // target was 0).
  double step_time_low_s = 0;
  double step_time_high_s = 0;
  bool noise_target_met = false;
  int measured_steps = 0;  // the steps the median is of (max over ranks)
  // model.moe_router_force_load_balancing was on: the router's logits were random, so the
  // experts' loads (and the step time) are a balanced benchmark's, not the trained router's.
  bool forced_load_balancing = false;
  double tokens_per_s = 0;        // micro_batch * seq_length * dp / step_time_s
  double model_tflops = 0;        // model FLOPs (recompute not counted) per second per GPU, 1e12
  // The step after the shortest warm-up (step index search.warmup_steps, counted from 0): the
  // same step in every trial of a search, whatever warm-up each took, so losses compare.
  double loss = 0;
  double grad_norm = 0;
  int warmup_steps_taken = 0;     // max over ranks (search/steady_state.h)
  bool warmup_settled = false;    // the warm-up ended because the steps settled, not at the bound
  double setup_s = 0;             // process start, device init and model build
  double wall_s = 0;              // lease to result
  bool reused = false;            // taken from the results cache, not re-run
  bool predicted = false;         // a depth-proxy prediction, not a measurement
  std::string message;            // why it failed / what it says
  std::vector<ProxyMeasurement> proxies;  // with predicted: the measurements behind it
  // Software the trial ran with (remat, torch, cuda, nccl, driver, gpu, device), from the engine.
  std::map<std::string, std::string> versions;

  uint64_t PeakAllocatedBytes() const;  // max over ranks
  uint64_t PeakReservedBytes() const;   // max over ranks
  uint64_t PeakBytes(MemoryMetric metric) const;
  // The trial's measurement noise: how far its measured steps spread, as a fraction of its step
  // time ((max - min) / median). From step_time_spread_s, or from the ranks' step_times_s when
  // that is unset; 0 when neither says anything (a single step, or no timing).
  double RelativeSpread() const;
};

// The contract's throughput: global_batch_size * seq_length / step_time_s (the default global
// batch is micro_batch_size * data_parallel_size); 0 when step_time_s is not positive.
double TokensPerSecond(const SearchSpec& spec, double step_time_s);

// The median of measured step times (0 when there are none): the one step time a rank reports.
double MedianStepTime(std::vector<double> step_times_s);
// The measure window of a run's step times: after the first `warmup_steps`, at most
// `measure_steps` of them (fewer when the run had fewer).
std::vector<double> MeasuredSteps(const std::vector<double>& step_times_s, int warmup_steps,
                                  int measure_steps);

// A measured step time is noisy when its measured steps spread by more than this fraction of
// it (max - min over median): its tokens/s may be off by as much. Reports mark such trials.
inline constexpr double kNoisyStepSpread = 0.10;

}  // namespace remat::search
