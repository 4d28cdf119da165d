// The command executor: an operator-configured command template, run once per trial with
// /bin/sh -c in its own process group; the job launches its own ranks (e.g. torchrun) and writes
// the metrics file the worker reads afterwards. With depth proxies it runs once per proxy depth.
#include <algorithm>
#include <chrono>
#include <filesystem>

#include "search/depth_proxy.h"
#include "search/rules.h"
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
    const auto& depths = so.proxy_layers;
    const auto start = std::chrono::steady_clock::now();
    if (depths.empty()) {
      return RunAt(context, templ, a.spec, /*capped=*/true, context.trial_dir, so.trial_timeout_s);
    }

    // Depth proxies, as the builtin engine runs them (engine/trial_runner.cc RunDepthProxies):
    // the policy checked against the full spec (a full:block/uniform policy that the depths
    // cannot extrapolate is invalid), the job run at each depth in a folder of its own with no
    // memory cap, and the full depth predicted from the two (search::PredictFullDepth). The two
    // runs share the trial's timeout, as the engine's ranks do.
    const search::Status valid = search::ValidatePolicy(a.spec, a.policy);
    if (!valid.ok()) return StatusResult(TrialStatus::kInvalid, valid.message());
    std::vector<search::TrialResult> measured;
    for (int layers : depths) {
      const search::SearchSpec cut = search::AtDepth(a.spec, layers);
      const fs::path sub = fs::path(context.trial_dir) / ("depth-" + std::to_string(layers));
      std::error_code ec;
      fs::create_directories(sub, ec);
      if (ec) {
        return StatusResult(TrialStatus::kFailed,
                            "cannot create " + sub.string() + ": " + ec.message());
      }
      const double spent =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      measured.push_back(RunAt(context, templ, cut, /*capped=*/false, sub.string(),
                               std::max(0.001, so.trial_timeout_s - spent)));
      if (measured.back().status != TrialStatus::kOk) break;
    }
    if (measured.size() < 2) measured.push_back(measured.front());
    return search::PredictFullDepth(a.spec, measured[0], measured[1]);
  }

 private:
  // One run of the template for `spec` (the trial's, or it cut to a proxy depth) in `run_dir`,
  // killed after `timeout_s`.
  search::TrialResult RunAt(const TrialContext& context, const CommandTemplate& templ,
                            const search::SearchSpec& spec, bool capped, const std::string& run_dir,
                            double timeout_s) {
    const Assignment& a = *context.assignment;
    const search::SearchOptions& so = spec.search;
    const int world = a.world_size;
    const fs::path dir(run_dir);
    const std::string metrics_path = (dir / "metrics.json").string();
    CommandRun run;
    run.assignment = &a;
    run.spec = &spec;
    run.capped = capped;
    run.slots = context.slots;
    run.metrics_path = metrics_path;
    const std::map<std::string, std::string> values = CommandValues(run);
    std::string gpus;
    bool any_gpu = false;
    for (int r = 0; r < world && r < static_cast<int>(context.slots.size()); ++r) {
      gpus += (r ? "," : "") + std::to_string(context.slots[r].index);
      any_gpu = any_gpu || context.slots[r].gpu;
    }
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
    child.env.emplace_back("REMAT_WARMUP_STEPS", std::to_string(so.warmup_steps));
    child.env.emplace_back("REMAT_MEASURE_STEPS", std::to_string(so.measure_steps));
    child.env.emplace_back("REMAT_MEMORY_BUDGET_BYTES", values.at("memory_budget_bytes"));
    child.env.emplace_back("REMAT_NUM_LAYERS", values.at("num_layers"));
    child.env.emplace_back("REMAT_POLICY", a.policy_name);
    child.env.emplace_back("REMAT_TRIAL_ID", a.trial_id);
    child.stdout_path = (dir / "stdout.log").string();
    child.stderr_path = (dir / "stderr.log").string();
    child.cwd = templ.workdir.empty() ? dir.string() : templ.workdir;

    // The group record stays in the trial folder, where a restarted worker looks for it.
    const GroupLimits limits = TrialGroupLimits(options_.limits, timeout_s, context.trial_dir);
    GroupOutcome outcome = RunProcessGroup({child}, limits, context.cancel);
    const ChildExit& exit = outcome.children[0];
    if (outcome.cancelled) return StatusResult(TrialStatus::kCancelled, "cancelled");
    if (outcome.timed_out) {
      return StatusResult(TrialStatus::kTimeout, "command killed after search.trial_timeout_s = " +
                                                     ShortestDecimal(so.trial_timeout_s) + " s");
    }
    auto tail = [&] {
      std::string t = FileTail(child.stderr_path);
      if (t.empty()) t = FileTail(child.stdout_path);
      return t.empty() ? std::string() : ": " + t;
    };
    auto metrics = ReadMetricsFiles(metrics_path);
    if (metrics.ok()) {
      search::TrialResult result = MetricsToResult(a, *metrics);
      // A job that died after writing its figures (the callback rewrites them after every
      // step): out of memory when its log says so (an OOM the callback did not see, e.g. in a
      // rank torchrun ended first), else failed.
      if (!exit.ok() &&
          (result.status == TrialStatus::kOk || result.status == TrialStatus::kFailed)) {
        const bool oom = LogMentionsOom(child.stderr_path) || LogMentionsOom(child.stdout_path);
        if (result.status == TrialStatus::kOk)
          result.message = "command " + exit.Describe() + tail();
        result.status = oom ? TrialStatus::kOom : TrialStatus::kFailed;
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

  CommandExecutorOptions options_;
};

}  // namespace

std::unique_ptr<TrialExecutor> MakeCommandExecutor(CommandExecutorOptions options) {
  return std::make_unique<CommandExecutor>(std::move(options));
}

}  // namespace remat::worker
