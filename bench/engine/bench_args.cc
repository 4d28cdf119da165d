#include "bench/engine/bench_args.h"

#include <sstream>
#include <string>

#include "common/main_util.h"
#include "specfile/spec_file.h"

namespace remat::bench {

std::optional<BenchArgs> ParseBenchArgs(int argc, char** argv, const char* usage,
                                        bool policies_required) {
  std::string spec_path, policies;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--spec") spec_path = argv[i + 1];
    if (a == "--policies") policies = argv[i + 1];
  }
  if (spec_path.empty() || (policies_required && policies.empty())) {
    common::Fail(2, std::string("usage: ") + usage);
    return std::nullopt;
  }
  auto spec = spec::LoadSpecFile(spec_path);
  if (!spec.ok()) {
    common::Fail(2, spec.status().message());
    return std::nullopt;
  }
  BenchArgs out;
  out.spec = *spec;
  std::stringstream list(policies);
  std::string text;
  while (std::getline(list, text, ';')) {
    if (text.empty()) continue;
    auto policy = search::ParsePolicy(text);
    if (!policy.ok()) {
      common::Fail(2, "--policies: " + policy.status().message());
      return std::nullopt;
    }
    out.policies.push_back(*policy);
  }
  return out;
}

}  // namespace remat::bench
