// The command executor: an operator-configured command template, run once per trial with
// /bin/sh -c in its own process group; the job launches its own ranks (e.g. torchrun) and writes
// the metrics file the worker reads afterwards.
#include <algorithm>
#include <filesystem>

#include "worker/metrics_file.h"
#include "worker/result_combiner.h"
#include "worker/trial_executor.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;
using search::TrialStatus;

class CommandExecutor : public TrialExecutor {
 public:
  explicit CommandExecutor(CommandExecutorOptions options) : options_(std::move(options)) {}

  search::TrialResult Run(const TrialContext& context) override {
    const Assignment& a = *context.assignment;
    const search::SearchOptions& so = a.spec.search;
    const std::string& name = so.command_template;
    auto it = options_.templates.find(name);
    if (it == options_.templates.end()) {
      std::string known;
      for (const auto& [n, t] : options_.templates) known += (known.empty() ? "" : ", ") + n;
      return StatusResult(TrialStatus::kFailed,
                          "search.command_template '" + name +
                              "' is not configured on this worker (configured: " +
                              (known.empty() ? "none" : known) + ")");
    }
    const CommandTemplate& templ = it->second;
    const int world = a.world_size;
    const int warmup = so.warmup_steps;
    const int measure = so.measure_steps;
    const fs::path dir(context.trial_dir);
    const std::string metrics_path = (dir / "metrics.json").string();
    std::string gpus;
    bool any_gpu = false;
    for (int r = 0; r < world && r < static_cast<int>(context.slots.size()); ++r) {
      gpus += (r ? "," : "") + std::to_string(context.slots[r].index);
      any_gpu = any_gpu || context.slots[r].gpu;
    }
    std::map<std::string, std::string> values = {
        {"overrides", ShellQuoteWords(a.policy.MegatronBridgeOverrides())},
        {"megatron_lm_flags", ShellQuoteWords(a.policy.MegatronLmFlags())},
        {"metrics_file", ShellQuote(metrics_path)},
        {"nproc", std::to_string(world)},
        {"gpus", gpus},
        {"policy", ShellQuote(a.policy_name)},
        {"trial_id", ShellQuote(a.trial_id)},
        {"warmup_steps", std::to_string(warmup)},
        {"measure_steps", std::to_string(measure)},
        // Room for the longest warm-up the steady-state rule may take (search/steady_state.h).
        {"train_iters", std::to_string(std::max(warmup, so.warmup_max_steps) + measure)},
        {"micro_batch_size", std::to_string(a.spec.train.micro_batch_size)},
        {"seq_length", std::to_string(a.spec.model.seq_length)},
    };
    auto command = ExpandCommand(templ.command, values);
    if (!command.ok()) {
      return StatusResult(TrialStatus::kFailed, std::string(command.status().message()));
    }

    ChildSpec child;
    child.argv = {"/bin/sh", "-c", *command};
    child.env = templ.env;
    child.env.emplace_back("NCCL_NVLS_ENABLE", "0");
    if (any_gpu) child.env.emplace_back("CUDA_VISIBLE_DEVICES", gpus);
    child.env.emplace_back("REMAT_METRICS_FILE", metrics_path);
    child.env.emplace_back("REMAT_WARMUP_STEPS", std::to_string(warmup));
    child.env.emplace_back("REMAT_MEASURE_STEPS", std::to_string(measure));
    child.env.emplace_back("REMAT_POLICY", a.policy_name);
    child.env.emplace_back("REMAT_TRIAL_ID", a.trial_id);
    child.stdout_path = (dir / "stdout.log").string();
    child.stderr_path = (dir / "stderr.log").string();
    child.cwd = templ.workdir.empty() ? dir.string() : templ.workdir;

    const GroupLimits limits = TrialGroupLimits(options_.limits, so.trial_timeout_s, dir.string());
    GroupOutcome outcome = RunProcessGroup({child}, limits, context.cancel);
    const ChildExit& exit = outcome.children[0];
    if (outcome.cancelled) return StatusResult(TrialStatus::kCancelled, "cancelled");
    if (outcome.timed_out) {
      return StatusResult(TrialStatus::kTimeout,
                          "command killed after search.trial_timeout_s = " +
                              std::to_string(static_cast<int>(limits.timeout_s)) + " s");
    }
    auto tail = [&] {
      std::string t = FileTail(child.stderr_path);
      if (t.empty()) t = FileTail(child.stdout_path);
      return t.empty() ? std::string() : ": " + t;
    };
    auto metrics = ReadMetricsFiles(metrics_path);
    if (metrics.ok()) {
      search::TrialResult result = MetricsToResult(a, *metrics);
      if (!exit.ok() && result.status == TrialStatus::kOk) {
        result.status = TrialStatus::kFailed;
        result.message = "command " + exit.Describe() + tail();
      } else if (!exit.ok() && result.status == TrialStatus::kFailed &&
                 (LogMentionsOom(child.stderr_path) || LogMentionsOom(child.stdout_path))) {
        result.status = TrialStatus::kOom;
      }
      return result;
    }
    if (!exit.ok()) {
      const bool oom = LogMentionsOom(child.stderr_path) || LogMentionsOom(child.stdout_path);
      return StatusResult(oom ? TrialStatus::kOom : TrialStatus::kFailed,
                          "command " + exit.Describe() + tail());
    }
    return StatusResult(TrialStatus::kFailed,
                        "command exited 0 but " + std::string(metrics.status().message()));
  }

 private:
  CommandExecutorOptions options_;
};

}  // namespace

std::unique_ptr<TrialExecutor> MakeCommandExecutor(CommandExecutorOptions options) {
  return std::make_unique<CommandExecutor>(std::move(options));
}

}  // namespace remat::worker
