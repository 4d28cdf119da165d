// The trial pipeline (worker/trial_pipeline.h): a backend composed with a launcher.
#include "worker/trial_pipeline.h"

#include <filesystem>

#include "search/proxy_driver.h"
#include "worker/megatron_executor.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;
using search::TrialStatus;

class PipelineExecutor : public TrialExecutor {
 public:
  PipelineExecutor(std::shared_ptr<const Backend> backend, std::shared_ptr<Launcher> launcher)
      : backend_(std::move(backend)), launcher_(std::move(launcher)) {}

  search::TrialResult Run(const TrialContext& context) override {
    const Assignment& a = *context.assignment;
    if (auto refused = backend_->Refuse(a)) return *refused;
    if (a.spec.search.proxy_layers.empty() || backend_->RunsDepthProxies()) {
      return RunOnce(context, a.spec, context.trial_dir);
    }
    return search::RunDepthProxies(
        a.spec, a.policy, [&](const search::SearchSpec& cut, int layers) {
          return RunOnce(
              context, cut,
              (fs::path(context.trial_dir) / ("depth-" + std::to_string(layers))).string());
        });
  }

 private:
  // One run of `spec` in `run_dir`: prepared by the backend, launched, read.
  search::TrialResult RunOnce(const TrialContext& context, const search::SearchSpec& spec,
                              const std::string& run_dir) {
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec) {
      return StatusResult(TrialStatus::kFailed, "cannot create " + run_dir + ": " + ec.message());
    }
    LaunchPlan plan;
    plan.run_dir = run_dir;
    plan.timeout_s = spec.search.trial_timeout_s;
    if (std::string error = backend_->Prepare(context, spec, &plan); !error.empty()) {
      return StatusResult(TrialStatus::kFailed, error);
    }
    const auto env = TrialEnvironment(spec);
    for (LaunchProcess& p : plan.processes) p.env.insert(p.env.end(), env.begin(), env.end());
    const LaunchOutcome outcome = launcher_->Launch(context, plan);
    search::TrialResult result = outcome.ended ? *outcome.ended
                                               : backend_->Read(context, spec, plan, outcome,
                                                                launcher_->peer_exit_grace_s());
    // A Slurm job whose processes left no word (killed with the job): the job's end says why.
    if (!outcome.ended && result.status == TrialStatus::kFailed) {
      if (outcome.job_end) {
        search::TrialResult ended = *outcome.job_end;
        if (!result.message.empty()) ended.message += "; " + result.message;
        result = ended;
      } else if (!outcome.job_log_tail.empty()) {
        result.message += "; " + outcome.job_log_tail;
      }
    }
    result.wall_s = outcome.elapsed_s;
    return result;
  }

  std::shared_ptr<const Backend> backend_;
  std::shared_ptr<Launcher> launcher_;
};

}  // namespace

std::unique_ptr<TrialExecutor> MakeTrialExecutor(std::shared_ptr<const Backend> backend,
                                                 std::shared_ptr<Launcher> launcher) {
  return std::make_unique<PipelineExecutor>(std::move(backend), std::move(launcher));
}

std::vector<std::pair<std::string, std::string>> TrialEnvironment(const search::SearchSpec& spec) {
  std::vector<std::pair<std::string, std::string>> env;
  // search.allocator_conf: read by PyTorch's CUDA caching allocator at its first use, in
  // remat-trial, the Megatron driver and a command's own torch alike.
  if (!spec.search.allocator_conf.empty()) {
    env.emplace_back("PYTORCH_CUDA_ALLOC_CONF", spec.search.allocator_conf);
  }
  return env;
}

std::unique_ptr<TrialExecutor> MakeBuiltinExecutor(BuiltinExecutorOptions options) {
  return MakeTrialExecutor(MakeBuiltinBackend({options.trial_binary, options.collective_timeout_s}),
                           MakeLocalLauncher(options.limits));
}

std::unique_ptr<TrialExecutor> MakeCommandExecutor(CommandExecutorOptions options) {
  return MakeTrialExecutor(MakeCommandBackend({std::move(options.templates)}),
                           MakeLocalLauncher(options.limits));
}

std::unique_ptr<TrialExecutor> MakeMegatronExecutor(MegatronExecutorOptions options) {
  MegatronBackendOptions m;
  m.python = options.python;
  m.driver = options.driver;
  m.megatron_path = options.megatron_path;
  m.collective_timeout_s = options.collective_timeout_s;
  return MakeTrialExecutor(MakeMegatronBackend(std::move(m)), MakeLocalLauncher(options.limits));
}

}  // namespace remat::worker
