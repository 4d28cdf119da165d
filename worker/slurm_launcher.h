// The Slurm launcher (worker/launcher.h): every run of a trial (the trial, or one proxy depth of
// it) becomes a Slurm batch job, whatever the backend, so nothing that holds a GPU runs outside
// Slurm (remat-worker --executor slurm; worker/README.md, "Slurm").
//
// A run of a trial of world size W is one job, submitted from the run's folder:
//   sbatch --parsable --job-name=remat-<trial>.<attempt> --comment=remat:trial=<trial>.<attempt>
//          --nodes=N --ntasks=W --ntasks-per-node=P [--gres=gpu:P] [--partition/--account/--qos]
//          --time=T --export=PATH,LD_LIBRARY_PATH,TMPDIR --requeue [operator's flags] job.sh
//   job.sh:  clears what a previous run of the job left (the plan's stale outputs, exit files)
//            and makes its fresh folders (a rendezvous), then, for a per-rank plan (builtin,
//            megatron), srun --kill-on-bad-exit=1 --wait=60 -o stdout-%t.log -e stderr-%t.log
//            rank.sh; for a whole-trial plan (command), rank.sh as the batch step on the job's
//            first node, with the whole allocation (the template's own launcher, e.g. srun or
//            torchrun, spreads its ranks; SLURM_* says where).
//   rank.sh: rank = SLURM_PROCID (checked against SLURM_NTASKS = W); one GPU per rank (the
//            SLURM_LOCALID-th of the node's CUDA_VISIBLE_DEVICES; none at all on CPU trials);
//            the backend's environment and argv for that rank (in the plan's working folder),
//            and its exit status left in exit-<rank>.
// GPU trials: P = min(W, gpus_per_node) ranks per node, N = ceil(W / P) nodes, one GPU each; the
// ranks meet through the rendezvous folder in the run's folder (NCCL's id travels there), so
// across nodes the work dir must be on a file system every node mounts at the same path. CPU
// trials run on one node (the engine's TCP collectives are loopback-only), with no GRES.
//
// While the job lives, the launcher follows it with one batched query per poll interval for
// all of its jobs together (worker/slurm_poller.h; SlurmLauncherOptions::poll_interval_s, flag
// --slurm-poll-interval). Jobs are charged to --slurm-account, or to the account the operator
// maps the search's owner to (--slurm-user-accounts). Cancellation, and a job that has been
// RUNNING longer than the run's timeout, are ended with `scancel` (status cancelled / timeout);
// Slurm's own --time is a backstop one minute past that. How the job ended: each process's
// exit file, and for what the backend's files cannot say, the job's state (LaunchOutcome::
// job_end, SlurmJobEndResult): TIMEOUT/DEADLINE -> timeout; OUT_OF_MEMORY -> failed (host
// memory in the job's cgroup, not the policy's GPU memory: the backends report a GPU OOM
// themselves, as oom); NODE_FAIL, BOOT_FAIL, CANCELLED by someone else -> failed, with the state
// and reason in the message. Time queued does not count against the timeout, and a job Slurm
// requeues (node failure, preemption) starts its clock again. An end other than COMPLETED is
// taken only once a second poll still reports it: a requeue ends the run before Slurm queues
// the job again, and a poll that falls in between must not end the trial.
//
// Thread-safety: Launch may be called concurrently for different trials (each job is its own).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/launcher.h"
#include "worker/slurm_job.h"

namespace remat::worker {

std::unique_ptr<Launcher> MakeSlurmLauncher(SlurmLauncherOptions options);

// Cancels this user's queued or running jobs whose comment carries options.worker_tag: trials of
// a previous worker on the same host and work dir that died without ending them (its leases
// expire and the coordinator runs those trials again). Returns the job ids cancelled, or
// Unavailable (saying how squeue failed) when squeue could not be asked. Call before the daemon
// starts.
absl::StatusOr<std::vector<std::string>> CancelOrphanedSlurmJobs(
    const SlurmLauncherOptions& options, const std::string& scratch_dir);

// The batch script and the rank script of one run (exposed for tests).
std::string SlurmJobScript(const std::string& trial_id, int attempt, const SlurmLayout& layout,
                           const LaunchPlan& plan, double peer_exit_grace_s);
std::string SlurmRankScript(const LaunchPlan& plan, int world, bool gpu);

}  // namespace remat::worker
