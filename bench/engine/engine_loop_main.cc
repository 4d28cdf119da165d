// remat-bench-engine --spec FILE.yaml --policies P1;P2;... : runs each policy of one spec with the
// trial engine, one after the other in this process (one rank), and prints one JSON line per trial
// (engine/result_json.h, as remat-trial --json). For benchmarks only: remat-trial runs one trial
// per process.

#include <iostream>

#include "bench/engine/bench_args.h"
#include "engine/result_json.h"
#include "engine/trial_runner.h"

int main(int argc, char** argv) {
  auto args = remat::bench::ParseBenchArgs(
      argc, argv, "remat-bench-engine --spec FILE.yaml --policies 'P1;P2;...'",
      /*policies_required=*/true);
  if (!args) return 2;
  for (const remat::search::Policy& policy : args->policies) {
    remat::engine::TrialOptions o;
    o.spec = args->spec;
    o.policy = policy;
    std::cout << remat::engine::TrialResultJson(remat::engine::RunTrial(o)) << std::endl;
  }
  return 0;
}
