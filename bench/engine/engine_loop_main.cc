// remat-bench-engine --spec FILE.yaml --policies P1;P2;... : runs each policy of one spec with the
// trial engine, one after the other in this process (one rank), and prints one JSON line per trial.
// For benchmarks only: remat-trial runs one trial per process.

#include <iostream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "search/policy.h"
#include "search/trial.h"
#include "specfile/spec_file.h"
#include "engine/trial_runner.h"

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
    const remat::search::TrialResult r = remat::engine::RunTrial(o);
    const auto& k = r.ranks.at(0);
    nlohmann::json j = {{"policy", r.policy.ToString()},
                        {"status", remat::search::Name(r.status)},
                        {"peak_allocated_bytes", k.peak_allocated_bytes},
                        {"peak_reserved_bytes", k.peak_reserved_bytes},
                        {"static_bytes", k.static_bytes},
                        {"alloc_retries", k.alloc_retries},
                        {"step_time_s", r.step_time_s},
                        {"step_time_spread_s", r.step_time_spread_s},
                        {"tokens_per_s", r.tokens_per_s},
                        {"model_tflops", r.model_tflops},
                        {"loss", r.loss},
                        {"grad_norm", r.grad_norm},
                        {"setup_s", r.setup_s},
                        {"message", r.message}};
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
