// Launchers: WHERE the processes of one trial run (worker/README.md, "Backends and launchers").
// A backend (worker/trial_pipeline.h) says WHAT they are: a LaunchPlan of argv and environment,
// one process per rank or one process that starts the trial's ranks itself.
//
//   local  this machine's slots, one process group (worker/process_runner.h): rank r on slots[r]
//          (CUDA_VISIBLE_DEVICES its GPU), a whole-trial process on all the trial's GPUs
//   slurm  one Slurm batch job per run (worker/slurm_launcher.h): per-rank plans are srun's
//          tasks, across nodes; a whole-trial process is the job's batch step on its first node
//
// Every launcher starts each process in plan.cwd with RankStdoutPath / RankStderrPath of
// plan.run_dir as its logs (stdout-<i>.log, stderr-<i>.log; i: the rank for per-rank plans), adds the environment every trial gets
// (NCCL_NVLS_ENABLE=0: NVLink multicast can take a shared host's GPUs out of service; the GPU
// assignment), and reports how each process ended. Thread-safety: Launch may be called
// concurrently for different trials.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "search/trial.h"
#include "worker/process_runner.h"
#include "worker/trial_executor.h"

namespace remat::worker {

// One process a backend asks for.
struct LaunchProcess {
  std::vector<std::string> argv;  // argv[0] at a path the launcher's hosts see
  std::vector<std::pair<std::string, std::string>> env;  // over the launcher's environment
};

struct LaunchPlan {
  std::string run_dir;  // an existing folder of this run (the trial's, or a proxy depth's)
  std::string cwd;      // "" = run_dir
  // per_rank: processes[r] is rank r (world_size of them); else one process that starts the
  // trial's ranks itself (a command template's torchrun, say) on all the trial's devices.
  bool per_rank = true;
  std::vector<LaunchProcess> processes;
  double timeout_s = 0;  // this run's limit (a proxy depth has what is left of the trial's)
  // What a run that starts again in the same folder (a Slurm job requeued after a node failure)
  // must not find: names or shell patterns in run_dir, removed before each start; then
  // fresh_dirs are created empty (a rendezvous folder).
  std::vector<std::string> stale;
  std::vector<std::string> fresh_dirs;
};

struct LaunchOutcome {
  // The run ended without its processes' outputs to read: cancelled, timed out, refused (no
  // slots, sbatch said no). The trial's result as it is.
  std::optional<search::TrialResult> ended;
  GroupOutcome group;  // how each process ended (children[i]), as the local runner reports it
  // How a process that started but left no exit status ended ("was killed with Slurm job 7
  // (OUT_OF_MEMORY)"); "" : ChildExit::Describe.
  std::string lost_how;
  // What the Slurm job's end says (SlurmJobEndResult) when the processes' own outputs cannot
  // say it (some rank left nothing); nullopt for the local launcher, or a job that ran to its
  // end (COMPLETED, FAILED).
  std::optional<search::TrialResult> job_end;
  std::string job_log_tail;  // the end of the job's own log (slurm.log); "" when none
  double elapsed_s = 0;

  std::string Describe(int process) const {
    const ChildExit& e = group.children.at(process);
    if (!lost_how.empty() && e.started && !e.exited && e.signal == 0) return lost_how;
    return e.Describe();
  }
};

class Launcher {
 public:
  virtual ~Launcher() = default;
  virtual LaunchOutcome Launch(const TrialContext& context, const LaunchPlan& plan) = 0;
  // The grace a rank gets after its peer finished (for the collector's "stuck" message).
  virtual double peer_exit_grace_s() const = 0;
};

// This machine's slots; `limits` bound each run (timeout_s is the plan's). The group record goes
// in context.trial_dir (kGroupRecordFile), where a restarted worker looks for it.
std::unique_ptr<Launcher> MakeLocalLauncher(GroupLimits limits);

}  // namespace remat::worker
