// remat-bench-engine --spec FILE.yaml --policies P1;P2;... : runs each policy of one spec with the
// trial engine, one after the other in this process (one rank), and prints one JSON line per trial
// (engine/result_json.h, as remat-trial --json). For benchmarks only: remat-trial runs one trial
// per process.

#include <iostream>
#include <sstream>
#include <string>

#include "engine/result_json.h"
#include "engine/trial_runner.h"
#include "search/policy.h"
#include "search/trial.h"
#include "specfile/spec_file.h"

int main(int argc, char** argv) {
  std::string spec_path, policies;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--spec") spec_path = argv[i + 1];
    if (a == "--policies") policies = argv[i + 1];
  }
  if (spec_path.empty() || policies.empty()) {
    std::cerr << "error: usage: remat-bench-engine --spec FILE.yaml --policies 'P1;P2;...'\n";
    return 2;
  }
  auto spec = remat::spec::LoadSpecFile(spec_path);
  if (!spec.ok()) {
    std::cerr << "error: " << spec.status().message() << "\n";
    return 2;
  }
  std::stringstream list(policies);
  std::string text;
  while (std::getline(list, text, ';')) {
    if (text.empty()) continue;
    auto policy = remat::search::ParsePolicy(text);
    if (!policy.ok()) {
      std::cerr << "error: --policies: " << policy.status().message() << "\n";
      return 2;
    }
    remat::engine::TrialOptions o;
    o.spec = *spec;
    o.policy = *policy;
    std::cout << remat::engine::TrialResultJson(remat::engine::RunTrial(o)) << std::endl;
  }
  return 0;
}
