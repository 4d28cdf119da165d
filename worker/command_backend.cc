// The command backend (worker/trial_pipeline.h): an operator-configured command template, run
// once per run with /bin/sh -c; the job launches its own ranks (e.g. torchrun) and writes the
// metrics file the worker reads afterwards (worker/metrics_file.h).
#include "worker/metrics_file.h"
#include "worker/trial_pipeline.h"

namespace remat::worker {
namespace {

using search::TrialStatus;

class CommandBackend : public Backend {
 public:
  explicit CommandBackend(CommandBackendOptions options) : options_(std::move(options)) {}

  std::optional<search::TrialResult> Refuse(const Assignment& a) const override {
    if (Template(a)) return std::nullopt;
    std::string known;
    for (const auto& [n, t] : options_.templates) known += (known.empty() ? "" : ", ") + n;
    return StatusResult(TrialStatus::kFailed,
                        "search.command_template '" + a.spec.search.command_template +
                            "' is not configured on this worker (configured: " +
                            (known.empty() ? "none" : known) + ")");
  }

  std::string Prepare(const TrialContext& context, const search::SearchSpec& spec,
                      LaunchPlan* plan) const override {
    const Assignment& a = *context.assignment;
    const CommandTemplate& templ = *Template(a);
    const search::SearchOptions& so = spec.search;
    CommandRun run;
    run.assignment = &a;
    run.spec = &spec;
    run.slots = context.slots;
    run.metrics_path = MetricsFilePath(plan->run_dir);
    const std::map<std::string, std::string> values = CommandValues(run);
    auto command = ExpandCommand(templ.command, values);
    if (!command.ok()) return std::string(command.status().message());
    LaunchProcess p;
    p.argv = {"/bin/sh", "-c", *command};
    p.env = templ.env;
    p.env.emplace_back("REMAT_METRICS_FILE", run.metrics_path);
    p.env.emplace_back("REMAT_WARMUP_STEPS", std::to_string(so.warmup_steps));
    p.env.emplace_back("REMAT_MEASURE_STEPS", std::to_string(so.measure_steps));
    p.env.emplace_back("REMAT_MEMORY_BUDGET_BYTES", values.at("memory_budget_bytes"));
    p.env.emplace_back("REMAT_NUM_LAYERS", values.at("num_layers"));
    p.env.emplace_back("REMAT_POLICY", a.policy_name);
    p.env.emplace_back("REMAT_TRIAL_ID", a.trial_id);
    plan->per_rank = false;
    plan->processes = {std::move(p)};
    plan->cwd = templ.workdir;
    plan->stale = {"metrics.json*"};
    return "";
  }

  search::TrialResult Read(const TrialContext& context, const search::SearchSpec&,
                           const LaunchPlan& plan, const LaunchOutcome& outcome,
                           double) const override {
    const Assignment& a = *context.assignment;
    const ChildExit& exit = outcome.group.children.at(0);
    const std::string err = RankStderrPath(plan.run_dir, 0), out = RankStdoutPath(plan.run_dir, 0);
    auto tail = [&] {
      std::string t = FileTail(err);
      if (t.empty()) t = FileTail(out);
      return t.empty() ? std::string() : ": " + t;
    };
    const bool oom_in_log = !exit.ok() && (LogMentionsOom(err) || LogMentionsOom(out));
    auto metrics = ReadMetricsFiles(MetricsFilePath(plan.run_dir));
    if (metrics.ok()) {
      search::TrialResult result = MetricsToResult(a, *metrics);
      // A job that died after writing its figures (the callback rewrites them after every
      // step): out of memory when its log says so (an OOM the callback did not see, e.g. in a
      // rank torchrun ended first), else failed.
      if (!exit.ok() &&
          (result.status == TrialStatus::kOk || result.status == TrialStatus::kFailed)) {
        if (result.status == TrialStatus::kOk) {
          result.message = "command " + outcome.Describe(0) + tail();
        }
        result.status = oom_in_log ? TrialStatus::kOom : TrialStatus::kFailed;
      }
      return result;
    }
    if (!exit.ok()) {
      return StatusResult(oom_in_log ? TrialStatus::kOom : TrialStatus::kFailed,
                          "command " + outcome.Describe(0) + tail());
    }
    return StatusResult(TrialStatus::kFailed,
                        "command exited 0 but " + std::string(metrics.status().message()));
  }

 private:
  const CommandTemplate* Template(const Assignment& a) const {
    auto it = options_.templates.find(a.spec.search.command_template);
    return it == options_.templates.end() ? nullptr : &it->second;
  }

  CommandBackendOptions options_;
};

}  // namespace

std::unique_ptr<Backend> MakeCommandBackend(CommandBackendOptions options) {
  return std::make_unique<CommandBackend>(std::move(options));
}

}  // namespace remat::worker
