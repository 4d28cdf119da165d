// The command executor: an operator-configured command template, run once per trial with
// /bin/sh -c in its own process group; the job launches its own ranks (e.g. torchrun) and writes
// the metrics file the worker reads afterwards.
#include <filesystem>
#include <fstream>

#include "search/policy.h"
#include "worker/metrics_file.h"
#include "worker/result_combiner.h"
#include "worker/trial_executor.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;

// Whether the end of a log says the job ran out of device memory.
bool MentionsOom(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  in.seekg(0, std::ios::end);
  std::streamoff size = in.tellg();
  in.seekg(size > (1 << 18) ? size - (1 << 18) : 0);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* needle : {"CUDA out of memory", "OutOfMemoryError", "out of memory"}) {
    if (text.find(needle) != std::string::npos) return true;
  }
  return false;
}

class CommandExecutor : public TrialExecutor {
 public:
  explicit CommandExecutor(CommandExecutorOptions options) : options_(std::move(options)) {}

  v1::TrialResult Run(const TrialContext& context) override {
    const v1::TrialAssignment& a = *context.assignment;
    const auto& so = a.spec().search();
    const std::string& name = so.command_template();
    auto it = options_.templates.find(name);
    if (it == options_.templates.end()) {
      std::string known;
      for (const auto& [n, t] : options_.templates) known += (known.empty() ? "" : ", ") + n;
      return StatusResult(a, v1::TRIAL_STATUS_FAILED,
                          "search.command_template '" + name +
                              "' is not configured on this worker (configured: " +
                              (known.empty() ? "none" : known) + ")");
    }
    const CommandTemplate& templ = it->second;
    auto policy = search::ParsePolicy(a.policy().canonical());
    if (!policy.ok()) {
      return StatusResult(a, v1::TRIAL_STATUS_INVALID, policy.status().message());
    }
    const int world = std::max(1, a.world_size());
    const int warmup = so.has_warmup_steps() ? so.warmup_steps() : 2;
    const int measure = so.has_measure_steps() ? so.measure_steps() : 5;
    const fs::path dir(context.trial_dir);
    const std::string metrics_path = (dir / "metrics.json").string();
    std::string gpus;
    bool any_gpu = false;
    for (int r = 0; r < world && r < static_cast<int>(context.slots.size()); ++r) {
      gpus += (r ? "," : "") + std::to_string(context.slots[r].index);
      any_gpu = any_gpu || context.slots[r].gpu;
    }
    std::map<std::string, std::string> values = {
        {"overrides", ShellQuoteWords(policy->MegatronBridgeOverrides())},
        {"megatron_lm_flags", ShellQuoteWords(policy->MegatronLmFlags())},
        {"metrics_file", ShellQuote(metrics_path)},
        {"nproc", std::to_string(world)},
        {"gpus", gpus},
        {"policy", ShellQuote(a.policy().canonical())},
        {"trial_id", ShellQuote(a.trial_id())},
        {"warmup_steps", std::to_string(warmup)},
        {"measure_steps", std::to_string(measure)},
        {"train_iters", std::to_string(warmup + measure)},
        {"micro_batch_size", std::to_string(a.spec().train().has_micro_batch_size()
                                                ? a.spec().train().micro_batch_size()
                                                : 1)},
        {"seq_length", std::to_string(a.spec().model().seq_length())},
    };
    auto command = ExpandCommand(templ.command, values);
    if (!command.ok()) {
      return StatusResult(a, v1::TRIAL_STATUS_FAILED, std::string(command.status().message()));
    }

    ChildSpec child;
    child.argv = {"/bin/sh", "-c", *command};
    child.env = templ.env;
    child.env.emplace_back("NCCL_NVLS_ENABLE", "0");
    if (any_gpu) child.env.emplace_back("CUDA_VISIBLE_DEVICES", gpus);
    child.env.emplace_back("REMAT_METRICS_FILE", metrics_path);
    child.env.emplace_back("REMAT_WARMUP_STEPS", std::to_string(warmup));
    child.env.emplace_back("REMAT_MEASURE_STEPS", std::to_string(measure));
    child.env.emplace_back("REMAT_POLICY", a.policy().canonical());
    child.env.emplace_back("REMAT_TRIAL_ID", a.trial_id());
    child.stdout_path = (dir / "stdout.log").string();
    child.stderr_path = (dir / "stderr.log").string();
    child.cwd = templ.workdir.empty() ? dir.string() : templ.workdir;

    GroupLimits limits = options_.limits;
    limits.timeout_s = TrialTimeoutSeconds(a);
    GroupOutcome outcome = RunProcessGroup({child}, limits, context.cancel);
    const ChildExit& exit = outcome.children[0];
    if (outcome.cancelled) return StatusResult(a, v1::TRIAL_STATUS_CANCELLED, "cancelled");
    if (outcome.timed_out) {
      return StatusResult(a, v1::TRIAL_STATUS_TIMEOUT,
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
      v1::TrialResult result = MetricsToResult(a, *metrics);
      if (!exit.ok() && result.status() == v1::TRIAL_STATUS_OK) {
        result.set_status(v1::TRIAL_STATUS_FAILED);
        result.set_message("command " + exit.Describe() + tail());
      } else if (!exit.ok() && result.status() == v1::TRIAL_STATUS_FAILED &&
                 (MentionsOom(child.stderr_path) || MentionsOom(child.stdout_path))) {
        result.set_status(v1::TRIAL_STATUS_OOM);
      }
      return result;
    }
    if (!exit.ok()) {
      const bool oom = MentionsOom(child.stderr_path) || MentionsOom(child.stdout_path);
      return StatusResult(a, oom ? v1::TRIAL_STATUS_OOM : v1::TRIAL_STATUS_FAILED,
                          "command " + exit.Describe() + tail());
    }
    return StatusResult(a, v1::TRIAL_STATUS_FAILED,
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
