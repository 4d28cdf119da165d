// The readable renderings of a search: the report, the list of searches, live progress lines.
// They render what the coordinator sent (see render_format.h) and decide nothing.
// Thread-safety: pure functions.
#pragma once

#include <ostream>
#include <string>

#include "cli/render_format.h"

namespace remat::cli {

// The readable report: header, the table of trials (policy, status, peak allocated/reserved
// max over ranks, step time, tokens/s, frontier mark `*`, reused/predicted/over-budget/noisy
// marks), notes on trials that did not succeed, the frontier, the recommendation with the exact
// settings to apply (or the coordinator's word on why nothing fits and what came closest), and
// the fragmentation findings.
void RenderReport(const v1::Search& search, std::ostream& out);

// `remat list`.
void RenderList(const v1::ListSearchesResponse& list, std::ostream& out);

// One progress line: a bar when `tty`, a plain sentence otherwise.
std::string ProgressLine(const v1::SearchProgress& progress, bool tty);
// One line about a finished trial ("selective:[core_attn]  ok  61.20 GiB  7700 tokens/s").
std::string TrialLine(const v1::Trial& trial, const std::string& memory_metric);

}  // namespace remat::cli
