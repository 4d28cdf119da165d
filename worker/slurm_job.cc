// The pure parts of Slurm jobs (worker/slurm_job.h).
#include "worker/slurm_job.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "worker/assignment.h"

namespace remat::worker {

using search::TrialStatus;

std::string LastLine(const std::string& text) {
  std::string t = text;
  while (!t.empty() && (t.back() == '\n' || t.back() == ' ')) t.pop_back();
  const size_t nl = t.rfind('\n');
  return nl == std::string::npos ? t : t.substr(nl + 1);
}

namespace {

int CeilDiv(int a, int b) { return (a + b - 1) / b; }

}  // namespace

SlurmLayoutOrError PlanSlurmLayout(int world, search::Device device, int gpus_per_node) {
  SlurmLayoutOrError out;
  world = std::max(1, world);
  const bool gpu =
      device == search::Device::kCuda || (device == search::Device::kAuto && gpus_per_node > 0);
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

std::vector<std::string> SbatchArguments(const SlurmLauncherOptions& options,
                                         const SlurmLayout& layout, const std::string& job_name,
                                         const std::string& comment, const std::string& trial_dir,
                                         double trial_timeout_s) {
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
  if (layout.gpus_per_node > 0)
    args.push_back("--gres=gpu:" + std::to_string(layout.gpus_per_node));
  if (!options.partition.empty()) args.push_back("--partition=" + options.partition);
  if (!options.account.empty()) args.push_back("--account=" + options.account);
  if (!options.qos.empty()) args.push_back("--qos=" + options.qos);
  args.push_back("--time=" + (options.time_limit.empty() ? SlurmTimeLimit(trial_timeout_s)
                                                         : options.time_limit));
  for (const std::string& extra : options.extra_sbatch_args) args.push_back(extra);
  return args;
}

bool SlurmJobInfo::terminal() const {
  static const char* const kEnded[] = {"COMPLETED", "FAILED",       "CANCELLED",     "TIMEOUT",
                                       "NODE_FAIL", "BOOT_FAIL",    "OUT_OF_MEMORY", "DEADLINE",
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

std::string SlurmAccountFor(const SlurmLauncherOptions& options, const std::string& owner) {
  if (auto it = options.user_accounts.find(owner);
      !owner.empty() && it != options.user_accounts.end()) {
    return it->second;
  }
  return options.account;
}

absl::StatusOr<std::map<std::string, std::string>> ReadSlurmUserAccounts(const std::string& path) {
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
    return StatusResult(TrialStatus::kTimeout, ended + ": Slurm's time limit (--time) ended it");
  }
  if (info.state == "OUT_OF_MEMORY") {
    return StatusResult(TrialStatus::kFailed,
                        ended +
                            ": out of host memory in the job's cgroup (not the policy's GPU "
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

}  // namespace remat::worker
