// The Slurm executor: every leased trial becomes a Slurm batch job, so nothing that holds a GPU
// runs outside Slurm (remat-worker --executor slurm; worker/README.md, "Slurm").
//
// A trial of world size W is one job:
//   sbatch --parsable --job-name=remat-<trial>.<attempt> --comment=remat:trial=<trial>.<attempt>
//          --nodes=N --ntasks=W --ntasks-per-node=P [--gres=gpu:P] [--partition/--account/--qos]
//          --time=T --export=PATH,LD_LIBRARY_PATH,TMPDIR --requeue [operator's flags] job.sh
//   job.sh:  clears what a previous run of the job left (results, rendezvous), then
//            srun --kill-on-bad-exit=1 --wait=60 -o stdout-%t.log -e stderr-%t.log rank.sh
//   rank.sh: rank = SLURM_PROCID (checked against SLURM_NTASKS = W); one GPU per rank (the
//            SLURM_LOCALID-th of the node's CUDA_VISIBLE_DEVICES; none at all on CPU trials);
//            runs remat-trial --request request-<rank>.pb --result result-<rank>.pb and leaves
//            its exit status in exit-<rank>.
// GPU trials: P = min(W, gpus_per_node) ranks per node, N = ceil(W / P) nodes, one GPU each; the
// ranks meet through the rendezvous folder in the trial's folder (NCCL's id travels there), so
// across nodes the work dir must be on a file system every node mounts at the same path. CPU
// trials run on one node (the engine's TCP collectives are loopback-only), with no GRES.
//
// While the job lives, the executor follows it with one batched query per poll interval for
// all of its jobs together (`squeue -t all --jobs=ID,ID,...`, and one `sacct -j ID,...` for the
// jobs the controller has already forgotten; SlurmExecutorOptions::poll_interval_s, flag
// --slurm-poll-interval), so the controller sees one request per interval however many trials
// run. Jobs are charged to --slurm-account, or to the account the operator maps the search's
// owner to (--slurm-user-accounts). Cancellation, and a job that has RUNNING longer than
// search.trial_timeout_s, are ended with `scancel` (status cancelled / timeout); Slurm's own
// --time is a backstop one minute past that. How the job ended becomes the trial's result:
// the ranks' result files, combined as for builtin (worker/result_combiner.h), and for
// what the files cannot say, the job's state: TIMEOUT/DEADLINE -> timeout; OUT_OF_MEMORY ->
// failed (host memory in the job's cgroup, not the policy's GPU memory: the engine reports a
// GPU OOM itself, as oom); NODE_FAIL, BOOT_FAIL, CANCELLED by someone else -> failed, with the
// state and reason in the message. Time queued does not count against the trial's timeout, and
// a job Slurm requeues (node failure, preemption) starts its clock again.
//
// Thread-safety: Run may be called concurrently for different trials (each job is its own).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/trial_executor.h"

namespace remat::worker {

struct SlurmExecutorOptions {
  std::string trial_binary;  // remat-trial, at a path every compute node sees
  std::string partition;     // "" = the cluster's default
  std::string account;  // "" = the submitting user's default account
  // The search owner's Slurm account, where the operator maps it (user -> account): a trial is
  // charged to the account of the user who submitted its search, others to `account`. The
  // owner comes from the coordinator's authentication, never from the spec, so a user cannot
  // charge someone else's account. The jobs still run as the worker's Unix user.
  std::map<std::string, std::string> user_accounts;
  std::string qos;
  std::string time_limit;  // Slurm --time as given; "" = trial_timeout_s + 1 minute
  int gpus_per_node = 0;   // 0: CPU-only nodes: no GRES; trials with device cuda are refused
  std::vector<std::string> extra_sbatch_args;  // the operator's own flags, after ours
  double collective_timeout_s = 300;           // handed to each rank; capped at the trial timeout
  double peer_exit_grace_s = 60;               // srun --wait: ranks left after one ended
  // Seconds between the executor's batched queries of its jobs' states (one squeue for all).
  double poll_interval_s = 1;
  double command_timeout_s = 30;               // each sbatch/scontrol/scancel/sacct call
  // Added to every job's comment as "remat:worker=<tag>": the jobs of a worker on this host and
  // work dir (SlurmWorkerTag), so the next worker there can end what a killed one left.
  std::string worker_tag;
  // The Slurm commands (names are looked up in PATH; tests may point them elsewhere).
  std::string sbatch = "sbatch", scontrol = "scontrol", scancel = "scancel", sacct = "sacct",
              squeue = "squeue";
};

std::unique_ptr<TrialExecutor> MakeSlurmExecutor(SlurmExecutorOptions options);

// A short stable tag (16 hex digits) for a worker's host and work dir.
std::string SlurmWorkerTag(const std::string& hostname, const std::string& work_dir);

// Cancels this user's queued or running jobs whose comment carries options.worker_tag: trials of
// a previous worker on the same host and work dir that died without ending them (its leases
// expire and the coordinator runs those trials again). Returns the job ids cancelled, or an
// error message in *error when squeue could not be asked. Call before the daemon starts.
std::vector<std::string> CancelOrphanedSlurmJobs(const SlurmExecutorOptions& options,
                                                 const std::string& scratch_dir,
                                                 std::string* error);

// ---- The pure parts, exposed for tests.

struct SlurmLayout {
  int nodes = 1;
  int tasks = 1;
  int tasks_per_node = 1;
  int gpus_per_node = 0;  // GRES gpu:N per node; 0: none
};
// How a trial of `world` ranks is laid out; an error message (naming the flag or field) when it
// cannot run on this cluster.
struct SlurmLayoutOrError {
  SlurmLayout layout;
  std::string error;
};
SlurmLayoutOrError PlanSlurmLayout(int world, search::Device device, int gpus_per_node);

// sbatch's arguments (without the program name) for one trial's job.
std::vector<std::string> SbatchArguments(const SlurmExecutorOptions& options,
                                         const SlurmLayout& layout, const std::string& job_name,
                                         const std::string& comment,
                                         const std::string& trial_dir, double trial_timeout_s);

// Slurm --time for a trial timeout: whole minutes, rounded up, plus one ("M" or "H:MM:00").
std::string SlurmTimeLimit(double trial_timeout_s);

// What one `scontrol show job -o ID` line (or a `sacct -P -o State,ExitCode,Reason` row) says.
struct SlurmJobInfo {
  std::string state;  // JobState, e.g. RUNNING, COMPLETED, TIMEOUT ("CANCELLED by 0" -> CANCELLED)
  std::string reason;
  int exit_code = 0;  // ExitCode=a:b -> a
  int signal = 0;     //             -> b
  bool terminal() const;  // the job has ended and will not run again by itself
  bool started() const;   // RUNNING or later (not PENDING, CONFIGURING, REQUEUED...)
};
std::optional<SlurmJobInfo> ParseScontrolJob(const std::string& line);
std::optional<SlurmJobInfo> ParseSacctJob(const std::string& output);
// The batched poll's answers, by job id: `squeue -h -O JobID:|,State:|,Reason:|,exit_code:|`
// rows (exit_code is the raw wait status) and `sacct -n -X -P -o JobID,State,ExitCode,Reason`
// rows. Rows that cannot be read are skipped.
std::map<std::string, SlurmJobInfo> ParseSqueueJobs(const std::string& output);
std::map<std::string, SlurmJobInfo> ParseSacctJobs(const std::string& output);

// The account a trial of `owner`'s search is charged to (options.user_accounts, else
// options.account).
std::string SlurmAccountFor(const SlurmExecutorOptions& options, const std::string& owner);
// Reads --slurm-user-accounts: "USER ACCOUNT" lines, '#' comments. InvalidArgument naming the
// file and line for anything else (a user named twice included).
absl::StatusOr<std::map<std::string, std::string>> ReadSlurmUserAccounts(const std::string& path);

// The job id in `sbatch --parsable` output ("123" or "123;cluster"); "" when there is none.
std::string ParseSbatchJobId(const std::string& output);

// The status and message a job's end gives a trial whose rank results are missing or
// incomplete (see the header comment); `job` names the job in the message.
search::TrialResult SlurmJobEndResult(const std::string& job, const SlurmJobInfo& info);

}  // namespace remat::worker
