// The contract's result JSON of a search (plus a few more keys), pretty-printed, from what the
// coordinator sent. Thread-safety: pure function.
#pragma once

#include <string>

#include "remat/v1/remat.pb.h"

namespace remat::cli {

std::string ResultJson(const remat::v1::Search& search);

}  // namespace remat::cli
