// The trial pipeline: a worker's executor for a backend is that backend composed with a launcher
// (worker/launcher.h), so every backend runs under every launcher:
//
//              local launcher (this machine)   slurm launcher (sbatch/srun, across nodes)
//   builtin    remat-trial per rank            remat-trial per rank, srun's tasks
//   megatron   the Megatron driver per rank    the Megatron driver per rank, srun's tasks
//   command    the template, one process       the template, the job's batch step
//
// A Backend says what runs (argv, environment, the files it needs, per rank or one process for
// the trial) and how a run's result is read. The pipeline (MakeTrialExecutor) does the rest, the
// same for all: the backend's refusals first; search.proxy_layers through the one depth-proxy
// driver (search/proxy_driver.h: one run per depth in <trial dir>/depth-<N>/, unless the backend's
// processes run the depths themselves, as remat-trial does); the environment of every trial
// process (TrialEnvironment); the launch; the run's result; a Slurm job's end where the
// processes left no word.
//
// Thread-safety: a Backend's methods are const and may run concurrently for different trials.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "search/spec.h"
#include "search/trial.h"
#include "worker/command_template.h"
#include "worker/launcher.h"
#include "worker/trial_executor.h"

namespace remat::worker {

class Backend {
 public:
  virtual ~Backend() = default;
  // A result when the trial must not run on this worker at all (a template not configured, a
  // policy the backend refuses); nullopt to run it. Nothing has run yet.
  virtual std::optional<search::TrialResult> Refuse(const Assignment& assignment) const = 0;
  // True when the backend's own processes run search.proxy_layers (remat-trial does): the
  // pipeline then runs the trial once, with the full spec.
  virtual bool RunsDepthProxies() const { return false; }
  // One run of `spec` (the trial's, or a proxy depth's cut: search::DepthRunSpec) in
  // plan->run_dir (exists): writes the files it needs there and fills plan->per_rank and
  // plan->processes. "" or what failed (one line; the trial fails with it).
  virtual std::string Prepare(const TrialContext& context, const search::SearchSpec& spec,
                              LaunchPlan* plan) const = 0;
  // The run's result from what its processes left (outcome.ended is not set).
  virtual search::TrialResult Read(const TrialContext& context, const search::SearchSpec& spec,
                                   const LaunchPlan& plan, const LaunchOutcome& outcome,
                                   double peer_exit_grace_s) const = 0;
};

std::unique_ptr<TrialExecutor> MakeTrialExecutor(std::shared_ptr<const Backend> backend,
                                                 std::shared_ptr<Launcher> launcher);

// The environment every process of every trial gets from its spec, whatever the backend or the
// launcher: the one place a spec setting becomes an environment variable of the trial's
// processes (the Slurm launcher writes it into the job's scripts).
std::vector<std::pair<std::string, std::string>> TrialEnvironment(const search::SearchSpec& spec);

// ---- The backends.

// builtin: remat-trial per rank (request-R.pb in, result-R.pb out; rendezvous/ in the run dir).
struct BuiltinBackendOptions {
  std::string trial_binary;           // remat-trial, at a path the launcher's hosts see
  double collective_timeout_s = 300;  // handed to each rank; capped at the trial timeout
};
std::unique_ptr<Backend> MakeBuiltinBackend(BuiltinBackendOptions options);

// megatron: the Megatron Core driver per rank (worker/megatron_executor.h says the hand-off).
struct MegatronBackendOptions {
  std::string python = "python3";  // the interpreter with torch (CUDA) installed
  std::string driver;              // path of remat_megatron_driver.py
  // A Megatron-LM checkout (or a folder holding megatron/core) put first on the driver's
  // sys.path; "" uses an installed megatron-core. Never downloaded.
  std::string megatron_path;
  double collective_timeout_s = 300;  // torch.distributed's timeout; capped at the trial timeout
};
std::unique_ptr<Backend> MakeMegatronBackend(MegatronBackendOptions options);

// command: an operator-configured template (worker/command_template.h), one process that starts
// the trial's ranks itself and writes the metrics file (worker/metrics_file.h).
struct CommandBackendOptions {
  std::map<std::string, CommandTemplate> templates;  // by name; only these may run
};
std::unique_ptr<Backend> MakeCommandBackend(CommandBackendOptions options);

}  // namespace remat::worker
