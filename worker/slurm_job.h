// The pure parts of running trials as Slurm jobs (worker/slurm_launcher.h): the launcher's
// options, how a trial is laid out over nodes, sbatch's arguments, and reading what sbatch,
// squeue, scontrol and sacct answer. Thread-safety: pure functions (ReadSlurmUserAccounts reads
// a file).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "search/spec.h"
#include "search/trial.h"

namespace remat::worker {

struct SlurmLauncherOptions {
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

// A short stable tag (16 hex digits) for a worker's host and work dir.
std::string SlurmWorkerTag(const std::string& hostname, const std::string& work_dir);

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
std::vector<std::string> SbatchArguments(const SlurmLauncherOptions& options,
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
std::string SlurmAccountFor(const SlurmLauncherOptions& options, const std::string& owner);
// Reads --slurm-user-accounts: "USER ACCOUNT" lines, '#' comments. InvalidArgument naming the
// file and line for anything else (a user named twice included).
absl::StatusOr<std::map<std::string, std::string>> ReadSlurmUserAccounts(const std::string& path);

// The last line of a command's output, trailing newlines and spaces dropped.
std::string LastLine(const std::string& text);

// The job id in `sbatch --parsable` output ("123" or "123;cluster"); "" when there is none.
std::string ParseSbatchJobId(const std::string& output);

// The status and message a job's end gives a trial whose rank results are missing or
// incomplete (see the header comment); `job` names the job in the message.
search::TrialResult SlurmJobEndResult(const std::string& job, const SlurmJobInfo& info);

}  // namespace remat::worker
