// The figures and words every rendering of a search shares (text, JSON, SVG): units, number
// formats, a trial's status and memory. The CLI renders what the coordinator sent and decides
// nothing: frontier, recommendation, apply strings, the nothing-fits message, fragmentation
// findings, the budget in bytes and the memory metric all come in the remat.v1.Search.
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "proto/convert.h"
#include "remat/v1/remat.pb.h"

namespace remat::cli {

namespace v1 = ::remat::v1;

// "queued", "running", "succeeded", "failed", "cancelled".
const char* StateName(v1::SearchState state);
// "ok", "oom", ..., "pending", "running".
using proto::TrialStatusName;  // the contract's word for a status

namespace render {

// printf of one number.
std::string Format(const char* fmt, double v);

// Memory is shown in GiB, or in MiB when everything is under 1 GiB (tiny CPU models).
struct MemUnit {
  double bytes;
  const char* name;
  std::string Of(uint64_t b) const { return Format("%.2f", b / bytes); }
};
MemUnit UnitFor(uint64_t max_bytes);
// "61.20 GiB" or "12.34 MiB".
std::string Memory(uint64_t bytes);
// Budgets are named in GiB (the spec's unit): "budget 10 GiB".
std::string GiB(uint64_t bytes, const char* fmt);

std::string Tokens(double tokens_per_s);
std::string StepTime(double seconds);
std::string Duration(double seconds);  // "45s", "3m20s", "2h05m"
std::string Pad(const std::string& s, size_t width, bool right = false);

// Max over ranks.
uint64_t MaxAllocated(const v1::TrialResult& r);
uint64_t MaxReserved(const v1::TrialResult& r);
// Per the search's memory metric ("allocated" or "reserved").
uint64_t MemoryOf(const v1::TrialResult& r, const std::string& metric);

// A layout proxy's prediction (search/layout_proxy.h): its proxies name the stages they stood for.
bool IsLayoutProxy(const v1::TrialResult& r);
// Each pipeline stage's peak (per the memory metric) over the ranks of a result that lists every
// rank of a layout of `pipeline_stages` stages in Megatron's order (a stage's ranks consecutive);
std::vector<uint64_t> StagePeaks(const v1::TrialResult& r, int pipeline_stages,
                                 const std::string& metric);
// The stage of a global rank of such a result.
int StageOfRank(const v1::TrialResult& r, int pipeline_stages, int rank);

// The trial's status: its own while pending/running, the result's once final.
v1::TrialStatus StatusOf(const v1::Trial& t);
bool IsFinalStatus(v1::TrialStatus s);

}  // namespace render
}  // namespace remat::cli
