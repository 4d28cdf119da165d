// The metrics file a `command` trial writes (format in worker/README.md), and how the worker
// turns it into a TrialResult.
//
// A job writes {metrics_file} and/or one file per rank, {metrics_file}.rank<N>; each is a JSON
// object with an optional "status" ("ok" | "oom" | "failed"), "message", and "ranks": a list of
// per-rank objects (rank, peak_allocated_bytes, peak_reserved_bytes, step_times_s, losses, ...).
// The top-level status may also be "invalid": the job refused the trial (the megatron driver,
// for a spec feature or policy it cannot map), with the reason in "message".
// Thread-safety: pure functions (ReadMetricsFiles only reads files).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "search/trial.h"
#include "worker/assignment.h"

namespace remat::worker {

struct RankMetrics {
  // rank and memory figures as the result carries them (step times are below: every iteration).
  search::RankResult memory;
  std::vector<double> step_times_s;  // every iteration, warm-up included, in order
  std::vector<double> losses;        // per iteration, same order (may be shorter or empty)
  std::vector<double> grad_norms;
  double setup_s = 0;         // process start to the first step (optional; 0: not reported)
  std::string status = "ok";  // ok | oom | failed
  std::string message;
};

struct JobMetrics {
  std::string status;  // "" when the files did not say; ok | oom | failed | invalid
  std::string message;
  std::vector<RankMetrics> ranks;  // sorted by rank, one entry per rank
};

// InvalidArgument naming the key for a malformed document.
absl::StatusOr<JobMetrics> ParseMetricsJson(const std::string& json_text);

// Where the command and megatron backends have a run's processes write it: run_dir/metrics.json
// (and its .rank<N> siblings).
std::string MetricsFilePath(const std::string& run_dir);

// Reads and merges `path` and every `path.rank<N>` beside it. NotFound when there is none.
absl::StatusOr<JobMetrics> ReadMetricsFiles(const std::string& path);

// The result for `assignment`: each rank's first step times are its warm-up, as long as the
// steady-state rule (search/steady_state.h, applied to the slowest rank's time of each step)
// says, and the median of the next search.measure_steps is that rank's step time
// (search::MeasuredSteps / MedianStepTime); the loss is step index search.warmup_steps's. Status
// oom when any rank says oom; failed when a rank failed or too few steps were measured; invalid
// (with the message) when the job refused the trial. setup_s is the slowest rank's.
search::TrialResult MetricsToResult(const Assignment& assignment, const JobMetrics& metrics);

// Whether the end of a log (its last 256 KiB) says the job ran out of device memory
// ("CUDA out of memory", "OutOfMemoryError", "out of memory"). False when it cannot be read.
bool LogMentionsOom(const std::string& path);

}  // namespace remat::worker
