#include "worker/megatron_executor.h"

#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "proto/convert.h"
#include "search/depth_proxy.h"
#include "search/rules.h"
#include "worker/metrics_file.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;
using search::TrialStatus;

class MegatronExecutor : public TrialExecutor {
 public:
  explicit MegatronExecutor(MegatronExecutorOptions options) : options_(std::move(options)) {}

  search::TrialResult Run(const TrialContext& context) override {
    const Assignment& a = *context.assignment;
    if (static_cast<int>(context.slots.size()) < a.world_size) {
      return StatusResult(TrialStatus::kFailed,
                          "worker gave the trial " + std::to_string(context.slots.size()) +
                              " slots; it needs " + std::to_string(a.world_size));
    }
    // The same rule as the builtin engine's: a label without effect on this model is refused
    // before anything runs (Megatron Core itself would run it as a no-op).
    const search::Status valid = search::ValidatePolicy(a.spec, a.policy);
    if (!valid.ok()) return StatusResult(TrialStatus::kInvalid, valid.message());

    const auto& depths = a.spec.search.proxy_layers;
    if (depths.empty()) return RunAt(context, a.spec, fs::path(context.trial_dir));
    std::vector<search::TrialResult> measured;
    for (int layers : depths) {
      search::SearchSpec cut = search::AtDepth(a.spec, layers);
      cut.search.memory_budget_gib = 1 << 20;  // measure: the prediction decides what fits
      measured.push_back(
          RunAt(context, cut, fs::path(context.trial_dir) / ("depth-" + std::to_string(layers))));
      if (measured.back().status != TrialStatus::kOk) return measured.back();
    }
    return search::PredictFullDepth(a.spec, measured[0], measured[1]);
  }

 private:
  // One run of the driver's ranks for `spec` in `dir`.
  search::TrialResult RunAt(const TrialContext& context, const search::SearchSpec& spec,
                            const fs::path& dir) {
    const Assignment& a = *context.assignment;
    const int world = a.world_size;
    const double timeout = spec.search.trial_timeout_s;
    std::error_code ec;
    fs::create_directories(dir / "rendezvous", ec);
    if (ec) {
      return StatusResult(TrialStatus::kFailed,
                          "cannot create " + dir.string() + ": " + ec.message());
    }
    const fs::path spec_path = dir / "spec.json";
    {
      std::string json;
      google::protobuf::util::JsonPrintOptions print;
      print.preserve_proto_field_names = true;  // the spec's own (Megatron) names
      if (!google::protobuf::util::MessageToJsonString(proto::ToProto(spec), &json, print).ok()) {
        return StatusResult(TrialStatus::kFailed, "cannot write the spec as JSON");
      }
      std::ofstream out(spec_path, std::ios::trunc);
      if (!(out << json << "\n")) {
        return StatusResult(TrialStatus::kFailed, "cannot write " + spec_path.string());
      }
    }
    const std::string metrics_path = (dir / "metrics.json").string();
    std::vector<ChildSpec> children;
    for (int r = 0; r < world; ++r) {
      std::vector<std::string> argv = {
          options_.python,
          options_.driver,
          "--spec",
          spec_path.string(),
          "--policy",
          a.policy_name,
          "--metrics",
          metrics_path,
          "--rank",
          std::to_string(r),
          "--world-size",
          std::to_string(world),
          "--rendezvous",
          (dir / "rendezvous").string(),
          "--collective-timeout",
          std::to_string(std::min(options_.collective_timeout_s, timeout))};
      if (!options_.megatron_path.empty()) {
        argv.push_back("--megatron-path");
        argv.push_back(options_.megatron_path);
      }
      ChildSpec child = RankProcess(context, r, std::move(argv));
      child.env.emplace_back("PYTHONUNBUFFERED", "1");
      children.push_back(std::move(child));
    }

    // Recorded like the builtin's: a restarted worker finds and kills what a killed one left. The
    // record stays in the trial folder (not a proxy's depth-<N>/), where the restarted worker
    // looks.
    const GroupLimits limits = TrialGroupLimits(options_.limits, timeout, context.trial_dir);
    GroupOutcome outcome = RunProcessGroup(children, limits, context.cancel);
    if (auto ended = EndedEarly(outcome, timeout, dir.string())) return *ended;

    auto metrics = ReadMetricsFiles(metrics_path);
    std::vector<bool> have(world, false);
    bool any_oom = false;  // a rank out of device memory takes its peers' collectives down
    if (metrics.ok()) {
      any_oom = metrics->status == "oom";
      for (const RankMetrics& r : metrics->ranks) {
        if (r.memory.rank >= 0 && r.memory.rank < world) have[r.memory.rank] = true;
        any_oom = any_oom || r.status == "oom";
      }
      if (metrics->status == "invalid") return MetricsToResult(a, *metrics);
    }
    // A rank that wrote nothing: how it ended, and the end of its stderr.
    std::vector<std::string> missing;
    for (int r = 0; r < world; ++r) {
      const ChildExit& exit = outcome.children[r];
      const bool oom = LogMentionsOom(StderrPath(dir, r));
      if (have[r]) {
        if (!exit.ok() && oom) any_oom = true;
        continue;
      }
      any_oom = any_oom || oom;
      std::string msg = "rank " + std::to_string(r) + ": driver " + exit.Describe() +
                        (exit.started ? ", no metrics file" : "");
      const std::string tail = FileTail(StderrPath(dir, r));
      if (!tail.empty()) msg += ": " + tail;
      missing.push_back(msg);
    }
    if (!metrics.ok() || !missing.empty()) {
      std::string msg;
      for (const std::string& m : missing) msg += (msg.empty() ? "" : "; ") + m;
      if (!metrics.ok() && metrics.status().code() != absl::StatusCode::kNotFound) {
        msg += (msg.empty() ? "" : "; ") + std::string(metrics.status().message());
      }
      search::TrialResult r = StatusResult(any_oom ? TrialStatus::kOom : TrialStatus::kFailed, msg);
      if (metrics.ok()) r.ranks = MetricsToResult(a, *metrics).ranks;
      return r;
    }
    search::TrialResult result = MetricsToResult(a, *metrics);
    if (result.status == TrialStatus::kOk) {
      for (int r = 0; r < world; ++r) {
        if (!outcome.children[r].ok()) {
          result.status = TrialStatus::kFailed;
          result.message = "rank " + std::to_string(r) + ": driver " +
                           outcome.children[r].Describe() + " after writing an ok result";
          break;
        }
      }
    } else if (result.status == TrialStatus::kFailed && any_oom) {
      result.status = TrialStatus::kOom;
    }
    return result;
  }

  static std::string StderrPath(const fs::path& dir, int r) {
    return RankStderrPath(dir.string(), r);
  }

  MegatronExecutorOptions options_;
};

}  // namespace

std::unique_ptr<TrialExecutor> MakeMegatronExecutor(MegatronExecutorOptions options) {
  return std::make_unique<MegatronExecutor>(std::move(options));
}

std::string FindMegatronDriver(const std::string& program_dir) {
  const fs::path dir(program_dir);
  for (const fs::path& candidate :
       {dir / "megatron_driver" / "remat_megatron_driver.py",
        dir / ".." / "share" / "remat" / "megatron_driver" / "remat_megatron_driver.py"}) {
    if (access(candidate.c_str(), R_OK) == 0) return candidate.lexically_normal().string();
  }
  return "";
}

}  // namespace remat::worker
