// The megatron backend (worker/trial_pipeline.h; the hand-off in worker/megatron_executor.h):
// one Megatron Core driver process per rank.
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "proto/convert.h"
#include "search/rules.h"
#include "worker/megatron_executor.h"
#include "worker/metrics_file.h"
#include "worker/rank_collector.h"
#include "worker/trial_pipeline.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;
using search::TrialStatus;

class MegatronBackend : public Backend {
 public:
  explicit MegatronBackend(MegatronBackendOptions options) : options_(std::move(options)) {}

  // The same rule as the builtin engine's: a label without effect on this model is refused
  // before anything runs (Megatron Core itself would run it as a no-op).
  std::optional<search::TrialResult> Refuse(const Assignment& a) const override {
    const search::Status valid = search::ValidatePolicy(a.spec, a.policy);
    if (!valid.ok()) return StatusResult(TrialStatus::kInvalid, valid.message());
    return std::nullopt;
  }

  std::string Prepare(const TrialContext& context, const search::SearchSpec& spec,
                      LaunchPlan* plan) const override {
    const Assignment& a = *context.assignment;
    const fs::path dir(plan->run_dir);
    std::error_code ec;
    fs::create_directories(dir / "rendezvous", ec);
    if (ec) return "cannot create " + (dir / "rendezvous").string() + ": " + ec.message();
    const fs::path spec_path = dir / "spec.json";
    std::string json;
    google::protobuf::util::JsonPrintOptions print;
    print.preserve_proto_field_names = true;  // the spec's own (Megatron) names
    if (!google::protobuf::util::MessageToJsonString(proto::ToProto(spec), &json, print).ok()) {
      return "cannot write the spec as JSON";
    }
    std::ofstream out(spec_path, std::ios::trunc);
    if (!(out << json << "\n")) return "cannot write " + spec_path.string();
    plan->per_rank = true;
    plan->stale = {"metrics.json*", "rendezvous"};
    plan->fresh_dirs = {"rendezvous"};
    for (int r = 0; r < a.world_size; ++r) {
      LaunchProcess p;
      p.argv = {
          options_.python,
          options_.driver,
          "--spec",
          spec_path.string(),
          "--policy",
          a.policy_name,
          "--metrics",
          MetricsFilePath(plan->run_dir),
          "--rank",
          std::to_string(r),
          "--world-size",
          std::to_string(a.world_size),
          "--rendezvous",
          (dir / "rendezvous").string(),
          "--collective-timeout",
          std::to_string(std::min(options_.collective_timeout_s, spec.search.trial_timeout_s))};
      if (!options_.megatron_path.empty()) {
        p.argv.push_back("--megatron-path");
        p.argv.push_back(options_.megatron_path);
      }
      p.env.emplace_back("PYTHONUNBUFFERED", "1");
      plan->processes.push_back(std::move(p));
    }
    return "";
  }

  // The ranks' metrics files are read together (the warm-up rule looks at the slowest rank of
  // each step: worker/metrics_file.h); a rank that wrote none is reported as the per-rank
  // collector words it (RankLeftNothing); out of memory in a rank's file or log makes the
  // trial oom (a rank out of device memory takes its peers' collectives down).
  search::TrialResult Read(const TrialContext& context, const search::SearchSpec&,
                           const LaunchPlan& plan, const LaunchOutcome& outcome,
                           double peer_exit_grace_s) const override {
    const Assignment& a = *context.assignment;
    const int world = a.world_size;
    auto metrics = ReadMetricsFiles(MetricsFilePath(plan.run_dir));
    std::vector<bool> have(world, false);
    bool any_oom = false;
    if (metrics.ok()) {
      any_oom = metrics->status == "oom";
      for (const RankMetrics& r : metrics->ranks) {
        if (r.memory.rank >= 0 && r.memory.rank < world) have[r.memory.rank] = true;
        any_oom = any_oom || r.status == "oom";
      }
      if (metrics->status == "invalid") return MetricsToResult(a, *metrics);
    }
    std::vector<std::string> missing;
    for (int r = 0; r < world; ++r) {
      const bool oom = LogMentionsOom(RankStderrPath(plan.run_dir, r));
      if (have[r]) {
        if (!outcome.group.children[r].ok() && oom) any_oom = true;
        continue;
      }
      any_oom = any_oom || oom;
      missing.push_back(RankLeftNothing(plan, outcome, r, "driver", "metrics", peer_exit_grace_s));
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
        if (!outcome.group.children[r].ok()) {
          result.status = TrialStatus::kFailed;
          result.message = "rank " + std::to_string(r) + ": driver " + outcome.Describe(r) +
                           " after writing an ok result";
          break;
        }
      }
    } else if (result.status == TrialStatus::kFailed && any_oom) {
      result.status = TrialStatus::kOom;
    }
    return result;
  }

 private:
  MegatronBackendOptions options_;
};

}  // namespace

std::unique_ptr<Backend> MakeMegatronBackend(MegatronBackendOptions options) {
  return std::make_unique<MegatronBackend>(std::move(options));
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
