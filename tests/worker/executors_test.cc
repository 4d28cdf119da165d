// The three trial backends: builtin (with a fake remat-trial), replay and command.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "search/depth_proxy.h"
#include "search/proxy_driver.h"
#include "search/limits.h"
#include "search/text.h"
#include "specfile/spec_file.h"
#include "tests/worker/test_util.h"
#include "worker/assignment.h"
#include "worker/command_template.h"
#include "worker/metrics_file.h"
#include "worker/process_runner.h"
#include "worker/trial_executor.h"

namespace remat::worker {
namespace {

using testing::ProcessEnded;
using testing::ReadText;
using testing::TempDir;
using testing::WriteText;
using search::TrialStatus;

v1::TrialAssignment Assignment(const std::string& mode, int world, double timeout_s = 30) {
  v1::TrialAssignment a;
  a.set_trial_id("t-42");
  a.set_search_id("s-7");
  a.set_attempt(1);
  a.set_world_size(world);
  a.mutable_policy()->set_canonical("selective:[core_attn]");
  v1::SearchSpec* spec = a.mutable_spec();
  spec->set_name(mode);
  spec->mutable_model()->set_seq_length(128);
  spec->mutable_train()->set_micro_batch_size(2);
  spec->mutable_parallel()->set_tensor_model_parallel_size(world);
  spec->mutable_parallel()->set_data_parallel_size(1);
  spec->mutable_search()->set_trial_timeout_s(timeout_s);
  spec->mutable_search()->set_warmup_steps(2);
  // A fixed warm-up of 2 (a window of one settles at once), so the figures below are exact.
  spec->mutable_search()->set_warmup_max_steps(2);
  spec->mutable_search()->set_steady_window(1);
  spec->mutable_search()->set_measure_steps(3);
  // A fixed window (noise_target 0: exactly measure_steps), so the figures below are exact;
  // AdaptiveCommandRunsForTheCapAndMeasuresByTheRule covers the adaptive window.
  spec->mutable_search()->set_noise_target(0);
  return a;
}

std::vector<Slot> Slots(int n, bool gpu = false) {
  std::vector<Slot> slots;
  for (int i = 0; i < n; ++i) {
    Slot s;
    s.index = 4 + i;
    s.gpu = gpu;
    s.name = gpu ? "GPU" : "cpu-slot";
    slots.push_back(s);
  }
  return slots;
}

class BuiltinTest : public ::testing::Test {
 protected:
  search::TrialResult Run(const v1::TrialAssignment& a, std::vector<Slot> slots,
                      const CancelToken* cancel = nullptr) {
    BuiltinExecutorOptions options;
    options.trial_binary = FAKE_REMAT_TRIAL;
    options.limits.kill_grace_s = 0.3;
    options.limits.peer_failure_grace_s = 0.3;
    options.limits.peer_exit_grace_s = 0.5;
    auto executor = MakeBuiltinExecutor(options);
    const worker::Assignment assignment = ToAssignment(a);
    TrialContext context;
    context.assignment = &assignment;
    context.slots = std::move(slots);
    context.trial_dir = dir_.path();
    context.cancel = cancel;
    return executor->Run(context);
  }
  TempDir dir_;
};

TEST_F(BuiltinTest, TwoRanksCombineIntoOneResult) {
  search::TrialResult r = Run(Assignment("ok", 2), Slots(2));
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  ASSERT_EQ(r.ranks.size(), 2);
  EXPECT_EQ(r.ranks[0].rank, 0);
  EXPECT_EQ(r.ranks[1].peak_reserved_bytes, 4000u);
  EXPECT_DOUBLE_EQ(r.step_time_s, 0.2);  // the slower rank
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 2.0 * 128 / 0.2);
  EXPECT_DOUBLE_EQ(r.loss, 2.5);
  // Every rank gets NCCL_NVLS_ENABLE=0, no CUDA_VISIBLE_DEVICES on plain slots, and one
  // rendezvous folder for the trial.
  EXPECT_NE(r.message.find("rank 0: NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=<unset> world=2"),
            std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("rendezvous=" + dir_.path() + "/rendezvous"), std::string::npos);
}

TEST_F(BuiltinTest, GpuSlotsSetCudaVisibleDevicesPerRank) {
  search::TrialResult r = Run(Assignment("ok", 2), Slots(2, /*gpu=*/true));
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  EXPECT_NE(r.message.find("rank 0: NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=4 "),
            std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("rank 1: NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=5 "),
            std::string::npos)
      << r.message;
}

TEST_F(BuiltinTest, OomIsAResult) {
  search::TrialResult r = Run(Assignment("oom", 1), Slots(1));
  EXPECT_EQ(r.status, TrialStatus::kOom);
  ASSERT_EQ(r.ranks.size(), 1);
  EXPECT_EQ(r.ranks[0].failing_request_bytes, 1u << 20);
}

// A layout proxy is one process that numbers the layout's ranks and speaks for all of them:
// the worker keeps its rank numbers and does not pin its message on "rank 0".
TEST_F(BuiltinTest, ALayoutProxyKeepsItsRanksAndMessage) {
  v1::TrialAssignment a = Assignment("layout-oom", 1);
  a.mutable_spec()->mutable_search()->set_layout_proxy(true);
  search::TrialResult r = Run(a, Slots(1));
  EXPECT_EQ(r.status, TrialStatus::kOom);
  ASSERT_EQ(r.ranks.size(), 1);
  EXPECT_EQ(r.ranks[0].rank, 12);
  EXPECT_EQ(r.message, "layout proxy, stage 3 (rank 12): out of memory");
}

// The trial's directory is the trial's: a FIFO at its result path (or anything else that is not
// a regular file) is no result, never a read that waits for a writer.
TEST_F(BuiltinTest, AFifoAtTheResultPathIsAFailedTrialNotAHang) {
  const auto t0 = std::chrono::steady_clock::now();
  search::TrialResult r = Run(Assignment("fifo-result", 1), Slots(1));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_NE(r.message.find("about to leave a FIFO"), std::string::npos) << r.message;
  const std::string stderr_log = dir_.path() + "/stderr-0.log";
  ASSERT_EQ(unlink(stderr_log.c_str()), 0);
  ASSERT_EQ(mkfifo(stderr_log.c_str(), 0600), 0);
  EXPECT_EQ(FileTail(stderr_log), "");  // a FIFO as the log: no tail, no wait
}

// A message that is not UTF-8 is repaired, not a reason to lose the measurement.
TEST_F(BuiltinTest, InvalidUtf8InAResultFileKeepsTheResult) {
  search::TrialResult r = Run(Assignment("bad-utf8", 1), Slots(1));
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  EXPECT_DOUBLE_EQ(r.step_time_s, 0.1);
  EXPECT_TRUE(search::IsValidUtf8(r.message));
  EXPECT_NE(r.message.find("\uFFFD"), std::string::npos) << r.message;
}

TEST_F(BuiltinTest, CrashIsFailedWithTheSignalAndStderrTail) {
  search::TrialResult r = Run(Assignment("crash", 1), Slots(1));
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_NE(r.message.find("rank 0: remat-trial killed by signal 6"), std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("fatal: something broke in rank 0"), std::string::npos) << r.message;
}

TEST_F(BuiltinTest, NonzeroExitIsFailedWithStatusAndStderrTail) {
  search::TrialResult r = Run(Assignment("exit3", 1), Slots(1));
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_NE(r.message.find("exited with status 3, no result file: error: model.hidden_size"),
            std::string::npos)
      << r.message;
}

TEST_F(BuiltinTest, TimeoutKillsTheGroupIncludingGrandchildren) {
  search::TrialResult r = Run(Assignment("hang", 1, /*timeout_s=*/0.5), Slots(1));
  EXPECT_EQ(r.status, TrialStatus::kTimeout);
  EXPECT_NE(r.message.find("search.trial_timeout_s"), std::string::npos);
  pid_t grandchild = std::stoi(ReadText(dir_ / "grandchild.pid"));
  EXPECT_TRUE(ProcessEnded(grandchild));
}

TEST_F(BuiltinTest, OneRankCrashingTakesThePeersDownAfterTheGrace) {
  search::TrialResult r = Run(Assignment("rank1-crash", 2), Slots(2));
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_NE(r.message.find("rank 0: killed after rank 1 failed"), std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("rank 1: remat-trial killed by signal 6"), std::string::npos)
      << r.message;
}

TEST_F(BuiltinTest, ARankLingeringAfterItsPeerFinishedIsKilledAndThePeersResultKept) {
  // Rank 1 ran out of memory and exited 0 with its result; rank 0 never finishes (a collective
  // its peer will not join). The trial ends after peer_exit_grace_s as the OOM it was.
  search::TrialResult r = Run(Assignment("rank1-oom", 2), Slots(2));
  EXPECT_EQ(r.status, TrialStatus::kOom) << r.message;
  EXPECT_NE(r.message.find("rank 0: killed after rank 1 had finished and this rank still ran"),
            std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("rank 1: out of memory"), std::string::npos) << r.message;
}

TEST_F(BuiltinTest, CancelStopsTheTrial) {
  CancelToken cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel.Cancel();
  });
  search::TrialResult r = Run(Assignment("hang", 1), Slots(1), &cancel);
  canceller.join();
  EXPECT_EQ(r.status, TrialStatus::kCancelled);
}

TEST_F(BuiltinTest, MissingBinaryIsAFailedTrial) {
  BuiltinExecutorOptions options;
  options.trial_binary = "/nonexistent/remat-trial";
  const worker::Assignment a = ToAssignment(Assignment("ok", 1));
  TrialContext context;
  context.assignment = &a;
  context.slots = Slots(1);
  context.trial_dir = dir_.path();
  search::TrialResult r = MakeBuiltinExecutor(options)->Run(context);
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_NE(r.message.find("did not start"), std::string::npos) << r.message;
}

// ---- replay ----------------------------------------------------------------------------------

search::TrialResult RunReplay(const v1::TrialAssignment& a, const CancelToken* cancel = nullptr) {
  const worker::Assignment assignment = ToAssignment(a);
  TrialContext context;
  context.assignment = &assignment;
  context.slots = Slots(1);
  context.cancel = cancel;
  return MakeReplayExecutor()->Run(context);
}

TEST(ReplayExecutor, ReportsTheEntryAfterItsWallTime) {
  v1::TrialAssignment a = Assignment("replay", 1);
  a.set_replay_found(true);
  a.mutable_replay()->set_wall_s(0.2);
  v1::TrialResult* entry = a.mutable_replay()->mutable_result();
  entry->set_status(v1::TRIAL_STATUS_OK);
  entry->set_step_time_s(0.5);
  entry->add_ranks()->set_peak_reserved_bytes(123);
  CancelToken cancel;
  const auto t0 = std::chrono::steady_clock::now();
  search::TrialResult r = RunReplay(a, &cancel);
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(took, 0.2);
  EXPECT_EQ(r.status, TrialStatus::kOk);
  EXPECT_EQ(r.ranks[0].peak_reserved_bytes, 123u);
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 2.0 * 128 / 0.5);  // filled in from step time
}

TEST(ReplayExecutor, MissingEntryIsFailed) {
  v1::TrialAssignment a = Assignment("replay", 1);
  a.set_replay_found(false);
  search::TrialResult r = RunReplay(a);
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_EQ(r.message, "not in replay table");
}

TEST(ReplayExecutor, CancelInterruptsTheWait) {
  v1::TrialAssignment a = Assignment("replay", 1);
  a.set_replay_found(true);
  a.mutable_replay()->set_wall_s(600);
  a.mutable_replay()->mutable_result()->set_status(v1::TRIAL_STATUS_OK);
  CancelToken cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel.Cancel();
  });
  search::TrialResult r = RunReplay(a, &cancel);
  canceller.join();
  EXPECT_EQ(r.status, TrialStatus::kCancelled);
}

// ---- command ---------------------------------------------------------------------------------

class CommandTest : public ::testing::Test {
 protected:
  search::TrialResult Run(const std::string& templates_yaml, v1::TrialAssignment a,
                      std::vector<Slot> slots = Slots(1)) {
    auto templates = ParseCommandTemplatesYaml(templates_yaml);
    EXPECT_TRUE(templates.ok()) << templates.status();
    CommandExecutorOptions options;
    options.templates = *templates;
    options.limits.kill_grace_s = 0.3;
    a.mutable_spec()->mutable_search()->set_backend("command");
    a.mutable_spec()->mutable_search()->set_command_template("job");
    const worker::Assignment assignment = ToAssignment(a);
    TrialContext context;
    context.assignment = &assignment;
    context.slots = std::move(slots);
    context.trial_dir = dir_.path();
    return MakeCommandExecutor(options)->Run(context);
  }
  TempDir dir_;
};

// With noise_target set, the job runs for the cap and the worker measures by the rule: steps
// after the warm-up until the median's interval is within the target (search/noise.h).
TEST_F(CommandTest, AdaptiveCommandRunsForTheCapAndMeasuresByTheRule) {
  const std::string script = dir_ / "job.sh";
  // Warm-up 9, 9; then steady steps: five within 1% make the 90% interval of the median.
  WriteText(script, R"(#!/bin/sh
echo "$1" > iters.txt
cat > "$REMAT_METRICS_FILE.rank0" <<EOT
{"ranks": [{"rank": 0, "peak_allocated_bytes": 100, "peak_reserved_bytes": 150,
            "step_times_s": [9, 9, 1.0, 1.001, 0.999, 1.002, 1.0, 5, 5, 5], "losses": [5, 5, 4]}]}
EOT
)");
  v1::TrialAssignment a = Assignment("cmd", 1);
  a.mutable_spec()->mutable_search()->set_noise_target(0.02);
  a.mutable_spec()->mutable_search()->set_max_measure_steps(8);
  search::TrialResult r =
      Run("job:\n  command: sh " + script + " {train_iters}\n", a, Slots(1));
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  EXPECT_EQ(ReadText(dir_ / "iters.txt"), "10\n");  // warm-up 2 + the cap of 8
  EXPECT_EQ(r.ranks[0].step_times_s, (std::vector<double>{1.0, 1.001, 0.999, 1.002, 1.0}));
  EXPECT_TRUE(r.noise_target_met);
  EXPECT_GT(r.step_time_high_s, r.step_time_low_s);
}

TEST_F(CommandTest, SubstitutesPlaceholdersAndReadsTheMetricsFile) {
  // A fake job: records its arguments and environment, then writes two per-rank metrics files.
  const std::string script = dir_ / "job.sh";
  WriteText(script, R"(#!/bin/sh
printf '%s\n' "$@" > args.txt
echo "$CUDA_VISIBLE_DEVICES $NCCL_NVLS_ENABLE $REMAT_METRICS_FILE $EXTRA" > env.txt
cat > "$REMAT_METRICS_FILE.rank0" <<EOT
{"ranks": [{"rank": 0, "peak_allocated_bytes": 100, "peak_reserved_bytes": 150,
            "step_times_s": [9, 9, 0.3, 0.1, 0.2, 7], "losses": [5, 5, 4.5, 4, 3]}]}
EOT
cat > "$REMAT_METRICS_FILE.rank1" <<EOT
{"ranks": [{"rank": 1, "peak_allocated_bytes": 200, "peak_reserved_bytes": 250,
            "step_times_s": [9, 9, 0.4, 0.4, 0.4]}]}
EOT
)");
  const std::string yaml = "job:\n  command: sh " + script +
                           " {overrides} -- {megatron_lm_flags} -- {nproc} {gpus} {train_iters}"
                           " ${REMAT_POLICY:+set}\n  env: {EXTRA: extra-value}\n";
  search::TrialResult r = Run(yaml, Assignment("cmd", 2), Slots(2, /*gpu=*/true));
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  EXPECT_EQ(ReadText(dir_ / "args.txt"),
            "model.recompute_granularity=selective\nmodel.recompute_method=null\n"
            "model.recompute_num_layers=null\nmodel.recompute_modules=[core_attn]\n--\n"
            "--recompute-granularity\nselective\n--recompute-modules\ncore_attn\n--\n2\n4,5\n5\n"
            "set\n");
  EXPECT_EQ(ReadText(dir_ / "env.txt"), "4,5 0 " + dir_.path() + "/metrics.json extra-value\n");
  ASSERT_EQ(r.ranks.size(), 2);
  EXPECT_EQ(r.ranks[1].peak_reserved_bytes, 250u);
  EXPECT_DOUBLE_EQ(r.ranks[0].step_time_s, 0.2);  // median of 0.3, 0.1, 0.2 (warm-up dropped)
  // The measured steps themselves, as the builtin engine reports them.
  EXPECT_EQ(r.ranks[0].step_times_s, (std::vector<double>{0.3, 0.1, 0.2}));
  EXPECT_EQ(r.ranks[1].step_times_s, (std::vector<double>{0.4, 0.4, 0.4}));
  EXPECT_DOUBLE_EQ(r.step_time_s, 0.4);
  EXPECT_DOUBLE_EQ(r.step_time_spread_s, 0.3);
  EXPECT_DOUBLE_EQ(r.loss, 4.5);
  EXPECT_DOUBLE_EQ(r.tokens_per_s, 2.0 * 128 / 0.4);
}

TEST_F(CommandTest, OomInTheMetricsOrTheLogIsOom) {
  search::TrialResult r =
      Run("job: >-\n  echo '{\"status\": \"oom\", \"ranks\": [{\"rank\": 0, \"status\": \"oom\","
          " \"peak_allocated_bytes\": 5}]}' > {metrics_file}; exit 1\n",
          Assignment("cmd", 1));
  EXPECT_EQ(r.status, TrialStatus::kOom) << r.message;
  r = Run("job: |-\n  echo 'torch.OutOfMemoryError: CUDA out of memory.' >&2; exit 1\n",
          Assignment("cmd", 1));
  EXPECT_EQ(r.status, TrialStatus::kOom) << r.message;
  // Figures of the steps so far, then a death the metrics did not record: the log decides.
  r = Run("job: >-\n  echo '{\"ranks\": [{\"rank\": 0, \"peak_allocated_bytes\": 5,"
          " \"step_times_s\": [1, 1, 1, 1, 1]}]}' > {metrics_file};"
          " echo 'CUDA out of memory' >&2; exit 1\n",
          Assignment("cmd", 1));
  EXPECT_EQ(r.status, TrialStatus::kOom) << r.message;
  EXPECT_EQ(r.message, "command exited with status 1: CUDA out of memory");
}

TEST_F(CommandTest, FailuresAndTimeouts) {
  search::TrialResult r =
      Run("job: |-\n  echo 'ImportError: no module' >&2; exit 7\n", Assignment("cmd", 1));
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_EQ(r.message, "command exited with status 7: ImportError: no module");
  r = Run("job: 'true'\n", Assignment("cmd", 1));
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_NE(r.message.find("no metrics file"), std::string::npos) << r.message;
  r = Run("job: sleep 100\n", Assignment("cmd", 1, /*timeout_s=*/0.3));
  EXPECT_EQ(r.status, TrialStatus::kTimeout);
}

// A job whose stderr holds invalid UTF-8 and megabytes: the failure and its real error still
// reach the coordinator in a report it can parse.
TEST_F(CommandTest, StderrWithInvalidUtf8AndMegabytesStillMakesAParsableReport) {
  const v1::TrialAssignment wire = Assignment("cmd", 1);
  search::TrialResult r = Run(
      "job: |-\n  head -c 3000000 /dev/zero | tr '\\000' x >&2; printf '\\377\\376 CUDA error: "
      "device-side assert\\n' >&2; exit 1\n",
      wire);
  ASSERT_EQ(r.status, TrialStatus::kFailed) << r.message.substr(0, 200);
  v1::TrialAssignment leased = wire;
  leased.mutable_spec()->mutable_search()->set_backend("command");
  leased.mutable_spec()->mutable_search()->set_command_template("job");
  const v1::ReportTrialRequest report = MakeReport("w-1", ToAssignment(leased), r);
  std::string bytes;
  ASSERT_TRUE(report.SerializeToString(&bytes));
  v1::ReportTrialRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes)) << "the coordinator could not read the report";
  EXPECT_LE(parsed.result().message().size(), search::limits::kMaxTrialMessageBytes);
  EXPECT_NE(parsed.result().message().find("CUDA error: device-side assert"), std::string::npos)
      << parsed.result().message().substr(0, 200);
}

// A job that links its metrics file to /dev/zero cannot make the worker read for ever.
TEST_F(CommandTest, AMetricsFileThatIsNotARegularFileIsAFailedTrial) {
  search::TrialResult r =
      Run("job: ln -s /dev/zero {metrics_file}.rank0\n", Assignment("cmd", 1, /*timeout_s=*/30));
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_NE(r.message.find("is not a regular file"), std::string::npos) << r.message;
}

TEST_F(CommandTest, OnlyConfiguredTemplatesRun) {
  auto templates = ParseCommandTemplatesYaml("other: 'true'\n");
  ASSERT_TRUE(templates.ok());
  CommandExecutorOptions options;
  options.templates = *templates;
  v1::TrialAssignment a = Assignment("cmd", 1);
  a.mutable_spec()->mutable_search()->set_command_template("rm -rf /");
  const worker::Assignment assignment = ToAssignment(a);
  TrialContext context;
  context.assignment = &assignment;
  context.slots = Slots(1);
  context.trial_dir = dir_.path();
  search::TrialResult r = MakeCommandExecutor(options)->Run(context);
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_EQ(r.message,
            "search.command_template 'rm -rf /' is not configured on this worker (configured: "
            "other)");
}

// The shipped Megatron Bridge callback writes files the worker reads (python3 needed).
TEST_F(CommandTest, MegatronBridgeCallbackWritesWhatTheWorkerReads) {
  if (access("/usr/bin/python3", X_OK) != 0) GTEST_SKIP() << "python3 not installed";
  const std::string script = dir_ / "train.py";
  WriteText(script,
            "import sys\n"
            "sys.path.insert(0, '" REMAT_SOURCE_DIR
            "/worker/megatron_bridge')\n"
            "from remat_metrics_callback import RematMetricsCallback\n"
            "cb = RematMetricsCallback()\n"
            "cb.on_train_start()\n"
            "for i in range(int(sys.argv[1])):\n"
            "    cb.on_train_step_start()\n"
            "    cb.on_train_step_end(type('Ctx', (), {'loss_dict': {'lm loss': 3.0 - i}})())\n"
            "if sys.argv[2] == 'oom':\n"
            "    raise RuntimeError('CUDA out of memory. Tried to allocate 2.00 GiB')\n"
            "cb.on_train_end()\n");
  search::TrialResult r = Run("job: python3 " + script + " {train_iters} ok\n", Assignment("cmd", 1));
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  ASSERT_EQ(r.ranks.size(), 1);
  EXPECT_GT(r.step_time_s, 0);
  EXPECT_DOUBLE_EQ(r.loss, 1.0);  // the first measured step (after 2 warm-up steps)
  r = Run("job: python3 " + script + " 3 oom\n", Assignment("cmd", 1));
  EXPECT_EQ(r.status, TrialStatus::kOom) << r.message;
  EXPECT_NE(r.message.find("CUDA out of memory"), std::string::npos) << r.message;
}

// With search.proxy_layers the command backend runs the job once per proxy depth, each told its
// layer count and no memory cap, and predicts the full depth from the two, as the engine does.
TEST_F(CommandTest, DepthProxiesRunTheJobAtBothDepthsAndPredictTheFullDepth) {
  // A fake job whose peak and step time are affine in the layer count it is given.
  const std::string script = dir_ / "job.sh";
  WriteText(script, R"(#!/bin/sh
printf '%s\n' "$@" > args.txt
echo "$REMAT_NUM_LAYERS $REMAT_MEMORY_BUDGET_BYTES" > env.txt
L=$1
cat > "$REMAT_METRICS_FILE.rank0" <<EOT
{"ranks": [{"rank": 0, "peak_allocated_bytes": $((1000 + 100 * L)),
            "peak_reserved_bytes": $((2000 + 100 * L)),
            "step_times_s": [9, 9, 0.$L, 0.$L, 0.$L]}]}
EOT
)");
  v1::TrialAssignment a = Assignment("cmd", 1);
  a.mutable_spec()->mutable_model()->set_num_layers(8);
  a.mutable_spec()->mutable_search()->add_proxy_layers(2);
  a.mutable_spec()->mutable_search()->add_proxy_layers(4);
  a.mutable_spec()->mutable_search()->set_memory_budget_gib(70);
  const std::string yaml = "job: sh " + script +
                           " {num_layers} {num_layers_overrides} -- {num_layers_flags} --"
                           " {memory_budget_bytes} {memory_budget_gib} {memory_fraction}\n";
  search::TrialResult r = Run(yaml, a);
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  EXPECT_TRUE(r.predicted);
  ASSERT_EQ(r.proxies.size(), 2u);
  EXPECT_EQ(r.proxies[0].num_layers, 2);
  EXPECT_EQ(r.proxies[1].ranks[0].peak_allocated_bytes, 1400u);
  ASSERT_EQ(r.ranks.size(), 1u);
  EXPECT_EQ(r.ranks[0].peak_allocated_bytes, 1800u);  // 1000 + 100 x 8 layers
  EXPECT_EQ(r.ranks[0].peak_reserved_bytes, 2800u);
  EXPECT_NEAR(r.step_time_s, 0.8, 1e-9);  // 0.1 s a layer
  EXPECT_EQ(ReadText(dir_ / "depth-2/args.txt"),
            "2\nmodel.num_layers=2\n--\n--num-layers\n2\n--\n0\n0\n1\n");
  EXPECT_EQ(ReadText(dir_ / "depth-4/env.txt"), "4 0\n");
  EXPECT_EQ(ReadText(dir_ / "depth-4/args.txt").substr(0, 2), "4\n");
  // Both runs are recorded where a restarted worker looks for what to kill: the trial folder.
  const std::string record = ReadText(dir_ / ".remat-group");
  EXPECT_EQ(std::count(record.begin(), record.end(), '\n'), 2) << record;

  // A proxy that runs out of memory is the trial's status; the deeper one does not run.
  std::filesystem::remove_all(dir_ / "depth-2");
  std::filesystem::remove_all(dir_ / "depth-4");
  WriteText(script, "#!/bin/sh\necho 'torch.OutOfMemoryError: CUDA out of memory' >&2\nexit 1\n");
  r = Run(yaml, a);
  EXPECT_EQ(r.status, TrialStatus::kOom);
  EXPECT_EQ(r.message.rfind("proxy at 2 layers: oom: command exited with status 1", 0), 0u)
      << r.message;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "depth-4"));

  // A full:block policy that recomputes as many layers as the shallow proxy has cannot be
  // extrapolated: invalid, and nothing runs.
  WriteText(script, "#!/bin/sh\ntouch ran\n");
  a.mutable_policy()->set_canonical("full:block:2");
  r = Run(yaml, a);
  EXPECT_EQ(r.status, TrialStatus::kInvalid);
  EXPECT_NE(r.message.find("search.proxy_layers"), std::string::npos) << r.message;
  EXPECT_FALSE(std::filesystem::exists(dir_ / "depth-2/ran"));
}

// What each budget and depth placeholder becomes, capped (the whole model) and not (a proxy).
TEST(CommandTemplate, BudgetAndDepthValues) {
  v1::TrialAssignment wire = Assignment("cmd", 2);
  wire.mutable_spec()->mutable_model()->set_num_layers(4);
  wire.mutable_spec()->mutable_search()->set_memory_budget_gib(70.5);
  worker::Assignment a = ToAssignment(wire);
  a.spec.model.moe_layer_freq.pattern = {0, 1, 1, 1};
  CommandRun run;
  run.assignment = &a;
  run.spec = &a.spec;
  run.slots = Slots(2, /*gpu=*/true);
  run.slots[0].memory_bytes = 282ull << 30;
  run.slots[1].memory_bytes = 141ull << 30;  // the smallest GPU bounds the fraction
  run.metrics_path = "/w/m.json";
  auto v = CommandValues(run);
  EXPECT_EQ(v.at("memory_budget_bytes"), std::to_string(uint64_t{141} << 29));
  EXPECT_EQ(v.at("memory_budget_gib"), "70.5");
  EXPECT_EQ(v.at("memory_fraction"), "0.5");
  EXPECT_EQ(v.at("num_layers"), "4");
  EXPECT_EQ(v.at("num_layers_overrides"), "'model.num_layers=4' 'model.moe_layer_freq=[0,1,1,1]'");
  EXPECT_EQ(v.at("num_layers_flags"), "'--num-layers' '4' '--moe-layer-freq' '[0,1,1,1]'");
  EXPECT_EQ(v.at("gpus"), "4,5");
  EXPECT_EQ(v.at("global_batch_size"), "2");  // micro_batch_size 2 x data_parallel_size 1
  // Every placeholder has a value: a template may use any of them.
  for (const std::string& name : CommandPlaceholders()) EXPECT_EQ(v.count(name), 1u) << name;
  EXPECT_EQ(v.size(), CommandPlaceholders().size());

  run.slots[1].memory_bytes = 40ull << 30;  // a budget over the device's memory is no cap
  EXPECT_EQ(CommandValues(run).at("memory_fraction"), "1");
  // A proxy depth measures: no cap (search::DepthRunSpec, the one memory-cap rule).
  const search::SearchSpec cut = search::DepthRunSpec(a.spec, 2, 30);
  run.spec = &cut;
  v = CommandValues(run);
  EXPECT_EQ(v.at("memory_budget_bytes"), "0");
  EXPECT_EQ(v.at("memory_budget_gib"), "0");
  EXPECT_EQ(v.at("memory_fraction"), "1");
  run.spec = &a.spec;
  run.slots = Slots(2);  // plain slots: nothing to take a fraction of
  EXPECT_EQ(CommandValues(run).at("memory_fraction"), "1");

  auto loaded = ParseCommandTemplatesYaml(
      "j: run {memory_budget_bytes} {memory_budget_gib} {memory_fraction} {num_layers} "
      "{num_layers_overrides} {num_layers_flags}\n");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  auto bad = ParseCommandTemplatesYaml("j: run {num_layer}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "command templates: j.command: unknown placeholder {num_layer}");
}

// The shipped Megatron Bridge templates load, and the example spec's shallow proxy run expands to
// the command docs/megatron-bridge.md shows.
TEST(CommandTemplate, ShippedMegatronBridgeTemplateExpandsForTheExampleSpec) {
  auto templates = LoadCommandTemplatesFile(REMAT_SOURCE_DIR
                                            "/worker/megatron_bridge/command-templates.yaml");
  ASSERT_TRUE(templates.ok()) << templates.status();
  auto spec = spec::LoadSpecFile(REMAT_SOURCE_DIR "/examples/megatron-bridge-llama3-8b.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  worker::Assignment a;
  a.spec = *spec;
  a.world_size = 8;
  a.trial_id = "t-1";
  a.policy_name = "selective:[core_attn,mlp]";
  a.policy = *search::ParsePolicy(a.policy_name);
  const search::SearchSpec cut =
      search::DepthRunSpec(a.spec, a.spec.search.proxy_layers[0], a.spec.search.trial_timeout_s);
  CommandRun run;
  run.assignment = &a;
  run.spec = &cut;
  run.slots = Slots(8, /*gpu=*/true);
  run.metrics_path = "/w/t-1.1/depth-2/metrics.json";
  ASSERT_EQ(templates->count(a.spec.search.command_template), 1u);
  auto command =
      ExpandCommand(templates->at(a.spec.search.command_template).command, CommandValues(run));
  ASSERT_TRUE(command.ok()) << command.status();
  EXPECT_EQ(*command,
            "torchrun --standalone --nproc-per-node 8 "
            "/usr/share/remat/megatron_bridge/pretrain_with_remat.py "
            "--recipe megatron.bridge.recipes.llama:llama3_8b_pretrain_config "
            "'model.recompute_granularity=selective' 'model.recompute_method=null' "
            "'model.recompute_num_layers=null' 'model.recompute_modules=[core_attn,mlp]' "
            // warmup_max_steps 8 + the adaptive measurement's cap of 20 steps (search/noise.h)
            "'model.num_layers=2' train.train_iters=28 train.micro_batch_size=1 "
            "train.global_batch_size=8 model.seq_length=8192 dataset.sequence_length=8192 "
            "checkpoint.save=null");
}

TEST(CommandTemplate, ParsesBothFormsAndRefusesUnknownPlaceholders) {
  auto t = ParseCommandTemplatesYaml(
      "a: run {overrides}\nb:\n  command: go {nproc}\n  env: {X: '1'}\n  workdir: /tmp\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->at("a").command, "run {overrides}");
  EXPECT_EQ(t->at("b").env.size(), 1u);
  EXPECT_EQ(t->at("b").workdir, "/tmp");
  auto bad = ParseCommandTemplatesYaml("a: run {overides}\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(), "command templates: a.command: unknown placeholder {overides}");
  EXPECT_FALSE(ParseCommandTemplatesYaml("a:\n  cmd: x\n").ok());
  EXPECT_FALSE(ParseCommandTemplatesYaml("- a\n").ok());
  EXPECT_FALSE(ParseCommandTemplatesYaml("a: [1, 2\n").ok());
}

TEST(CommandTemplate, QuotesForTheShell) {
  EXPECT_EQ(ShellQuote("it's"), "'it'\\''s'");
  EXPECT_EQ(ShellQuoteWords("a=[x,y]  b"), "'a=[x,y]' 'b'");
  auto e = ExpandCommand("x {nproc} ${HOME} {gpus}", {{"nproc", "2"}, {"gpus", "0,1"}});
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(*e, "x 2 ${HOME} 0,1");
  EXPECT_FALSE(ExpandCommand("x {nproc}", {}).ok());
}

TEST(MetricsFile, RefusesMalformedDocumentsNamingTheKey) {
  EXPECT_FALSE(ParseMetricsJson("not json").ok());
  auto bad = ParseMetricsJson(R"({"ranks": [{"rank": 0, "step_times_s": "fast"}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "metrics file: ranks[0].step_times_s: must be a list of numbers");
  bad = ParseMetricsJson(R"({"ranks": [{"peak_allocated_bytes": -1}]})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("peak_allocated_bytes"), std::string::npos);
  // Found by fuzz_metrics_file (UBSan): a float above 2^64 was cast to uint64_t.
  const std::pair<const char*, const char*> out_of_range[] = {
      {R"({"ranks": [{"peak_allocated_bytes": 1.01111e+54}]})", "ranks[0].peak_allocated_bytes"},
      {R"({"ranks": [{"rank": 4294967296}]})", "ranks[0].rank"},
      {R"({"ranks": [{"rank": 0, "step_times_s": [0.5, -1]}]})", "ranks[0].step_times_s"},
  };
  for (const auto& [json, field] : out_of_range) {
    bad = ParseMetricsJson(json);
    ASSERT_FALSE(bad.ok()) << json;
    EXPECT_NE(bad.status().message().find(field), std::string::npos) << bad.status().message();
  }
}

// The command backend applies the steady-state rule (search/steady_state.h) to the reported step
// times, judged on the slowest rank's time of each step: every rank's warm-up ends together.
TEST(MetricsFile, WarmupLastsUntilTheSlowestRankSettles) {
  auto m = ParseMetricsJson(R"({"ranks": [
      {"rank": 0, "peak_allocated_bytes": 1,
       "step_times_s": [0.9, 0.6, 0.40, 0.41, 0.40, 0.40, 0.40, 0.39, 0.40, 0.40, 0.40],
       "losses": [9, 8, 7, 6, 5, 4, 3, 2, 1, 1, 1]},
      {"rank": 1, "peak_allocated_bytes": 1,
       "step_times_s": [0.8, 0.7, 0.45, 0.40, 0.40, 0.41, 0.42, 0.42, 0.42, 0.42, 0.42]}]})");
  ASSERT_TRUE(m.ok()) << m.status();
  v1::TrialAssignment a = Assignment("cmd", 2);
  a.mutable_spec()->mutable_search()->set_warmup_max_steps(8);
  a.mutable_spec()->mutable_search()->set_steady_window(3);
  a.mutable_spec()->mutable_search()->set_steady_tolerance(0.05);
  search::TrialResult r = MetricsToResult(ToAssignment(a), *m);
  ASSERT_EQ(r.status, TrialStatus::kOk) << r.message;
  // The slowest times: 0.9 0.7 0.45 0.41 0.40 0.41 ...: the last three agree within 5% after 6.
  EXPECT_EQ(r.warmup_steps_taken, 6);
  EXPECT_TRUE(r.warmup_settled);
  ASSERT_EQ(r.ranks.size(), 2u);
  EXPECT_EQ(r.ranks[0].warmup_steps_taken, 6);
  EXPECT_EQ(r.ranks[0].warmup_step_times_s.size(), 6u);
  EXPECT_EQ(r.ranks[0].step_times_s, (std::vector<double>{0.40, 0.39, 0.40}));
  EXPECT_DOUBLE_EQ(r.step_time_s, 0.42);
  EXPECT_DOUBLE_EQ(r.loss, 7);  // step index warmup_steps (2), whatever the warm-up took
}

TEST(MetricsFile, TooFewStepsIsFailed) {
  auto m = ParseMetricsJson(R"({"ranks": [{"rank": 0, "peak_allocated_bytes": 1,
                                           "step_times_s": [1, 1]}]})");
  ASSERT_TRUE(m.ok());
  search::TrialResult r = MetricsToResult(ToAssignment(Assignment("cmd", 1)), *m);
  EXPECT_EQ(r.status, TrialStatus::kFailed);
  EXPECT_NE(r.message.find("warmup_steps is 2"), std::string::npos) << r.message;
  EXPECT_EQ(r.ranks[0].peak_reserved_bytes, 1u);  // reserved defaults to allocated
}

}  // namespace
}  // namespace remat::worker
