// The metrics file a `command` trial writes (format in worker/README.md), and how the worker
// turns it into a TrialResult.
//
// A job writes {metrics_file} and/or one file per rank, {metrics_file}.rank<N>; each is a JSON
// object with an optional "status" ("ok" | "oom" | "failed"), "message", and "ranks": a list of
// per-rank objects (rank, peak_allocated_bytes, peak_reserved_bytes, step_times_s, losses, ...).
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
  std::string status = "ok";  // ok | oom | failed
  std::string message;
};

struct JobMetrics {
  std::string status;  // "" when the files did not say
  std::string message;
  std::vector<RankMetrics> ranks;  // sorted by rank, one entry per rank
};

// InvalidArgument naming the key for a malformed document.
absl::StatusOr<JobMetrics> ParseMetricsJson(const std::string& json_text);

// Reads and merges `path` and every `path.rank<N>` beside it. NotFound when there is none.
absl::StatusOr<JobMetrics> ReadMetricsFiles(const std::string& path);

// The result for `assignment`: each rank's first step times are its warm-up, as long as the
// steady-state rule (search/steady_state.h, applied to the slowest rank's time of each step)
// says, and the median of the next search.measure_steps is that rank's step time
// (search::MeasuredSteps / MedianStepTime); the loss is step index search.warmup_steps's. Status oom when any rank says oom; failed when a rank
// failed or too few steps were measured.
search::TrialResult MetricsToResult(const Assignment& assignment, const JobMetrics& metrics);

}  // namespace remat::worker
