// Rendering a search for people and programs: the readable report, the contract's result JSON,
// the SVG plot of memory vs throughput, the list of searches and live progress lines.
//
// Everything renders from the remat.v1.Search the coordinator returns, so `remat search`,
// `remat get` and `remat watch` show the same thing. Thread-safety: pure functions.
#pragma once

#include <ostream>
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

// The settings that apply the recommendation: the coordinator's when it sent them, otherwise
// derived from the recommended policy. Empty when there is no recommendation.
v1::Apply ApplyFor(const v1::Search& search);

// The readable report: header, the table of trials (policy, status, peak allocated/reserved
// max over ranks in GiB, step time, tokens/s, frontier mark `*`, reused/predicted marks), notes
// on trials that did not succeed, the frontier, the recommendation with the exact settings to
// apply (or why nothing fits and what came closest), and fragmentation findings.
void RenderReport(const v1::Search& search, std::ostream& out);

// The contract's result JSON (plus a few more keys), pretty-printed.
std::string ResultJson(const v1::Search& search);

// A self-contained SVG: every trial with memory figures as a point labelled with its policy
// (x: peak memory GiB per memory_metric, y: tokens/s), the frontier as a step line, OOM trials
// as red crosses at their memory, the budget as a vertical line.
std::string ResultSvg(const v1::Search& search);

// `remat list`.
void RenderList(const v1::ListSearchesResponse& list, std::ostream& out);

// One progress line: a bar when `tty`, a plain sentence otherwise.
std::string ProgressLine(const v1::SearchProgress& progress, bool tty);
// One line about a finished trial ("selective:[core_attn]  ok  61.20 GiB  7700 tokens/s").
std::string TrialLine(const v1::Trial& trial, const std::string& memory_metric);

// Findings of search::DiagnoseFragmentation over the search's finished trials.
std::vector<std::string> FragmentationFindings(const v1::Search& search);

}  // namespace remat::cli
