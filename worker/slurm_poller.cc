// Slurm commands and the batched poll (worker/slurm_poller.h).
#include "worker/slurm_poller.h"

#include <cstdio>
#include <filesystem>

#include "common/read_file.h"
#include "worker/process_runner.h"

namespace remat::worker {

namespace fs = std::filesystem;

namespace {

std::string Seconds(double s) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.4g s", s);
  return buf;
}

}  // namespace

std::string ReadSmallFile(const std::string& path) {
  return common::ReadRegularFile(path, 1u << 20).text.value_or("");
}

SlurmCommandResult RunSlurmCommand(const std::vector<std::string>& argv,
                                   const std::string& dir_name, const std::string& name,
                                   double timeout_s) {
  const fs::path dir(dir_name);
  ChildSpec child;
  child.argv = argv;
  child.stdout_path = (dir / (name + ".out")).string();
  child.stderr_path = (dir / (name + ".err")).string();
  child.cwd = dir.string();
  GroupLimits limits;
  limits.timeout_s = timeout_s;
  limits.kill_grace_s = 2;
  GroupOutcome outcome = RunProcessGroup({child}, limits, nullptr);
  SlurmCommandResult r;
  r.out = ReadSmallFile(child.stdout_path);
  r.err = ReadSmallFile(child.stderr_path);
  r.ok = !outcome.timed_out && outcome.children[0].ok();
  r.how = outcome.timed_out ? "gave no answer within " + Seconds(timeout_s)
                            : outcome.children[0].Describe();
  return r;
}

void SlurmJobPoller::Add(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  ++jobs_[job];
}
void SlurmJobPoller::Remove(const std::string& job) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = jobs_.find(job); it != jobs_.end() && --it->second == 0) jobs_.erase(it);
}

std::optional<SlurmJobInfo> SlurmJobPoller::Next(const std::string& job, const std::string& dir,
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

std::map<std::string, SlurmJobInfo> SlurmJobPoller::QueryAll(const std::set<std::string>& jobs,
                                                             const std::string& dir) const {
  std::map<std::string, SlurmJobInfo> found;
  if (jobs.empty()) return found;
  std::string list;
  for (const std::string& j : jobs) list += (list.empty() ? "" : ",") + j;
  // -t all: finished jobs too, while the controller remembers them (MinJobAge).
  SlurmCommandResult listed = RunSlurmCommand({options_.squeue, "-h", "-t", "all", "--jobs=" + list,
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
    SlurmCommandResult acct = RunSlurmCommand(
        {options_.sacct, "-n", "-X", "-P", "-j", missing, "-o", "JobID,State,ExitCode,Reason"}, dir,
        "sacct", options_.command_timeout_s);
    if (acct.ok) {
      for (auto& [id, info] : ParseSacctJobs(acct.out)) found.emplace(id, info);
    }
  }
  return found;
}

}  // namespace remat::worker
