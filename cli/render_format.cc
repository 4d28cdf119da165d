#include "cli/render_format.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "search/units.h"

namespace remat::cli {

const char* StateName(v1::SearchState state) {
  switch (state) {
    case v1::SEARCH_STATE_QUEUED:
      return "queued";
    case v1::SEARCH_STATE_RUNNING:
      return "running";
    case v1::SEARCH_STATE_SUCCEEDED:
      return "succeeded";
    case v1::SEARCH_STATE_FAILED:
      return "failed";
    case v1::SEARCH_STATE_CANCELLED:
      return "cancelled";
    default:
      return "unknown";
  }
}

namespace render {

std::string Format(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}

MemUnit UnitFor(uint64_t max_bytes) {
  if (max_bytes > 0 && max_bytes < search::kGiB) {
    return MemUnit{static_cast<double>(search::kMiB), "MiB"};
  }
  return MemUnit{static_cast<double>(search::kGiB), "GiB"};
}

std::string Memory(uint64_t bytes) {
  const MemUnit u = UnitFor(bytes);
  return u.Of(bytes) + " " + u.name;
}

std::string GiB(uint64_t bytes, const char* fmt) {
  return Format(fmt, search::BytesToGib(static_cast<double>(bytes)));
}

std::string Tokens(double t) { return t >= 100 ? Format("%.0f", t) : Format("%.1f", t); }

std::string StepTime(double s) { return Format(s < 10 ? "%.4f" : "%.2f", s); }

std::string Duration(double s) {
  if (s < 0) s = 0;
  long total = std::lround(s);
  char buf[32];
  if (total < 60) {
    std::snprintf(buf, sizeof(buf), "%lds", total);
  } else if (total < 3600) {
    std::snprintf(buf, sizeof(buf), "%ldm%02lds", total / 60, total % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%ldh%02ldm", total / 3600, (total % 3600) / 60);
  }
  return buf;
}

std::string Pad(const std::string& s, size_t width, bool right) {
  if (s.size() >= width) return s;
  return right ? std::string(width - s.size(), ' ') + s : s + std::string(width - s.size(), ' ');
}

uint64_t MaxAllocated(const v1::TrialResult& r) {
  uint64_t m = 0;
  for (const auto& rank : r.ranks()) m = std::max<uint64_t>(m, rank.peak_allocated_bytes());
  return m;
}

uint64_t MaxReserved(const v1::TrialResult& r) {
  uint64_t m = 0;
  for (const auto& rank : r.ranks()) m = std::max<uint64_t>(m, rank.peak_reserved_bytes());
  return m;
}

uint64_t MemoryOf(const v1::TrialResult& r, const std::string& metric) {
  return metric == "allocated" ? MaxAllocated(r) : MaxReserved(r);
}

bool IsLayoutProxy(const v1::TrialResult& r) {
  return r.proxies_size() > 0 && !r.proxies(0).role().empty();
}

int StageOfRank(const v1::TrialResult& r, int pipeline_stages, int rank) {
  const int stages = std::max(1, pipeline_stages);
  const int per_stage = std::max(1, r.ranks_size() / stages);
  return std::min(stages - 1, rank / per_stage);
}

std::vector<uint64_t> StagePeaks(const v1::TrialResult& r, int pipeline_stages,
                                 const std::string& metric) {
  std::vector<uint64_t> peak(std::max(1, pipeline_stages), 0);
  for (const auto& rr : r.ranks()) {
    uint64_t& p = peak[StageOfRank(r, pipeline_stages, rr.rank())];
    p = std::max(p, metric == "allocated" ? rr.peak_allocated_bytes() : rr.peak_reserved_bytes());
  }
  return peak;
}

v1::TrialStatus StatusOf(const v1::Trial& t) {
  if (t.has_result() && t.result().status() != v1::TRIAL_STATUS_UNSPECIFIED &&
      t.status() != v1::TRIAL_STATUS_PENDING && t.status() != v1::TRIAL_STATUS_RUNNING) {
    return t.result().status();
  }
  return t.status();
}

bool IsFinalStatus(v1::TrialStatus s) {
  return s != v1::TRIAL_STATUS_UNSPECIFIED && s != v1::TRIAL_STATUS_PENDING &&
         s != v1::TRIAL_STATUS_RUNNING;
}

}  // namespace render
}  // namespace remat::cli
