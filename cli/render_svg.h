// The SVG plot of a search: every trial with memory figures as a point labelled with its policy
// (x: peak memory per rank per the memory metric, y: tokens/s), the frontier as a step line, OOM
// trials as red crosses at their memory, the budget as a vertical line (or named, when far to
// the right of every point). Self-contained. Thread-safety: pure function.
#pragma once

#include <string>

#include "remat/v1/remat.pb.h"

namespace remat::cli {

std::string ResultSvg(const remat::v1::Search& search);

}  // namespace remat::cli
