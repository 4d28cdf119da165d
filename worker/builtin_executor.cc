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

#include "worker/result_combiner.h"
#include "worker/trial_executor.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;

class BuiltinExecutor : public TrialExecutor {
 public:
  explicit BuiltinExecutor(BuiltinExecutorOptions options) : options_(std::move(options)) {}

  v1::TrialResult Run(const TrialContext& context) override {
    const v1::TrialAssignment& a = *context.assignment;
    const int world = std::max(1, a.world_size());
    if (static_cast<int>(context.slots.size()) < world) {
      return StatusResult(a, v1::TRIAL_STATUS_FAILED,
                          "worker gave the trial " + std::to_string(context.slots.size()) +
                              " slots; it needs " + std::to_string(world));
    }
    const double timeout = TrialTimeoutSeconds(a);
    const fs::path dir(context.trial_dir);
    const fs::path rendezvous = dir / "rendezvous";
    std::error_code ec;
    fs::create_directories(rendezvous, ec);
    if (ec) {
      return StatusResult(a, v1::TRIAL_STATUS_FAILED,
                          "cannot create " + rendezvous.string() + ": " + ec.message());
    }

    std::vector<ChildSpec> children;
    for (int r = 0; r < world; ++r) {
      v1::TrialRequest request;
      *request.mutable_spec() = a.spec();
      *request.mutable_policy() = a.policy();
      request.set_rank(r);
      request.set_world_size(world);
      request.set_rendezvous_dir(rendezvous.string());
      request.set_collective_timeout_s(std::min(options_.collective_timeout_s, timeout));
      const fs::path request_path = dir / ("request-" + std::to_string(r) + ".pb");
      {
        std::ofstream out(request_path, std::ios::binary | std::ios::trunc);
        if (!out || !request.SerializeToOstream(&out)) {
          return StatusResult(a, v1::TRIAL_STATUS_FAILED, "cannot write " + request_path.string());
        }
      }
      ChildSpec child;
      child.argv = {options_.trial_binary, "--request", request_path.string(), "--result",
                    ResultPath(dir, r)};
      child.env.emplace_back("NCCL_NVLS_ENABLE", "0");
      if (context.slots[r].gpu) {
        child.env.emplace_back("CUDA_VISIBLE_DEVICES", std::to_string(context.slots[r].index));
      }
      child.stdout_path = (dir / ("stdout-" + std::to_string(r) + ".log")).string();
      child.stderr_path = StderrPath(dir, r);
      child.cwd = dir.string();
      children.push_back(std::move(child));
    }

    GroupLimits limits = options_.limits;
    limits.timeout_s = timeout;
    GroupOutcome outcome = RunProcessGroup(children, limits, context.cancel);
    if (outcome.cancelled) return StatusResult(a, v1::TRIAL_STATUS_CANCELLED, "cancelled");
    if (outcome.timed_out) {
      std::string msg = "killed after search.trial_timeout_s = " + Seconds(timeout);
      std::string tail = FileTail(StderrPath(dir, 0), 3, 600);
      if (!tail.empty()) msg += "; rank 0 stderr: " + tail;
      return StatusResult(a, v1::TRIAL_STATUS_TIMEOUT, msg);
    }

    std::vector<v1::TrialResult> per_rank;
    for (int r = 0; r < world; ++r) {
      const ChildExit& exit = outcome.children[r];
      v1::TrialResult rank_result;
      bool have_result = false;
      if (exit.started) {
        std::ifstream in(ResultPath(dir, r), std::ios::binary);
        have_result = in && rank_result.ParseFromIstream(&in) &&
                      rank_result.status() != v1::TRIAL_STATUS_UNSPECIFIED;
      }
      const std::string prefix = "rank " + std::to_string(r) + ": ";
      if (have_result) {
        if (rank_result.ranks_size() == 1) rank_result.mutable_ranks(0)->set_rank(r);
        if (!rank_result.message().empty()) rank_result.set_message(prefix + rank_result.message());
        if (!exit.ok() && rank_result.status() == v1::TRIAL_STATUS_OK) {
          rank_result.set_status(v1::TRIAL_STATUS_FAILED);
          rank_result.set_message(prefix + "remat-trial " + exit.Describe() +
                                  " after writing an ok result");
        }
        per_rank.push_back(std::move(rank_result));
        continue;
      }
      v1::TrialResult failed = StatusResult(a, v1::TRIAL_STATUS_FAILED, "");
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
      failed.set_message(msg);
      per_rank.push_back(std::move(failed));
    }
    return CombineRankResults(a, per_rank);
  }

 private:
  static std::string ResultPath(const fs::path& dir, int r) {
    return (dir / ("result-" + std::to_string(r) + ".pb")).string();
  }
  static std::string StderrPath(const fs::path& dir, int r) {
    return (dir / ("stderr-" + std::to_string(r) + ".log")).string();
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
