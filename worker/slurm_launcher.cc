// The Slurm launcher (worker/slurm_launcher.h): one Slurm batch job per run.
#include "worker/slurm_launcher.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "worker/command_template.h"  // ShellQuote
#include "worker/slurm_poller.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using search::TrialStatus;

// A job neither squeue nor sacct can describe for this long is given up (and scancelled).
constexpr double kLostAfterS = 600;

std::string Seconds(double s) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.4g s", s);
  return buf;
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool WriteFile(const fs::path& path, const std::string& text, mode_t mode) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out || !(out << text)) return false;
  }
  return chmod(path.c_str(), mode) == 0;
}

class SlurmLauncher : public Launcher {
 public:
  explicit SlurmLauncher(SlurmLauncherOptions options)
      : options_(std::move(options)), poller_(options_) {}

  double peer_exit_grace_s() const override { return options_.peer_exit_grace_s; }

  LaunchOutcome Launch(const TrialContext& context, const LaunchPlan& plan) override {
    const Assignment& a = *context.assignment;
    LaunchOutcome out;
    const int world = std::max(1, a.world_size);
    const SlurmLayoutOrError planned =
        PlanSlurmLayout(world, a.spec.search.device, options_.gpus_per_node);
    if (!planned.error.empty()) {
      out.ended = StatusResult(TrialStatus::kFailed, planned.error);
      return out;
    }
    const SlurmLayout& layout = planned.layout;
    const fs::path dir(plan.run_dir);
    const std::string name = a.trial_id + "." + std::to_string(a.attempt);
    if (!WriteFile(dir / "job.sh",
                   SlurmJobScript(a.trial_id, a.attempt, layout, plan, options_.peer_exit_grace_s),
                   0755) ||
        !WriteFile(dir / "rank.sh", SlurmRankScript(plan, world, layout.gpus_per_node > 0), 0755)) {
      out.ended =
          StatusResult(TrialStatus::kFailed, "cannot write the job's scripts in " + dir.string());
      return out;
    }
    std::vector<std::string> argv = {options_.sbatch};
    std::string comment = "remat:trial=" + name;
    if (!options_.worker_tag.empty()) comment += " remat:worker=" + options_.worker_tag;
    SlurmLauncherOptions job_options = options_;
    job_options.account = SlurmAccountFor(options_, a.owner);
    for (std::string& arg : SbatchArguments(job_options, layout, "remat-" + name, comment,
                                            dir.string(), plan.timeout_s)) {
      argv.push_back(std::move(arg));
    }
    argv.push_back((dir / "job.sh").string());
    SlurmCommandResult submitted =
        RunSlurmCommand(argv, dir.string(), "sbatch", options_.command_timeout_s);
    const std::string job = ParseSbatchJobId(submitted.out);
    if (!submitted.ok || job.empty()) {
      std::string why = LastLine(submitted.err);
      if (why.empty()) why = "sbatch " + submitted.how;
      out.ended = StatusResult(TrialStatus::kFailed, "Slurm refused the trial's job: " + why);
      return out;
    }
    Follow(context, plan, job, &out);
    return out;
  }

 private:
  // Follows `job` until it ends, is cancelled or runs past the plan's timeout; our own clock
  // starts when it starts running. The job's state comes from the batched poll.
  void Follow(const TrialContext& context, const LaunchPlan& plan, const std::string& job,
              LaunchOutcome* out) {
    const std::string job_name = "Slurm job " + job;
    const std::string dir = plan.run_dir;
    poller_.Add(job);
    struct Forget {
      SlurmJobPoller* poller;
      std::string job;
      ~Forget() { poller->Remove(job); }
    } forget{&poller_, job};
    uint64_t generation = 0;
    bool running = false;  // the job runs (its current run, after a requeue)
    Clock::time_point running_since = Clock::now();
    Clock::time_point last_answer = Clock::now();
    SlurmJobInfo info;
    bool ended_once = false;  // a failed end seen once: the next poll confirms it
    while (true) {
      if (context.cancel && context.cancel->cancelled()) {
        Cancel(job, dir);
        out->ended =
            StatusResult(TrialStatus::kCancelled, "cancelled (" + job_name + " scancelled)");
        return;
      }
      if (std::optional<SlurmJobInfo> now = poller_.Next(job, dir, &generation)) {
        info = *now;
        last_answer = Clock::now();
        // A requeue (scontrol requeue, a node failure, a preemption) ends the job's run before
        // Slurm queues it again, and a poll can fall in between: the real Slurm test saw FAILED
        // for a job requeued a second earlier. So an end other than COMPLETED is taken only when
        // the next poll still says the job has ended; a COMPLETED job is never requeued.
        if (info.terminal() && (info.state == "COMPLETED" || ended_once)) break;
        ended_once = info.terminal();
        if (ended_once) continue;
        if (info.started() && !running) running_since = Clock::now();
        // Requeued (node failure, preemption): the next run gets the whole timeout again.
        running = info.started();
      } else if (Since(last_answer) > kLostAfterS) {
        Cancel(job, dir);
        out->ended = StatusResult(TrialStatus::kFailed, "neither squeue nor sacct knew " +
                                                            job_name + " for " +
                                                            Seconds(kLostAfterS) + " (scancelled)");
        return;
      }
      if (running && Since(running_since) > plan.timeout_s) {
        Cancel(job, dir);
        std::string msg = "killed after search.trial_timeout_s = " +
                          Seconds(context.assignment->spec.search.trial_timeout_s) + " (" +
                          job_name + " scancelled)";
        const std::string tail = FileTail(RankStderrPath(dir, 0), 3, 600);
        if (!tail.empty()) msg += "; rank 0 stderr: " + tail;
        out->ended = StatusResult(TrialStatus::kTimeout, msg);
        return;
      }
      // The next poll paces the loop (Next waits for it).
    }
    out->elapsed_s = running ? Since(running_since) : 0;
    // Each process's end from its exit file; one without a file went down with the job.
    out->group.children.resize(plan.processes.size());
    for (size_t i = 0; i < plan.processes.size(); ++i) {
      ChildExit& e = out->group.children[i];
      e.started = true;
      const std::string text = ReadSmallFile(dir + "/exit-" + std::to_string(i));
      if (!text.empty()) {
        e.exited = true;
        e.exit_code = std::atoi(text.c_str());
      }
    }
    out->lost_how = "was killed with " + job_name + " (" + info.state + ")";
    if (info.state == "COMPLETED" || info.state == "FAILED") {
      // The job ran to its end: the processes' files say it all.
      const std::string tail = FileTail(dir + "/slurm.log", 3, 600);
      if (!tail.empty()) out->job_log_tail = job_name + ": " + tail;
    } else {
      out->job_end = SlurmJobEndResult(job_name, info);
    }
  }

  std::optional<SlurmJobInfo> Query(const std::string& job, const std::string& dir) const {
    SlurmCommandResult shown = RunSlurmCommand({options_.scontrol, "show", "job", "-o", job}, dir,
                                               "scontrol", options_.command_timeout_s);
    if (shown.ok) {
      if (auto info = ParseScontrolJob(shown.out)) return info;
    }
    // The controller forgets finished jobs after MinJobAge; accounting remembers them.
    SlurmCommandResult acct = RunSlurmCommand(
        {options_.sacct, "-n", "-X", "-P", "-j", job, "-o", "State,ExitCode,Reason"}, dir, "sacct",
        options_.command_timeout_s);
    if (acct.ok) return ParseSacctJob(acct.out);
    return std::nullopt;
  }

  // scancel, then wait (bounded) until Slurm says the job has ended, so no rank outlives the
  // trial's report.
  void Cancel(const std::string& job, const std::string& dir) const {
    RunSlurmCommand({options_.scancel, job}, dir, "scancel", options_.command_timeout_s);
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      std::optional<SlurmJobInfo> info = Query(job, dir);
      if (!info || (info->terminal() && info->state != "COMPLETING")) return;
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_interval_s));
    }
  }

  SlurmLauncherOptions options_;
  SlurmJobPoller poller_;
};

}  // namespace

std::string SlurmJobScript(const std::string& trial_id, int attempt, const SlurmLayout& layout,
                           const LaunchPlan& plan, double peer_exit_grace_s) {
  std::ostringstream s;
  s << "#!/bin/sh\n"
    << "# remat trial " << trial_id << " attempt " << attempt << ": " << layout.tasks
    << " rank(s) on " << layout.nodes << " node(s) (worker/slurm_launcher.h)\n"
    << "# A requeued run (node failure, preemption) starts clean: nothing of the run before.\n"
    << "rm -rf exit-*";
  // The backends' own names and patterns (no spaces, no quotes): globbed in the run's folder.
  for (const std::string& stale : plan.stale) s << " " << stale;
  for (const std::string& fresh : plan.fresh_dirs) s << " && mkdir -p " << ShellQuote(fresh);
  s << " || exit 1\n";
  if (plan.per_rank) {
    // --kill-on-bad-exit: a rank that crashed takes the step down (ranks that merely OOM exit 0
    // with their result); --wait: ranks still running this long after one ended are stuck in a
    // collective its peer will never join.
    s << "exec srun --kill-on-bad-exit=1 --wait="
      << std::max(1, static_cast<int>(peer_exit_grace_s))
      << " --output=stdout-%t.log --error=stderr-%t.log ./rank.sh\n";
  } else {
    s << "exec ./rank.sh > stdout-0.log 2> stderr-0.log\n";
  }
  return s.str();
}

std::string SlurmRankScript(const LaunchPlan& plan, int world, bool gpu) {
  std::ostringstream s;
  s << "#!/bin/sh\n";
  if (plan.per_rank) {
    s << "r=\"${SLURM_PROCID:?not started by srun}\"\n"
      << "if [ \"${SLURM_NTASKS:-}\" != " << world << " ]; then\n"
      << "  echo \"remat: SLURM_NTASKS=${SLURM_NTASKS:-unset}, the trial has " << world
      << " ranks\" >&2\n"
      << "  exit 2\n"
      << "fi\n";
  } else {
    s << "r=0  # one process for the whole trial: it starts the ranks itself\n";
  }
  if (!gpu) {
    s << "export CUDA_VISIBLE_DEVICES=   # a CPU trial holds no GPU Slurm did not give it\n";
  } else if (plan.per_rank) {
    // Slurm sets CUDA_VISIBLE_DEVICES to the node's allocated GPUs (GRES); the rank takes the
    // SLURM_LOCALID-th, so each rank sees exactly one, as with the local launcher.
    s << "if [ -n \"${CUDA_VISIBLE_DEVICES:-}\" ]; then\n"
      << "  CUDA_VISIBLE_DEVICES=$(printf '%s' \"$CUDA_VISIBLE_DEVICES\" | cut -d, "
         "-f$((${SLURM_LOCALID:-0} + 1)))\n"
      << "  export CUDA_VISIBLE_DEVICES\n"
      << "fi\n";
  }  // else: the whole-trial process keeps every GPU Slurm gave the job
  s << "export NCCL_NVLS_ENABLE=0\n"
    << "d=" << ShellQuote(plan.run_dir) << "\n"
    << "case \"$r\" in\n";
  const std::string cwd = plan.cwd.empty() ? plan.run_dir : plan.cwd;
  for (size_t i = 0; i < plan.processes.size(); ++i) {
    const LaunchProcess& p = plan.processes[i];
    s << "  " << i << ") (";
    for (const auto& [key, value] : p.env)
      s << "export " << key << "=" << ShellQuote(value) << "; ";
    s << "cd " << ShellQuote(cwd) << " && exec";
    for (const std::string& word : p.argv) s << " " << ShellQuote(word);
    s << ") ;;\n";
  }
  s << "  *) echo \"remat: no rank $r in this trial\" >&2; exit 2 ;;\n"
    << "esac\n"
    << "rc=$?\n"
    << "echo $rc > \"$d/exit-$r.tmp\" && mv \"$d/exit-$r.tmp\" \"$d/exit-$r\"\n"
    << "exit $rc\n";
  return s.str();
}

std::unique_ptr<Launcher> MakeSlurmLauncher(SlurmLauncherOptions options) {
  return std::make_unique<SlurmLauncher>(std::move(options));
}

absl::StatusOr<std::vector<std::string>> CancelOrphanedSlurmJobs(
    const SlurmLauncherOptions& options, const std::string& scratch_dir) {
  std::vector<std::string> cancelled;
  if (options.worker_tag.empty()) return cancelled;
  std::error_code ec;
  fs::create_directories(scratch_dir, ec);
  SlurmCommandResult listed = RunSlurmCommand({options.squeue, "--me", "-h", "-o", "%i|%k"},
                                              scratch_dir, "squeue", options.command_timeout_s);
  if (!listed.ok) {
    return absl::UnavailableError("squeue " + listed.how + ": " + LastLine(listed.err));
  }
  const std::string mark = "remat:worker=" + options.worker_tag;
  std::istringstream lines(listed.out);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t bar = line.find('|');
    if (bar == std::string::npos) continue;
    std::istringstream words(line.substr(bar + 1));
    std::string word;
    bool ours = false;
    while (words >> word) ours = ours || word == mark;
    if (!ours) continue;
    const std::string id = line.substr(0, bar);
    if (RunSlurmCommand({options.scancel, id}, scratch_dir, "scancel", options.command_timeout_s)
            .ok) {
      cancelled.push_back(id);
    }
  }
  return cancelled;
}

}  // namespace remat::worker
