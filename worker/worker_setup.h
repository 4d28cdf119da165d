// The worker's set-up from its operator's choices, shared by remat-worker (worker/
// remat_worker_main.cc) and `remat search` (cli/local_search.cc): which backends it offers (the
// builtin engine's remat-trial, command templates, the megatron driver with its Megatron Core)
// and the software versions it reports. Flags are read by the mains; what they mean, and the
// errors for what is wrong with them, live here, once.
//
// Errors: InvalidArgument (exit 2) names the flag for a bad value; FailedPrecondition (exit 1)
// for what the installation lacks (no remat-trial where one is required). Thread-safety: reads
// files and runs `remat-trial --version` (ProbeVersions); safe from any thread.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "worker/worker_daemon.h"

namespace remat::worker {

struct BackendFlags {
  enum class Builtin {
    kIfPresent,  // offered when remat-trial is found (a warning when it is not)
    kRequired,   // a missing remat-trial is an error (`remat search` with backend builtin)
    kOff,        // not offered (`remat search` with another backend)
  };
  Builtin builtin = Builtin::kIfPresent;
  std::string trial_binary;       // --trial-binary; "" = remat-trial beside the program
  std::string command_templates;  // --command-templates YAML file; "" = no command backend
  bool megatron = false;          // offer the megatron backend
  std::string megatron_path;      // --megatron-path; "" = the megatron-core installed for python
  std::string megatron_driver;    // --megatron-driver; "" = found beside the program
  std::string python = "python3";
};

// Fills options->trial_binary, command_templates, megatron_driver/python/path and versions.
// `program_dir` is where the running program lives (common::SelfDir()); `program` its name for
// messages ("remat-worker", "remat"). *warning: a line to log, or "".
absl::Status SetUpBackends(const BackendFlags& flags, const std::string& program_dir,
                           const std::string& program, WorkerDaemonOptions* options,
                           std::string* warning);

}  // namespace remat::worker
