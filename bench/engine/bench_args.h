// The command line the engine benchmarks share (remat-bench-engine, remat-bench-estimate):
// --spec FILE.yaml [--policies 'P1;P2;...'], the spec read and every policy parsed up front.
#pragma once

#include <optional>
#include <vector>

#include "search/policy.h"
#include "search/spec.h"

namespace remat::bench {

struct BenchArgs {
  search::SearchSpec spec;
  std::vector<search::Policy> policies;  // in the order given
};

// nullopt after printing the one `error:` line (the usage line when --spec, or --policies with
// `policies_required`, is missing; else the field): the caller exits 2.
std::optional<BenchArgs> ParseBenchArgs(int argc, char** argv, const char* usage,
                                        bool policies_required);

}  // namespace remat::bench
