// The executor contract: every backend under every launcher (worker/trial_pipeline.h) turns the
// same trial into the same kind of result. One parameterised suite, run against
//
//   builtin × local   (tests/worker/fake_remat_trial: the request's spec name says what it does)
//   megatron × local  (tests/worker/fake_megatron_driver.py: the driver's own mapping and
//                      metrics writer, no torch)
//   command × local   (a template running a shell job that writes the metrics files)
//   the same three × slurm: each run a job of a real Slurm on this machine. These run only
//   where REMAT_TEST_SLURM=1 (tests/slurm/slurm_backends_test.sh starts the cluster and sets
//   it; ctest label slurm); elsewhere they are skipped.
//
// The contract: two ranks that finish are one ok result with both ranks' figures; a rank that
// fails is a failed result saying how; a trial past its timeout is timeout; a cancelled trial is
// cancelled; a trial with proxy depths is predicted from a run at each depth (backends whose
// processes run the depths themselves, remat-trial, are covered by the engine's tests).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <thread>

#include "tests/worker/test_util.h"
#include "worker/slots.h"
#include "worker/slurm_launcher.h"
#include "worker/trial_pipeline.h"

namespace remat::worker {
namespace {

using search::TrialStatus;
using testing::TempDir;
using testing::WriteText;

enum class Kind { kBuiltin, kMegatron, kCommand };

struct Variant {
  Kind kind;
  bool slurm;
  std::string name;
};
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

// The command backend's job: "ok" writes one metrics file per rank whose figures are affine in
// the layer count it runs (peak = 1000 x layers + 100 x rank + 500 bytes, as the fake driver's);
// "fail" says boom and exits 3; "hang" sleeps.
constexpr char kCommandJob[] = R"(#!/bin/sh
mode=$1 n=$2 L=$REMAT_NUM_LAYERS
case $mode in
  fail) echo boom >&2; exit 3 ;;
  hang) sleep 60; exit 0 ;;
esac
r=0
while [ $r -lt $n ]; do
  cat > "$REMAT_METRICS_FILE.rank$r" <<EOT
{"ranks": [{"rank": $r, "peak_allocated_bytes": $((1000 * L + 100 * r + 500)),
            "peak_reserved_bytes": $((2000 * L + 100 * r + 500)),
            "step_times_s": [0.5, 0.3, 0.$L, 0.$L, 0.$L, 0.$L, 0.$L]}]}
EOT
  r=$((r + 1))
done
)";

class ExecutorContract : public ::testing::TestWithParam<Variant> {
 protected:
  void SetUp() override {
    const Variant& v = GetParam();
    if (v.slurm && std::getenv("REMAT_TEST_SLURM") == nullptr) {
      GTEST_SKIP() << "needs a Slurm cluster (tests/slurm/slurm_backends_test.sh, label slurm)";
    }
    if (v.kind == Kind::kMegatron && access("/usr/bin/python3", X_OK) != 0) {
      GTEST_SKIP() << "python3 not installed";
    }
  }

  // The mode names each backend's fake understands.
  std::string Mode(const std::string& what) const {
    if (GetParam().kind == Kind::kBuiltin && what == "fail") return "exit3";
    return what;
  }

  // A small dense model every backend can map; two ranks (data parallel).
  Assignment Make(const std::string& what, int world = 2, double timeout_s = 60) const {
    v1::TrialAssignment a;
    a.set_trial_id("t-" + what);
    a.set_search_id("s-1");
    a.set_attempt(1);
    a.set_world_size(world);
    a.mutable_policy()->set_canonical("selective:[core_attn]");
    v1::SearchSpec* spec = a.mutable_spec();
    spec->set_name(Mode(what));
    v1::ModelSpec* m = spec->mutable_model();
    m->set_num_layers(4);
    m->set_hidden_size(64);
    m->set_num_attention_heads(4);
    m->set_seq_length(128);
    m->set_vocab_size(1000);
    m->set_add_bias_linear(false);
    spec->mutable_train()->set_micro_batch_size(2);
    spec->mutable_parallel()->set_data_parallel_size(world);
    v1::SearchOptions* so = spec->mutable_search();
    // device auto: CPU slots here, CPU nodes under Slurm (the megatron driver refuses cpu).
    so->set_trial_timeout_s(timeout_s);
    so->set_warmup_steps(2);
    so->set_warmup_max_steps(2);
    so->set_steady_window(1);
    so->set_measure_steps(3);
    switch (GetParam().kind) {
      case Kind::kBuiltin:
        so->set_backend("builtin");
        break;
      case Kind::kMegatron:
        so->set_backend("megatron");
        break;
      case Kind::kCommand:
        so->set_backend("command");
        so->set_command_template(Mode(what));
        break;
    }
    return ToAssignment(a);
  }

  std::unique_ptr<TrialExecutor> Executor() {
    const Variant& v = GetParam();
    std::shared_ptr<Launcher> launcher;
    if (v.slurm) {
      SlurmLauncherOptions s;
      s.poll_interval_s = 0.2;
      s.peer_exit_grace_s = 3;
      s.extra_sbatch_args = {"--cpus-per-task=1"};
      launcher = MakeSlurmLauncher(s);
    } else {
      GroupLimits limits;
      limits.kill_grace_s = 0.3;
      limits.peer_failure_grace_s = 0.5;
      limits.peer_exit_grace_s = 3;
      launcher = MakeLocalLauncher(limits);
    }
    std::shared_ptr<const Backend> backend;
    switch (v.kind) {
      case Kind::kBuiltin:
        backend = MakeBuiltinBackend({FAKE_REMAT_TRIAL, 30});
        break;
      case Kind::kMegatron: {
        MegatronBackendOptions m;
        m.python = "/usr/bin/python3";
        m.driver = std::string(REMAT_SOURCE_DIR) + "/tests/worker/fake_megatron_driver.py";
        backend = MakeMegatronBackend(m);
        break;
      }
      case Kind::kCommand: {
        const std::string job = scripts_ / "job.sh";
        WriteText(job, kCommandJob);
        CommandBackendOptions c;
        for (const std::string mode : {"ok", "fail", "hang"}) {
          c.templates[mode].command = "sh " + job + " " + mode + " {nproc}";
        }
        backend = MakeCommandBackend(c);
        break;
      }
    }
    return MakeTrialExecutor(backend, launcher);
  }

  search::TrialResult Run(const Assignment& a, const CancelToken* cancel = nullptr) {
    TrialContext context;
    context.assignment = &a;
    context.slots = PlainSlots(a.world_size);
    context.trial_dir = dir_.path();
    context.cancel = cancel;
    return Executor()->Run(context);
  }

  TempDir dir_, scripts_;
};

TEST_P(ExecutorContract, TwoRanksThatFinishAreOneOkResultWithBothRanks) {
  const Assignment a = Make("ok");
  search::TrialResult r = Run(a);
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[0].rank, 0);
  EXPECT_EQ(r.ranks[1].rank, 1);
  EXPECT_GT(r.ranks[1].peak_allocated_bytes, 0u);
  EXPECT_GT(r.step_time_s, 0);
  EXPECT_GT(r.tokens_per_s, 0);
  EXPECT_FALSE(r.predicted);
}

TEST_P(ExecutorContract, AFailingRankIsAFailedResultSayingHow) {
  search::TrialResult r = Run(Make("fail"));
  EXPECT_EQ(r.status, TrialStatus::kFailed) << r.message;
  EXPECT_NE(r.message.find("exited with status 3"), std::string::npos) << r.message;
}

TEST_P(ExecutorContract, ATrialPastItsTimeoutIsTimeout) {
  search::TrialResult r = Run(Make("hang", 2, /*timeout_s=*/1));
  EXPECT_EQ(r.status, TrialStatus::kTimeout) << r.message;
  EXPECT_NE(r.message.find("search.trial_timeout_s"), std::string::npos) << r.message;
}

TEST_P(ExecutorContract, ACancelledTrialIsCancelled) {
  CancelToken cancel;
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(GetParam().slurm ? 1500 : 300));
    cancel.Cancel();
  });
  search::TrialResult r = Run(Make("hang"), &cancel);
  later.join();
  EXPECT_EQ(r.status, TrialStatus::kCancelled) << r.message;
}

TEST_P(ExecutorContract, ProxyDepthsRunOnceEachAndPredictTheFullDepth) {
  if (GetParam().kind == Kind::kBuiltin) {
    GTEST_SKIP() << "remat-trial runs the depths itself (tests/engine)";
  }
  Assignment a = Make("ok");
  a.spec.model.num_layers = 8;
  a.spec.search.proxy_layers = {2, 4};
  search::TrialResult r = Run(a);
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  EXPECT_TRUE(r.predicted);
  ASSERT_EQ(r.proxies.size(), 2u);
  EXPECT_EQ(r.proxies[0].num_layers, 2);
  EXPECT_EQ(r.proxies[1].num_layers, 4);
  ASSERT_EQ(r.ranks.size(), 2u);
  // 1000 x 8 + 100 x rank + 500, from the runs at 2 and 4 layers.
  EXPECT_EQ(r.ranks[0].peak_allocated_bytes, 8500u);
  EXPECT_EQ(r.ranks[1].peak_allocated_bytes, 8600u);
  EXPECT_TRUE(std::filesystem::is_directory(dir_ / "depth-2"));
  EXPECT_TRUE(std::filesystem::is_directory(dir_ / "depth-4"));
}

INSTANTIATE_TEST_SUITE_P(
    EveryBackendUnderEveryLauncher, ExecutorContract,
    ::testing::Values(Variant{Kind::kBuiltin, false, "BuiltinLocal"},
                      Variant{Kind::kMegatron, false, "MegatronLocal"},
                      Variant{Kind::kCommand, false, "CommandLocal"},
                      Variant{Kind::kBuiltin, true, "BuiltinSlurm"},
                      Variant{Kind::kMegatron, true, "MegatronSlurm"},
                      Variant{Kind::kCommand, true, "CommandSlurm"}),
    [](const ::testing::TestParamInfo<Variant>& info) { return info.param.name; });

}  // namespace
}  // namespace remat::worker
