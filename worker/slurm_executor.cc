// The Slurm executor (worker/slurm_executor.h): one Slurm batch job per trial.
#include "worker/slurm_executor.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/read_file.h"
#include "proto/convert.h"
#include "worker/command_template.h"  // ShellQuote
#include "worker/result_combiner.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using search::TrialStatus;

// A job neither scontrol nor sacct can describe for this long is given up (and scancelled).
constexpr double kLostAfterS = 600;

std::string Seconds(double s) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.4g s", s);
  return buf;
}

bool WriteFile(const fs::path& path, const std::string& text, mode_t mode) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    if (!out || !(out << text)) return false;
  }
  return chmod(path.c_str(), mode) == 0;
}

// What sbatch, squeue and the job's ranks wrote; "" when it is not a regular file of at most
// 1 MiB (the job's directory is the job's: a FIFO there must not block the worker).
std::string ReadSmallFile(const fs::path& path) {
  return common::ReadRegularFile(path.string(), 1u << 20).text.value_or("");
}

// The job's batch script: srun starts the W ranks. --kill-on-bad-exit: a rank that crashed takes
// the step down (the engine's ranks that merely OOM exit 0 with their result); --wait: ranks
// still running this long after one ended are stuck in a collective its peer will never join.
std::string JobScript(const std::string& trial_id, int attempt, const SlurmLayout& layout,
                      double peer_exit_grace_s) {
  std::ostringstream s;
  s << "#!/bin/sh\n"
    << "# remat trial " << trial_id << " attempt " << attempt << ": " << layout.tasks
    << " rank(s) on " << layout.nodes << " node(s), started by srun (worker/slurm_executor.h)\n"
    << "# A requeued run (node failure, preemption) starts clean: nothing of the run before.\n"
    << "rm -rf rendezvous exit-* result-*.pb && mkdir rendezvous || exit 1\n"
    << "exec srun --kill-on-bad-exit=1 --wait=" << std::max(1, static_cast<int>(peer_exit_grace_s))
    << " --output=stdout-%t.log --error=stderr-%t.log ./rank.sh\n";
  return s.str();
}

// One rank: its number from Slurm's environment, one GPU of the node's (or none), remat-trial,
// and its exit status left for the worker (srun reports only the worst).
std::string RankScript(const std::string& trial_binary, int world, bool gpu) {
  std::ostringstream s;
  s << "#!/bin/sh\n"
    << "r=\"${SLURM_PROCID:?not started by srun}\"\n"
    << "if [ \"${SLURM_NTASKS:-}\" != " << world << " ]; then\n"
    << "  echo \"remat: SLURM_NTASKS=${SLURM_NTASKS:-unset}, the trial has " << world
    << " ranks\" >&2\n"
    << "  exit 2\n"
    << "fi\n";
  if (gpu) {
    // Slurm sets CUDA_VISIBLE_DEVICES to the node's allocated GPUs (GRES); the rank takes the
    // SLURM_LOCALID-th, so each rank sees exactly one, as with the local executor.
    s << "if [ -n \"${CUDA_VISIBLE_DEVICES:-}\" ]; then\n"
      << "  CUDA_VISIBLE_DEVICES=$(printf '%s' \"$CUDA_VISIBLE_DEVICES\" | cut -d, -f$((${SLURM_LOCALID:-0} + 1)))\n"
      << "  export CUDA_VISIBLE_DEVICES\n"
      << "fi\n";
  } else {
    s << "export CUDA_VISIBLE_DEVICES=   # a CPU trial holds no GPU Slurm did not give it\n";
  }
  s << "export NCCL_NVLS_ENABLE=0\n"
    << ShellQuote(trial_binary) << " --request \"request-$r.pb\" --result \"result-$r.pb\"\n"
    << "rc=$?\n"
    << "echo $rc > \"exit-$r.tmp\" && mv \"exit-$r.tmp\" \"exit-$r\"\n"
    << "exit $rc\n";
  return s.str();
}

struct CommandResult {
  bool ok = false;  // started and exited 0
  std::string out, err, how;
};

CommandResult RunCommand(const std::vector<std::string>& argv, const fs::path& dir,
                         const std::string& name, double timeout_s) {
  ChildSpec child;
  child.argv = argv;
  child.stdout_path = (dir / (name + ".out")).string();
  child.stderr_path = (dir / (name + ".err")).string();
  child.cwd = dir.string();
  GroupLimits limits;
  limits.timeout_s = timeout_s;
  limits.kill_grace_s = 2;
  GroupOutcome outcome = RunProcessGroup({child}, limits, nullptr);
  CommandResult r;
  r.out = ReadSmallFile(child.stdout_path);
  r.err = ReadSmallFile(child.stderr_path);
  r.ok = !outcome.timed_out && outcome.children[0].ok();
  r.how = outcome.timed_out ? "gave no answer within " + Seconds(timeout_s)
                            : outcome.children[0].Describe();
  return r;
}

std::string LastLine(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

// One batched query of every job this executor follows, per poll interval, shared by the
// trials' threads: the first thread whose answer is older than the interval asks Slurm about
// all of them (one squeue; one sacct for the jobs the controller has forgotten), the others wait
// for that answer. 64 running trials cost one squeue a second, not 64 scontrol calls.
class SlurmJobPoller {
 public:
  explicit SlurmJobPoller(const SlurmExecutorOptions& options) : options_(options) {}

  // Follow `job` until the matching Remove (counted: Next never waits for a job no poll asks
  // about).
  void Add(const std::string& job) {
    std::lock_guard<std::mutex> lock(mu_);
    ++jobs_[job];
  }
  void Remove(const std::string& job) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = jobs_.find(job); it != jobs_.end() && --it->second == 0) jobs_.erase(it);
  }

  // The state of `job` from a poll newer than *generation (updated), waiting for one when
  // needed (at most about one poll interval plus the query); nullopt when Slurm could not say.
  // `dir` holds the query's output files when this thread is the one that asks.
  std::optional<SlurmJobInfo> Next(const std::string& job, const fs::path& dir,
                                   uint64_t* generation) {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      if (generation_ > *generation && answered_.count(job) != 0) {
        *generation = generation_;
        auto it = answers_.find(job);
        return it == answers_.end() ? std::nullopt : it->second;
      }
      const auto due = last_poll_ + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(options_.poll_interval_s));
      if (!polling_ && Clock::now() >= due) {
        polling_ = true;
        std::set<std::string> jobs;
        for (const auto& [j, count] : jobs_) jobs.insert(j);
        jobs.insert(job);  // always this caller's, whatever the bookkeeping says
        lock.unlock();
        std::map<std::string, SlurmJobInfo> found = QueryAll(jobs, dir);
        lock.lock();
        polling_ = false;
        last_poll_ = Clock::now();
        ++generation_;
        ++polls_;
        answered_ = jobs;
        answers_.clear();
        for (const std::string& j : jobs) {
          auto it = found.find(j);
          if (it != found.end()) answers_[j] = it->second;
        }
        cv_.notify_all();
        continue;
      }
      if (polling_) {
        cv_.wait_for(lock, std::chrono::seconds(1));
      } else {
        cv_.wait_until(lock, due);
      }
    }
  }

 private:
  std::map<std::string, SlurmJobInfo> QueryAll(const std::set<std::string>& jobs,
                                               const fs::path& dir) const {
    std::map<std::string, SlurmJobInfo> found;
    if (jobs.empty()) return found;
    std::string list;
    for (const std::string& j : jobs) list += (list.empty() ? "" : ",") + j;
    // -t all: finished jobs too, while the controller remembers them (MinJobAge).
    CommandResult listed = RunCommand({options_.squeue, "-h", "-t", "all", "--jobs=" + list,
                                       "-O", "JobID:|,State:|,Reason:|,exit_code:|"},
                                      dir, "squeue", options_.command_timeout_s);
    if (listed.ok) found = ParseSqueueJobs(listed.out);
    // What the controller has forgotten (or an squeue that failed: it fails outright when every
    // id in the list is unknown), accounting remembers.
    std::string missing;
    for (const std::string& j : jobs) {
      if (found.count(j) == 0) missing += (missing.empty() ? "" : ",") + j;
    }
    if (!missing.empty()) {
      CommandResult acct = RunCommand({options_.sacct, "-n", "-X", "-P", "-j", missing, "-o",
                                       "JobID,State,ExitCode,Reason"},
                                      dir, "sacct", options_.command_timeout_s);
      if (acct.ok) {
        for (auto& [id, info] : ParseSacctJobs(acct.out)) found.emplace(id, info);
      }
    }
    return found;
  }

  const SlurmExecutorOptions& options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, int> jobs_;  // followed jobs, with how many trials follow each
  std::set<std::string> answered_;  // the jobs the last poll asked about
  std::map<std::string, std::optional<SlurmJobInfo>> answers_;
  uint64_t generation_ = 0;
  uint64_t polls_ = 0;
  bool polling_ = false;
  Clock::time_point last_poll_{};
};

class SlurmExecutor : public TrialExecutor {
 public:
  explicit SlurmExecutor(SlurmExecutorOptions options)
      : options_(std::move(options)), poller_(options_) {}

  search::TrialResult Run(const TrialContext& context) override {
    const Assignment& a = *context.assignment;
    const int world = std::max(1, a.world_size);
    const SlurmLayoutOrError planned =
        PlanSlurmLayout(world, a.spec.search.device, options_.gpus_per_node);
    if (!planned.error.empty()) return StatusResult(TrialStatus::kFailed, planned.error);
    const SlurmLayout& layout = planned.layout;
    const double timeout = a.spec.search.trial_timeout_s;
    const fs::path dir(context.trial_dir);
    const std::string name = a.trial_id + "." + std::to_string(a.attempt);

    if (std::string error = WriteTrialFiles(a, world, layout, timeout, dir); !error.empty()) {
      return StatusResult(TrialStatus::kFailed, error);
    }
    std::vector<std::string> argv = {options_.sbatch};
    std::string comment = "remat:trial=" + name;
    if (!options_.worker_tag.empty()) comment += " remat:worker=" + options_.worker_tag;
    SlurmExecutorOptions job_options = options_;
    job_options.account = SlurmAccountFor(options_, a.owner);
    for (std::string& arg : SbatchArguments(job_options, layout, "remat-" + name, comment,
                                            dir.string(), timeout)) {
      argv.push_back(std::move(arg));
    }
    argv.push_back((dir / "job.sh").string());
    CommandResult submitted = RunCommand(argv, dir, "sbatch", options_.command_timeout_s);
    const std::string job = ParseSbatchJobId(submitted.out);
    if (!submitted.ok || job.empty()) {
      std::string why = LastLine(submitted.err);
      if (why.empty()) why = "sbatch " + submitted.how;
      return StatusResult(TrialStatus::kFailed, "Slurm refused the trial's job: " + why);
    }
    const std::string job_name = "Slurm job " + job;

    // Follow the job until it ends; our own clock starts when it starts running. The job's
    // state comes from the executor's batched poll (SlurmJobPoller).
    poller_.Add(job);
    struct Forget {
      SlurmJobPoller* poller;
      std::string job;
      ~Forget() { poller->Remove(job); }
    } forget{&poller_, job};
    uint64_t generation = 0;
    bool running = false;  // the job runs (its current run, after a requeue)
    Clock::time_point running_since;
    Clock::time_point last_answer = Clock::now();
    SlurmJobInfo info;
    while (true) {
      if (context.cancel && context.cancel->cancelled()) {
        Cancel(job, dir);
        return StatusResult(TrialStatus::kCancelled, "cancelled (" + job_name + " scancelled)");
      }
      if (std::optional<SlurmJobInfo> now = poller_.Next(job, dir, &generation)) {
        info = *now;
        last_answer = Clock::now();
        if (info.terminal()) break;
        if (info.started() && !running) running_since = Clock::now();
        // Requeued (node failure, preemption): the next run gets the whole timeout again.
        running = info.started();
      } else if (std::chrono::duration<double>(Clock::now() - last_answer).count() >
                 kLostAfterS) {
        Cancel(job, dir);
        return StatusResult(TrialStatus::kFailed,
                            "neither scontrol nor sacct knew " + job_name + " for " +
                                Seconds(kLostAfterS) + " (scancelled)");
      }
      if (running &&
          std::chrono::duration<double>(Clock::now() - running_since).count() > timeout) {
        Cancel(job, dir);
        std::string msg = "killed after search.trial_timeout_s = " + Seconds(timeout) + " (" +
                          job_name + " scancelled)";
        const std::string tail = FileTail((dir / "stderr-0.log").string(), 3, 600);
        if (!tail.empty()) msg += "; rank 0 stderr: " + tail;
        return StatusResult(TrialStatus::kTimeout, msg);
      }
      // The next poll paces the loop (Next waits for it).
    }
    return Collect(a, world, dir, job_name, info);
  }

 private:
  std::string WriteTrialFiles(const Assignment& a, int world, const SlurmLayout& layout,
                              double timeout, const fs::path& dir) const {
    if (std::string error = WriteTrialRequests(
            a, dir.string(), std::min(options_.collective_timeout_s, timeout));
        !error.empty()) {
      return error;
    }
    if (!WriteFile(dir / "job.sh",
                   JobScript(a.trial_id, a.attempt, layout, options_.peer_exit_grace_s),
                   0755) ||
        !WriteFile(dir / "rank.sh",
                   RankScript(options_.trial_binary, world, layout.gpus_per_node > 0), 0755)) {
      return "cannot write the job's scripts in " + dir.string();
    }
    return "";
  }

  std::optional<SlurmJobInfo> Query(const std::string& job, const fs::path& dir) const {
    CommandResult shown = RunCommand({options_.scontrol, "show", "job", "-o", job}, dir,
                                     "scontrol", options_.command_timeout_s);
    if (shown.ok) {
      if (auto info = ParseScontrolJob(shown.out)) return info;
    }
    // The controller forgets finished jobs after MinJobAge; accounting remembers them.
    CommandResult acct = RunCommand({options_.sacct, "-n", "-X", "-P", "-j", job, "-o",
                                     "State,ExitCode,Reason"},
                                    dir, "sacct", options_.command_timeout_s);
    if (acct.ok) return ParseSacctJob(acct.out);
    return std::nullopt;
  }

  // scancel, then wait (bounded) until Slurm says the job has ended, so no rank outlives the
  // trial's report.
  void Cancel(const std::string& job, const fs::path& dir) const {
    RunCommand({options_.scancel, job}, dir, "scancel", options_.command_timeout_s);
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      std::optional<SlurmJobInfo> info = Query(job, dir);
      if (!info || (info->terminal() && info->state != "COMPLETING")) return;
      std::this_thread::sleep_for(std::chrono::duration<double>(options_.poll_interval_s));
    }
  }

  search::TrialResult Collect(const Assignment& a, int world, const fs::path& dir,
                              const std::string& job_name, const SlurmJobInfo& info) const {
    std::vector<search::TrialResult> per_rank;
    bool all_results = true;
    for (int r = 0; r < world; ++r) {
      const std::string prefix = "rank " + std::to_string(r) + ": ";
      const std::string exit_text = ReadSmallFile(dir / ("exit-" + std::to_string(r)));
      const bool exited = !exit_text.empty();
      const int exit_code = exited ? std::atoi(exit_text.c_str()) : -1;
      v1::TrialResult rank_file;
      const bool have =
          ReadResultFile((dir / ("result-" + std::to_string(r) + ".pb")).string(), &rank_file);
      if (have) {
        search::TrialResult rank_result = ResultFromWire(rank_file);
        if (rank_result.ranks.size() == 1) rank_result.ranks[0].rank = r;
        if (!rank_result.message.empty()) rank_result.message = prefix + rank_result.message;
        if (exit_code != 0 && rank_result.status == TrialStatus::kOk) {
          rank_result.status = TrialStatus::kFailed;
          rank_result.message = prefix + "remat-trial " +
                                (exited ? "exited with status " + std::to_string(exit_code)
                                        : std::string("was killed")) +
                                " after writing an ok result";
        }
        per_rank.push_back(std::move(rank_result));
        continue;
      }
      all_results = false;
      std::string msg = prefix + "remat-trial ";
      msg += exited ? "exited with status " + std::to_string(exit_code)
                    : "was killed with " + job_name + " (" + info.state + ")";
      msg += ", no result file";
      const std::string tail = FileTail((dir / ("stderr-" + std::to_string(r) + ".log")).string());
      if (!tail.empty()) msg += ": " + tail;
      per_rank.push_back(StatusResult(TrialStatus::kFailed, msg));
    }
    search::TrialResult combined = CombineRankResults(a, per_rank);
    // The files say it all when every rank wrote its result, or the job ran to its end.
    if (all_results || info.state == "COMPLETED" || info.state == "FAILED") {
      if (!all_results) {
        const std::string tail = FileTail((dir / "slurm.log").string(), 3, 600);
        if (!tail.empty()) combined.message += "; " + job_name + ": " + tail;
      }
      return combined;
    }
    search::TrialResult ended = SlurmJobEndResult(job_name, info);
    if (!combined.message.empty()) ended.message += "; " + combined.message;
    return ended;
  }

  SlurmExecutorOptions options_;
  SlurmJobPoller poller_;
};

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace

SlurmLayoutOrError PlanSlurmLayout(int world, search::Device device, int gpus_per_node) {
  SlurmLayoutOrError out;
  world = std::max(1, world);
  const bool gpu = device == search::Device::kCuda ||
                   (device == search::Device::kAuto && gpus_per_node > 0);
  if (gpu && gpus_per_node <= 0) {
    out.error =
        "search.device cuda: this Slurm worker submits to CPU nodes (start it with "
        "--slurm-gpus-per-node N for GPU nodes)";
    return out;
  }
  out.layout.tasks = world;
  if (!gpu) {
    // The engine's CPU collectives meet over loopback TCP: every rank on one node.
    out.layout.nodes = 1;
    out.layout.tasks_per_node = world;
    out.layout.gpus_per_node = 0;
    return out;
  }
  out.layout.nodes = CeilDiv(world, gpus_per_node);
  out.layout.tasks_per_node = CeilDiv(world, out.layout.nodes);
  out.layout.gpus_per_node = out.layout.tasks_per_node;
  return out;
}

std::string SlurmTimeLimit(double trial_timeout_s) {
  const long minutes = static_cast<long>(std::ceil(std::max(0.0, trial_timeout_s) / 60.0)) + 1;
  if (minutes < 60) return std::to_string(minutes);
  char buf[32];
  snprintf(buf, sizeof(buf), "%ld:%02ld:00", minutes / 60, minutes % 60);
  return buf;
}

std::vector<std::string> SbatchArguments(const SlurmExecutorOptions& options,
                                         const SlurmLayout& layout, const std::string& job_name,
                                         const std::string& comment,
                                         const std::string& trial_dir, double trial_timeout_s) {
  std::vector<std::string> args = {
      "--parsable",
      "--job-name=" + job_name,
      "--comment=" + comment,
      "--chdir=" + trial_dir,
      "--output=" + trial_dir + "/slurm.log",
      "--nodes=" + std::to_string(layout.nodes),
      "--ntasks=" + std::to_string(layout.tasks),
      "--ntasks-per-node=" + std::to_string(layout.tasks_per_node),
      // Not the worker's environment (its token, say): what the ranks need to start.
      "--export=PATH,LD_LIBRARY_PATH,TMPDIR",
      // After a node failure or a preemption Slurm may run the job again: job.sh starts each
      // run clean and the worker restarts the trial's clock, so a requeue costs time, not a trial.
      "--requeue",
  };
  if (layout.gpus_per_node > 0) args.push_back("--gres=gpu:" + std::to_string(layout.gpus_per_node));
  if (!options.partition.empty()) args.push_back("--partition=" + options.partition);
  if (!options.account.empty()) args.push_back("--account=" + options.account);
  if (!options.qos.empty()) args.push_back("--qos=" + options.qos);
  args.push_back("--time=" + (options.time_limit.empty() ? SlurmTimeLimit(trial_timeout_s)
                                                         : options.time_limit));
  for (const std::string& extra : options.extra_sbatch_args) args.push_back(extra);
  return args;
}

bool SlurmJobInfo::terminal() const {
  static const char* const kEnded[] = {"COMPLETED", "FAILED",    "CANCELLED",     "TIMEOUT",
                                       "NODE_FAIL", "BOOT_FAIL", "OUT_OF_MEMORY", "DEADLINE",
                                       "PREEMPTED", "SPECIAL_EXIT", "REVOKED"};
  for (const char* s : kEnded) {
    if (state == s) return true;
  }
  return false;
}

bool SlurmJobInfo::started() const {
  return state == "RUNNING" || state == "COMPLETING" || state == "SUSPENDED" ||
         state == "STOPPED" || state == "SIGNALING" || state == "STAGE_OUT" || terminal();
}

namespace {

void ParseExitCode(const std::string& value, SlurmJobInfo* info) {
  const size_t colon = value.find(':');
  info->exit_code = std::atoi(value.substr(0, colon).c_str());
  info->signal = colon == std::string::npos ? 0 : std::atoi(value.substr(colon + 1).c_str());
}

std::string FirstWord(const std::string& s) {
  const size_t end = s.find_first_of(" \t\n");
  return end == std::string::npos ? s : s.substr(0, end);
}

}  // namespace

std::optional<SlurmJobInfo> ParseScontrolJob(const std::string& line) {
  SlurmJobInfo info;
  bool have_state = false;
  std::istringstream words(line);
  std::string word;
  while (words >> word) {
    const size_t eq = word.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = word.substr(0, eq), value = word.substr(eq + 1);
    if (key == "JobState") {
      info.state = value;
      have_state = true;
    } else if (key == "Reason") {
      info.reason = value;
    } else if (key == "ExitCode") {
      ParseExitCode(value, &info);
    }
  }
  if (!have_state) return std::nullopt;
  return info;
}

std::optional<SlurmJobInfo> ParseSacctJob(const std::string& output) {
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::vector<std::string> fields;
    std::istringstream cols(line);
    std::string col;
    while (std::getline(cols, col, '|')) fields.push_back(col);
    if (fields.empty() || fields[0].empty()) continue;
    SlurmJobInfo info;
    info.state = FirstWord(fields[0]);  // "CANCELLED by 0"
    if (fields.size() > 1) ParseExitCode(fields[1], &info);
    if (fields.size() > 2) info.reason = fields[2];
    return info;
  }
  return std::nullopt;
}

std::map<std::string, SlurmJobInfo> ParseSqueueJobs(const std::string& output) {
  std::map<std::string, SlurmJobInfo> out;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    std::vector<std::string> fields;
    std::istringstream cols(line);
    std::string col;
    while (std::getline(cols, col, '|')) fields.push_back(col);
    if (fields.size() < 4) continue;
    auto trim = [](std::string v) {
      const size_t b = v.find_first_not_of(' ');
      const size_t e = v.find_last_not_of(' ');
      return b == std::string::npos ? std::string() : v.substr(b, e - b + 1);
    };
    const std::string id = trim(fields[0]);
    if (id.empty() || id.find_first_not_of("0123456789_") != std::string::npos) continue;
    SlurmJobInfo info;
    info.state = FirstWord(trim(fields[1]));
    info.reason = trim(fields[2]);
    // squeue's exit_code is the raw wait status: the code in bits 8-15, the signal in 0-6.
    const long status = std::atol(trim(fields[3]).c_str());
    info.exit_code = static_cast<int>((status >> 8) & 0xff);
    info.signal = static_cast<int>(status & 0x7f);
    if (info.state.empty()) continue;
    out[id] = info;
  }
  return out;
}

std::map<std::string, SlurmJobInfo> ParseSacctJobs(const std::string& output) {
  std::map<std::string, SlurmJobInfo> out;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t bar = line.find('|');
    if (bar == std::string::npos || bar == 0) continue;
    const std::string id = line.substr(0, bar);
    if (out.count(id) != 0) continue;  // the job's first row (its allocation)
    if (std::optional<SlurmJobInfo> info = ParseSacctJob(line.substr(bar + 1))) out[id] = *info;
  }
  return out;
}

std::string SlurmAccountFor(const SlurmExecutorOptions& options, const std::string& owner) {
  if (auto it = options.user_accounts.find(owner);
      !owner.empty() && it != options.user_accounts.end()) {
    return it->second;
  }
  return options.account;
}

absl::StatusOr<std::map<std::string, std::string>> ReadSlurmUserAccounts(
    const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError("--slurm-user-accounts: cannot read " + path);
  std::map<std::string, std::string> out;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::vector<std::string> fields;
    std::string w;
    while (words >> w) fields.push_back(w);
    if (fields.empty()) continue;
    const std::string where =
        "--slurm-user-accounts: " + path + ":" + std::to_string(number) + ": ";
    if (fields.size() != 2) return absl::InvalidArgumentError(where + "expected \"USER ACCOUNT\"");
    if (fields[1].find_first_of(",=") != std::string::npos) {
      return absl::InvalidArgumentError(where + "account \"" + fields[1] + "\" is not one name");
    }
    if (!out.emplace(fields[0], fields[1]).second) {
      return absl::InvalidArgumentError(where + "user " + fields[0] + " named twice");
    }
  }
  return out;
}

std::string ParseSbatchJobId(const std::string& output) {
  const std::string line = LastLine(output);
  const std::string id = line.substr(0, line.find(';'));
  if (id.empty() || id.find_first_not_of("0123456789_") != std::string::npos) return "";
  return id;
}

search::TrialResult SlurmJobEndResult(const std::string& job, const SlurmJobInfo& info) {
  const std::string reason =
      info.reason.empty() || info.reason == "None" ? "" : ", reason " + info.reason;
  const std::string ended = job + " ended " + info.state + reason;
  if (info.state == "TIMEOUT" || info.state == "DEADLINE") {
    return StatusResult(TrialStatus::kTimeout,
                        ended + ": Slurm's time limit (--time) ended it");
  }
  if (info.state == "OUT_OF_MEMORY") {
    return StatusResult(TrialStatus::kFailed,
                        ended + ": out of host memory in the job's cgroup (not the policy's GPU "
                                "memory); give the jobs more with --slurm-arg=--mem=...");
  }
  if (info.state == "CANCELLED") {
    return StatusResult(TrialStatus::kFailed,
                        ended + ": cancelled outside remat (scancel by a user or an admin)");
  }
  return StatusResult(TrialStatus::kFailed, ended);
}

std::string SlurmWorkerTag(const std::string& hostname, const std::string& work_dir) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a: stable across builds, unlike std::hash
  for (char c : hostname + ":" + work_dir) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  char buf[17];
  snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::vector<std::string> CancelOrphanedSlurmJobs(const SlurmExecutorOptions& options,
                                                 const std::string& scratch_dir,
                                                 std::string* error) {
  std::vector<std::string> cancelled;
  if (options.worker_tag.empty()) return cancelled;
  std::error_code ec;
  fs::create_directories(scratch_dir, ec);
  CommandResult listed = RunCommand({options.squeue, "--me", "-h", "-o", "%i|%k"}, scratch_dir,
                                    "squeue", options.command_timeout_s);
  if (!listed.ok) {
    *error = "squeue " + listed.how + ": " + LastLine(listed.err);
    return cancelled;
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
    if (RunCommand({options.scancel, id}, scratch_dir, "scancel", options.command_timeout_s).ok) {
      cancelled.push_back(id);
    }
  }
  return cancelled;
}

std::unique_ptr<TrialExecutor> MakeSlurmExecutor(SlurmExecutorOptions options) {
  return std::make_unique<SlurmExecutor>(std::move(options));
}

}  // namespace remat::worker
