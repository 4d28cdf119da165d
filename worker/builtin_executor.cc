// The builtin executor: one remat-trial process per rank, all in one process group.
//
// Hand-off per rank r (files in the trial's folder):
//   request-r.pb   binary remat.v1.TrialRequest (spec, policy, rank, world_size, rendezvous_dir,
//                  collective_timeout_s)
//   result-r.pb    binary remat.v1.TrialResult written by the rank
//   stderr-r.log / stdout-r.log
// The ranks meet in rendezvous/ inside the trial's folder (fresh for every attempt).
#include <signal.h>

#include <filesystem>
#include <fstream>

#include "proto/convert.h"
#include "worker/result_combiner.h"
#include "worker/trial_executor.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;
using search::TrialStatus;

class BuiltinExecutor : public TrialExecutor {
 public:
  explicit BuiltinExecutor(BuiltinExecutorOptions options) : options_(std::move(options)) {}

  search::TrialResult Run(const TrialContext& context) override {
    const Assignment& a = *context.assignment;
    const int world = a.world_size;
    if (static_cast<int>(context.slots.size()) < world) {
      return StatusResult(TrialStatus::kFailed, "worker gave the trial " +
                                                    std::to_string(context.slots.size()) +
                                                    " slots; it needs " + std::to_string(world));
    }
    const double timeout = a.spec.search.trial_timeout_s;
    const fs::path dir(context.trial_dir);
    if (std::string error =
            WriteTrialRequests(a, dir.string(), std::min(options_.collective_timeout_s, timeout));
        !error.empty()) {
      return StatusResult(TrialStatus::kFailed, error);
    }
    std::vector<ChildSpec> children;
    for (int r = 0; r < world; ++r) {
      children.push_back(
          RankProcess(context, r,
                      {options_.trial_binary, "--request", RequestPath(dir.string(), r), "--result",
                       ResultPath(dir, r)}));
      // The job's allocator settings (search.allocator_conf), read by LibTorch at its first use.
      if (!a.spec.search.allocator_conf.empty()) {
        children.back().env.emplace_back("PYTORCH_CUDA_ALLOC_CONF", a.spec.search.allocator_conf);
      }
    }

    const GroupLimits limits = TrialGroupLimits(options_.limits, timeout, dir.string());
    GroupOutcome outcome = RunProcessGroup(children, limits, context.cancel);
    if (auto ended = EndedEarly(outcome, timeout, dir.string())) return *ended;

    std::vector<search::TrialResult> per_rank;
    for (int r = 0; r < world; ++r) {
      const ChildExit& exit = outcome.children[r];
      v1::TrialResult rank_file;
      bool have_result = false;
      if (exit.started) have_result = ReadResultFile(ResultPath(dir, r), &rank_file);
      // A layout proxy (search/layout_proxy.h) is one process that numbers the layout's ranks
      // itself and speaks for all of them: its ranks and message stay as it wrote them.
      const bool layout_proxy = a.spec.search.layout_proxy;
      const std::string prefix = layout_proxy ? "" : "rank " + std::to_string(r) + ": ";
      if (have_result) {
        search::TrialResult rank_result = ResultFromWire(rank_file);
        if (rank_result.ranks.size() == 1 && !layout_proxy) rank_result.ranks[0].rank = r;
        if (!rank_result.message.empty()) rank_result.message = prefix + rank_result.message;
        if (!exit.ok() && rank_result.status == TrialStatus::kOk) {
          rank_result.status = TrialStatus::kFailed;
          rank_result.message =
              prefix + "remat-trial " + exit.Describe() + " after writing an ok result";
        }
        per_rank.push_back(std::move(rank_result));
        continue;
      }
      search::TrialResult failed = StatusResult(TrialStatus::kFailed, "");
      std::string msg = prefix + "remat-trial " + exit.Describe();
      if (outcome.lingered_kill && r != outcome.first_ended &&
          (exit.signal == SIGTERM || exit.signal == SIGKILL)) {
        msg = prefix + "killed after rank " + std::to_string(outcome.first_ended);
        if (outcome.first_ended_cleanly) {
          msg += " had finished and this rank still ran " +
                 Seconds(options_.limits.peer_exit_grace_s) + " later (stuck in a collective?)";
        } else {
          msg += " failed";
        }
      } else {
        if (exit.started) msg += ", no result file";
        std::string tail = FileTail(StderrPath(dir, r));
        if (!tail.empty()) msg += ": " + tail;
      }
      failed.message = msg;
      per_rank.push_back(std::move(failed));
    }
    return CombineRankResults(a, per_rank);
  }

 private:
  static std::string ResultPath(const fs::path& dir, int r) {
    return (dir / ("result-" + std::to_string(r) + ".pb")).string();
  }
  static std::string StderrPath(const fs::path& dir, int r) {
    return RankStderrPath(dir.string(), r);
  }
  static std::string Seconds(double s) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%.4g s", s);
    return buf;
  }

  BuiltinExecutorOptions options_;
};

}  // namespace

std::unique_ptr<TrialExecutor> MakeBuiltinExecutor(BuiltinExecutorOptions options) {
  return std::make_unique<BuiltinExecutor>(std::move(options));
}

}  // namespace remat::worker
