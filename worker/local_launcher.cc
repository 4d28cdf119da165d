// The local launcher (worker/launcher.h): a run's processes as one process group on this
// machine's slots (worker/process_runner.h).
#include <cstdio>
#include <filesystem>

#include "worker/launcher.h"

namespace remat::worker {
namespace {

std::string Seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.4g s", s);
  return buf;
}

class LocalLauncher : public Launcher {
 public:
  explicit LocalLauncher(GroupLimits limits) : limits_(std::move(limits)) {}

  double peer_exit_grace_s() const override { return limits_.peer_exit_grace_s; }

  LaunchOutcome Launch(const TrialContext& context, const LaunchPlan& plan) override {
    LaunchOutcome out;
    const int world = context.assignment->world_size;
    const int have = static_cast<int>(context.slots.size());
    if (plan.per_rank && have < static_cast<int>(plan.processes.size())) {
      out.ended = StatusResult(search::TrialStatus::kFailed,
                               "worker gave the trial " + std::to_string(have) +
                                   " slots; it needs " + std::to_string(plan.processes.size()));
      return out;
    }
    // A whole-trial process sees every GPU of the trial's slots.
    std::string all_gpus;
    bool any_gpu = false;
    for (int r = 0; r < world && r < have; ++r) {
      all_gpus += (r ? "," : "") + std::to_string(context.slots[r].index);
      any_gpu = any_gpu || context.slots[r].gpu;
    }
    std::vector<ChildSpec> children;
    for (size_t i = 0; i < plan.processes.size(); ++i) {
      const int index = static_cast<int>(i);
      ChildSpec child;
      child.argv = plan.processes[i].argv;
      child.env.emplace_back("NCCL_NVLS_ENABLE", "0");
      if (plan.per_rank && context.slots[i].gpu) {
        child.env.emplace_back("CUDA_VISIBLE_DEVICES", std::to_string(context.slots[i].index));
      } else if (!plan.per_rank && any_gpu) {
        child.env.emplace_back("CUDA_VISIBLE_DEVICES", all_gpus);
      }
      for (const auto& kv : plan.processes[i].env) child.env.push_back(kv);
      child.stdout_path = RankStdoutPath(plan.run_dir, index);
      child.stderr_path = RankStderrPath(plan.run_dir, index);
      child.cwd = plan.cwd.empty() ? plan.run_dir : plan.cwd;
      children.push_back(std::move(child));
    }
    GroupLimits limits = limits_;
    limits.timeout_s = plan.timeout_s;
    // In the trial folder (not a proxy depth's), where a restarted worker looks for it.
    limits.group_record_path =
        (std::filesystem::path(context.trial_dir) / kGroupRecordFile).string();
    out.group = RunProcessGroup(children, limits, context.cancel);
    out.elapsed_s = out.group.elapsed_s;
    if (out.group.cancelled) {
      out.ended = StatusResult(search::TrialStatus::kCancelled, "cancelled");
    } else if (out.group.timed_out) {
      std::string msg = "killed after search.trial_timeout_s = " +
                        Seconds(context.assignment->spec.search.trial_timeout_s);
      const std::string tail = FileTail(RankStderrPath(plan.run_dir, 0), 3, 600);
      if (!tail.empty()) msg += "; rank 0 stderr: " + tail;
      out.ended = StatusResult(search::TrialStatus::kTimeout, msg);
    }
    return out;
  }

 private:
  GroupLimits limits_;
};

}  // namespace

std::unique_ptr<Launcher> MakeLocalLauncher(GroupLimits limits) {
  return std::make_unique<LocalLauncher>(std::move(limits));
}

}  // namespace remat::worker
