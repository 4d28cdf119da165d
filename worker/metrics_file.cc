#include "worker/metrics_file.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "common/read_file.h"
#include "search/limits.h"
#include "search/noise.h"
#include "search/steady_state.h"

namespace remat::worker {
namespace {

using nlohmann::json;

absl::Status ReadU64(const json& obj, const char* key, const std::string& where, uint64_t* out) {
  if (!obj.contains(key) || obj[key].is_null()) return absl::OkStatus();
  const json& v = obj[key];
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
  } else if (v.is_number_float() && v.get<double>() >= 0 && v.get<double>() < 0x1p64) {
    *out = static_cast<uint64_t>(v.get<double>());  // in range: the cast is defined
  } else {
    return absl::InvalidArgumentError(where + "." + key +
                                      ": must be a non-negative number below 2^64");
  }
  return absl::OkStatus();
}

absl::Status ReadList(const json& obj, const char* key, const std::string& where,
                      std::vector<double>* out) {
  if (!obj.contains(key) || obj[key].is_null()) return absl::OkStatus();
  if (!obj[key].is_array()) {
    return absl::InvalidArgumentError(where + "." + key + ": must be a list of numbers");
  }
  // Step times feed the throughput the coordinator checks (finite, not negative): refuse them
  // here, naming the key, rather than have the report refused.
  const bool times = std::string(key) == "step_times_s";
  for (const json& v : obj[key]) {
    if (!v.is_number() || !std::isfinite(v.get<double>()) || (times && v.get<double>() < 0)) {
      return absl::InvalidArgumentError(where + "." + key + ": must be a list of " +
                                        (times ? "non-negative numbers" : "finite numbers"));
    }
    out->push_back(v.get<double>());
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobMetrics> ParseMetricsJson(const std::string& json_text) {
  json doc = json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return absl::InvalidArgumentError("metrics file: not valid JSON");
  if (!doc.is_object()) return absl::InvalidArgumentError("metrics file: expected a JSON object");
  JobMetrics out;
  if (doc.contains("status")) {
    if (!doc["status"].is_string()) {
      return absl::InvalidArgumentError("metrics file: status: must be a string");
    }
    out.status = doc["status"].get<std::string>();
  }
  if (doc.contains("message") && doc["message"].is_string()) {
    out.message = doc["message"].get<std::string>();
  }
  if (doc.contains("ranks")) {
    if (!doc["ranks"].is_array()) {
      return absl::InvalidArgumentError("metrics file: ranks: must be a list");
    }
    int i = 0;
    for (const json& r : doc["ranks"]) {
      const std::string where = "metrics file: ranks[" + std::to_string(i++) + "]";
      if (!r.is_object()) return absl::InvalidArgumentError(where + ": must be an object");
      RankMetrics m;
      if (r.contains("rank")) {
        if (!r["rank"].is_number_integer() || r["rank"].get<int64_t>() < 0 ||
            r["rank"].get<int64_t>() >= search::limits::kMaxWorldSize) {
          return absl::InvalidArgumentError(where + ".rank: must be a non-negative integer below " +
                                            std::to_string(search::limits::kMaxWorldSize));
        }
        m.memory.rank = static_cast<int>(r["rank"].get<int64_t>());
      }
      for (auto [key, field] :
           {std::pair<const char*, uint64_t*>{"peak_allocated_bytes",
                                              &m.memory.peak_allocated_bytes},
            {"peak_reserved_bytes", &m.memory.peak_reserved_bytes},
            {"static_bytes", &m.memory.static_bytes},
            {"alloc_retries", &m.memory.alloc_retries},
            {"failing_request_bytes", &m.memory.failing_request_bytes}}) {
        absl::Status s = ReadU64(r, key, where, field);
        if (!s.ok()) return s;
      }
      for (auto [key, field] :
           {std::pair<const char*, std::vector<double>*>{"step_times_s", &m.step_times_s},
            {"losses", &m.losses},
            {"grad_norms", &m.grad_norms}}) {
        absl::Status s = ReadList(r, key, where, field);
        if (!s.ok()) return s;
      }
      if (r.contains("setup_s") && !r["setup_s"].is_null()) {
        if (!r["setup_s"].is_number() || r["setup_s"].get<double>() < 0) {
          return absl::InvalidArgumentError(where + ".setup_s: must be a non-negative number");
        }
        m.setup_s = r["setup_s"].get<double>();
      }
      if (r.contains("status")) {
        if (!r["status"].is_string()) {
          return absl::InvalidArgumentError(where + ".status: must be a string");
        }
        m.status = r["status"].get<std::string>();
        if (m.status != "ok" && m.status != "oom" && m.status != "failed") {
          return absl::InvalidArgumentError(where + ".status: must be ok, oom or failed");
        }
      }
      if (r.contains("message") && r["message"].is_string()) {
        m.message = r["message"].get<std::string>();
      }
      if (m.memory.peak_reserved_bytes == 0) {
        m.memory.peak_reserved_bytes = m.memory.peak_allocated_bytes;
      }
      out.ranks.push_back(m);
    }
  }
  return out;
}

absl::StatusOr<JobMetrics> ReadMetricsFiles(const std::string& path) {
  namespace fs = std::filesystem;
  std::vector<std::string> files;
  std::error_code ec;
  if (fs::exists(path, ec)) files.push_back(path);
  fs::path p(path);
  const std::string prefix = p.filename().string() + ".rank";
  fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.find(".tmp") == std::string::npos) {
      files.push_back(it->path().string());
    }
  }
  if (files.empty()) return absl::NotFoundError("no metrics file at " + path);
  std::sort(files.begin(), files.end());
  JobMetrics merged;
  std::map<int, RankMetrics> by_rank;
  for (const std::string& f : files) {
    // The job wrote (or linked) it: read only a regular file of bounded size, so a metrics
    // file that is /dev/zero or a FIFO cannot hang the worker or fill its memory.
    common::FileText text = common::ReadRegularFile(f, search::limits::kMaxMetricsFileBytes);
    if (!text.text) return absl::InvalidArgumentError(f + ": " + text.error);
    auto m = ParseMetricsJson(*text.text);
    if (!m.ok()) {
      return absl::InvalidArgumentError(f + ": " + std::string(m.status().message()));
    }
    if (!m->status.empty() && (merged.status.empty() || m->status != "ok")) {
      merged.status = m->status;
    }
    if (!m->message.empty()) {
      merged.message += (merged.message.empty() ? "" : "; ") + m->message;
    }
    for (RankMetrics& r : m->ranks) by_rank[r.memory.rank] = std::move(r);
  }
  for (auto& [rank, r] : by_rank) merged.ranks.push_back(std::move(r));
  return merged;
}

search::TrialResult MetricsToResult(const Assignment& assignment, const JobMetrics& metrics) {
  const search::SearchSpec& spec = assignment.spec;
  const search::SearchOptions& so = spec.search;
  const int warmup = so.warmup_steps;

  // The warm-up ends where the slowest rank's step times settle (search/steady_state.h), the
  // same step for every rank, as in the engine.
  std::vector<double> slowest;
  bool first = true;
  for (const RankMetrics& r : metrics.ranks) {
    if (r.step_times_s.empty()) continue;
    if (first) {
      slowest = r.step_times_s;
      first = false;
      continue;
    }
    slowest.resize(std::min(slowest.size(), r.step_times_s.size()));
    for (size_t i = 0; i < slowest.size(); ++i) slowest[i] = std::max(slowest[i], r.step_times_s[i]);
  }
  const search::SteadySplit split = search::SplitSteadyState(so, slowest);

  search::TrialResult out;
  if (metrics.status == "invalid") {
    search::TrialResult refused;
    refused.status = search::TrialStatus::kInvalid;
    refused.message = metrics.message.empty() ? "the job refused the trial" : metrics.message;
    return refused;
  }
  bool oom = metrics.status == "oom";
  bool failed = metrics.status == "failed";
  std::vector<std::string> notes;
  if (!metrics.message.empty()) notes.push_back(metrics.message);
  double step = 0, lo = 0, hi = 0;
  bool any_step = false;
  bool have_loss = false;
  for (const RankMetrics& r : metrics.ranks) {
    search::RankResult& rr = out.ranks.emplace_back(r.memory);
    out.setup_s = std::max(out.setup_s, r.setup_s);
    if (r.status == "oom") oom = true;
    if (r.status == "failed") failed = true;
    const std::string rank = "rank " + std::to_string(r.memory.rank) + ": ";
    if (!r.message.empty()) notes.push_back(rank + r.message);
    if (static_cast<int>(r.step_times_s.size()) <= split.warmup_steps) {
      if (r.status == "ok") {
        failed = true;
        notes.push_back(rank + "metrics have " + std::to_string(r.step_times_s.size()) +
                        " step times; warmup_steps is " + std::to_string(warmup) +
                        " and the warm-up took " + std::to_string(split.warmup_steps) +
                        " (warmup_max_steps " + std::to_string(so.warmup_max_steps) +
                        "), leaving none to measure");
      }
      continue;
    }
    // The steps the engine would have measured: at least measure_steps, then until the median
    // is known to noise_target (search/noise.h); the job ran for the cap.
    const std::vector<double> measured =
        search::AdaptiveMeasuredSteps(r.step_times_s, split.warmup_steps, so);
    rr.warmup_steps_taken = split.warmup_steps;
    rr.warmup_step_times_s.assign(r.step_times_s.begin(),
                                  r.step_times_s.begin() + split.warmup_steps);
    rr.step_times_s = measured;
    const double median = search::MedianStepTime(measured);
    rr.step_time_s = median;
    step = std::max(step, median);
    auto [mn, mx] = std::minmax_element(measured.begin(), measured.end());
    lo = any_step ? std::min(lo, *mn) : *mn;
    hi = any_step ? std::max(hi, *mx) : *mx;
    any_step = true;
    if (!have_loss && static_cast<int>(r.losses.size()) > warmup) {
      out.loss = r.losses[warmup];
      if (static_cast<int>(r.grad_norms.size()) > warmup) out.grad_norm = r.grad_norms[warmup];
      have_loss = true;
    }
  }
  out.warmup_steps_taken = split.warmup_steps;
  out.warmup_settled = split.settled;
  if (metrics.ranks.empty()) {
    failed = true;
    notes.push_back("metrics file lists no ranks");
  }
  std::string message;
  for (const auto& n : notes) message += (message.empty() ? "" : "; ") + n;
  out.message = message;
  if (oom) {
    out.status = search::TrialStatus::kOom;
  } else if (failed || !any_step) {
    out.status = search::TrialStatus::kFailed;
  } else {
    out.status = search::TrialStatus::kOk;
    out.step_time_s = step;
    out.step_time_spread_s = hi - lo;
    out.tokens_per_s = search::TokensPerSecond(spec, step);
    search::FillStepTimeInterval(so, &out);  // from the slowest rank's measured steps
  }
  return out;
}

bool LogMentionsOom(const std::string& path) {
  // The job may have put anything at the path (a FIFO would block a plain open for ever).
  common::FileText tail = common::ReadRegularFileTail(path, 1 << 18);
  if (!tail.text) return false;
  const std::string& text = *tail.text;
  for (const char* needle : {"CUDA out of memory", "OutOfMemoryError", "out of memory"}) {
    if (text.find(needle) != std::string::npos) return true;
  }
  return false;
}

std::string MetricsFilePath(const std::string& run_dir) { return run_dir + "/metrics.json"; }

}  // namespace remat::worker
