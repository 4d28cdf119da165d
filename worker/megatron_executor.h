// The megatron executor (`search.backend: megatron`): a trial run by Megatron Core itself.
//
// The megatron backend (worker/trial_pipeline.h, MakeMegatronBackend) under any launcher; this
// header's MakeMegatronExecutor is it on the local launcher. One driver process per rank
// (worker/megatron_driver/remat_megatron_driver.py, run with the operator's Python), as the
// builtin backend runs remat-trial:
//
//   <trial dir>/[depth-<N>/]spec.json          the resolved spec (remat.v1.SearchSpec as JSON,
//                                              proto field names), cut to N layers at a proxy depth
//   <python> <driver> --spec spec.json --policy P --metrics metrics.json --rank r --world-size W
//            --rendezvous rendezvous/ --collective-timeout S [--megatron-path DIR]
//   metrics.json.rank<r>                       the rank's result in the worker's metrics format
//   stdout-<r>.log, stderr-<r>.log
//
// The policy is checked with search::ValidatePolicy first (status invalid, not run). The driver
// maps the spec to Megatron's settings; what it cannot map it refuses (status invalid, its
// reason). Depth proxies: the pipeline runs the ranks at each proxy depth through the one
// depth-proxy driver (search/proxy_driver.h: the cut spec, no budget of its own, the full depth
// predicted from the two). Failures map to
// statuses: a rank out of device memory (its file, or its log) -> oom; a crash or a rank with no
// file -> failed with the rank's stderr tail; the trial timeout -> timeout; cancel -> cancelled.
// Thread-safety: Run may be called concurrently for different trials.
#pragma once

#include <memory>
#include <string>

#include "worker/process_runner.h"
#include "worker/trial_executor.h"

namespace remat::worker {

struct MegatronExecutorOptions {
  std::string python = "python3";  // the interpreter with torch (CUDA) installed
  std::string driver;              // path of remat_megatron_driver.py
  // A Megatron-LM checkout (or a folder holding megatron/core) put first on the driver's
  // sys.path; "" uses an installed megatron-core. Never downloaded.
  std::string megatron_path;
  double collective_timeout_s = 300;  // torch.distributed's timeout; capped at the trial timeout
  GroupLimits limits;                 // timeout_s is taken from each trial's spec
};

std::unique_ptr<TrialExecutor> MakeMegatronExecutor(MegatronExecutorOptions options);

// Where a program in `program_dir` finds the driver: megatron_driver/remat_megatron_driver.py
// beside it (a build copies it there), else ../share/remat/megatron_driver/ (the worker package
// installs it there). "" when neither is readable.
std::string FindMegatronDriver(const std::string& program_dir);

}  // namespace remat::worker
