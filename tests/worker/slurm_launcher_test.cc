// The Slurm launcher's pure parts (layout, sbatch flags, parsing Slurm's answers, job states ->
// results) and its control flow, with the builtin backend, against fake sbatch/scontrol/scancel
// scripts. The real Slurm runs are tests/slurm/slurm_executor_test.sh (every backend).
#include "worker/slurm_launcher.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <thread>

#include "tests/worker/test_util.h"
#include "worker/trial_pipeline.h"

namespace remat::worker {
namespace {

using testing::ReadText;
using testing::TempDir;
using testing::WriteText;

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

TEST(SlurmLayout, CpuTrialsShareOneNodeWithoutGres) {
  SlurmLayoutOrError p = PlanSlurmLayout(2, search::Device::kCpu, 8);
  ASSERT_TRUE(p.error.empty());
  EXPECT_EQ(p.layout.nodes, 1);
  EXPECT_EQ(p.layout.tasks, 2);
  EXPECT_EQ(p.layout.tasks_per_node, 2);
  EXPECT_EQ(p.layout.gpus_per_node, 0);
  // auto on CPU nodes is a CPU trial
  EXPECT_EQ(PlanSlurmLayout(4, search::Device::kAuto, 0).layout.gpus_per_node, 0);
}

TEST(SlurmLayout, GpuTrialsSpreadOverNodesOneGpuPerRank) {
  SlurmLayoutOrError p = PlanSlurmLayout(12, search::Device::kCuda, 8);
  ASSERT_TRUE(p.error.empty());
  EXPECT_EQ(p.layout.nodes, 2);
  EXPECT_EQ(p.layout.tasks, 12);
  EXPECT_EQ(p.layout.tasks_per_node, 6);
  EXPECT_EQ(p.layout.gpus_per_node, 6);
  p = PlanSlurmLayout(4, search::Device::kAuto, 8);
  EXPECT_EQ(p.layout.nodes, 1);
  EXPECT_EQ(p.layout.gpus_per_node, 4);
}

TEST(SlurmLayout, CudaTrialOnCpuNodesIsRefusedNamingTheFlag) {
  SlurmLayoutOrError p = PlanSlurmLayout(1, search::Device::kCuda, 0);
  EXPECT_NE(p.error.find("--slurm-gpus-per-node"), std::string::npos) << p.error;
}

TEST(SlurmArgs, TimeLimitIsTheTrialTimeoutRoundedUpPlusAMinute) {
  EXPECT_EQ(SlurmTimeLimit(900), "16");
  EXPECT_EQ(SlurmTimeLimit(3), "2");
  EXPECT_EQ(SlurmTimeLimit(3600), "1:01:00");
}

TEST(SlurmArgs, OperatorsSettingsAndGres) {
  SlurmLauncherOptions o;
  o.partition = "gpu";
  o.account = "proj";
  o.qos = "high";
  o.extra_sbatch_args = {"--mem=64G"};
  SlurmLayout gpu{2, 16, 8, 8};
  std::vector<std::string> args = SbatchArguments(o, gpu, "remat-t-1.1", "remat:trial=t-1.1",
                                                  "/w/t", 900);
  for (const char* want : {"--parsable", "--nodes=2", "--ntasks=16", "--ntasks-per-node=8",
                           "--gres=gpu:8", "--partition=gpu", "--account=proj", "--qos=high",
                           "--time=16", "--chdir=/w/t", "--job-name=remat-t-1.1", "--requeue",
                           "--export=PATH,LD_LIBRARY_PATH,TMPDIR"}) {
    EXPECT_TRUE(Has(args, want)) << want;
  }
  EXPECT_EQ(args.back(), "--mem=64G");  // the operator's flags come last: they win
  o.time_limit = "02:00:00";
  SlurmLayout cpu{1, 2, 2, 0};
  args = SbatchArguments(o, cpu, "n", "c", "/w", 900);
  EXPECT_TRUE(Has(args, "--time=02:00:00"));
  for (const std::string& a : args) EXPECT_EQ(a.find("--gres"), std::string::npos) << a;
}

TEST(SlurmParse, ScontrolLine) {
  auto info = ParseScontrolJob(
      "JobId=13 JobName=remat-t-4.1 UserId=root(0) JobState=CANCELLED Reason=None "
      "Dependency=(null) Requeue=0 ExitCode=143:0 RunTime=00:00:03 Comment=remat:trial=t-4.1\n");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, "CANCELLED");
  EXPECT_EQ(info->exit_code, 143);
  EXPECT_EQ(info->signal, 0);
  EXPECT_TRUE(info->terminal());
  EXPECT_FALSE(ParseScontrolJob("slurm_load_jobs error: Invalid job id specified").has_value());
  info = ParseScontrolJob("JobId=1 JobState=PENDING Reason=Resources ExitCode=0:0");
  EXPECT_FALSE(info->terminal());
  EXPECT_FALSE(info->started());
  EXPECT_TRUE(ParseScontrolJob("JobId=1 JobState=RUNNING Reason=None")->started());
}

TEST(SlurmParse, SacctRowAndSbatchId) {
  auto info = ParseSacctJob("CANCELLED by 0|0:15|None\n");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->state, "CANCELLED");
  EXPECT_EQ(info->signal, 15);
  EXPECT_FALSE(ParseSacctJob("").has_value());
  EXPECT_EQ(ParseSbatchJobId("123;cluster-a\n"), "123");
  EXPECT_EQ(ParseSbatchJobId("77\n"), "77");
  EXPECT_EQ(ParseSbatchJobId("sbatch: error: oops\n"), "");
}

TEST(SlurmEnd, JobStatesBecomeTrialResults) {
  SlurmJobInfo info;
  info.state = "TIMEOUT";
  EXPECT_EQ(SlurmJobEndResult("Slurm job 5", info).status, search::TrialStatus::kTimeout);
  info.state = "DEADLINE";
  EXPECT_EQ(SlurmJobEndResult("Slurm job 5", info).status, search::TrialStatus::kTimeout);
  // Host memory is not the policy's GPU memory: failed, not oom.
  info.state = "OUT_OF_MEMORY";
  search::TrialResult r = SlurmJobEndResult("Slurm job 5", info);
  EXPECT_EQ(r.status, search::TrialStatus::kFailed);
  EXPECT_NE(r.message.find("host memory"), std::string::npos) << r.message;
  info.state = "NODE_FAIL";
  info.reason = "NodeDown";
  r = SlurmJobEndResult("Slurm job 5", info);
  EXPECT_EQ(r.status, search::TrialStatus::kFailed);
  EXPECT_NE(r.message.find("Slurm job 5 ended NODE_FAIL, reason NodeDown"), std::string::npos)
      << r.message;
}

// Fake Slurm commands: sbatch records its arguments and prints the next job id (77, 78, ...;
// or fails as told); squeue prints each asked job's state (the file state.ID, else state) as
// the executor's batched poll asks for it and logs the ids of each call, or with --me the
// orphans file; scontrol prints the state; scancel records the id and marks the job CANCELLED.
class FakeSlurmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string f = fake_.path();
    Script("sbatch",
           "echo \"$@\" > " + f + "/sbatch.args\n"
           "if [ -f " + f + "/refuse ]; then cat " + f + "/refuse >&2; exit 1; fi\n"
           "exec 9>" + f + "/sbatch.lock && flock 9\n"  // trials submit at once
           "n=$(cat " + f + "/next 2>/dev/null || echo 77)\n"
           "echo $((n + 1)) > " + f + "/next\n"
           "echo $n\n");
    Script("squeue",
           "case \"$*\" in *--me*) cat " + f + "/orphans 2>/dev/null; exit 0 ;; esac\n"
           "for a in \"$@\"; do case $a in --jobs=*) jobs=${a#--jobs=} ;; esac; done\n"
           "echo \"$jobs\" >> " + f + "/squeue.calls\n"
           "for j in $(echo \"$jobs\" | tr , ' '); do\n"
           "  s=$(cat " + f + "/state.$j 2>/dev/null || cat " + f + "/state)\n"
           "  printf '%s|%s|%s|0|\\n' \"$j\" \"$s\" \"$(cat " + f + "/reason)\"\n"
           "done\n");
    Script("scontrol", "printf 'JobId=77 JobName=x JobState=%s Reason=%s ExitCode=0:0\\n' "
                       "\"$(cat " + f + "/state)\" \"$(cat " + f + "/reason)\"\n");
    Script("scancel", "echo \"$@\" >> " + f + "/scancel.args\necho CANCELLED > " + f +
                          "/state\n");
    Script("sacct", "exit 1\n");
    WriteText(fake_ / "state", "RUNNING\n");
    WriteText(fake_ / "reason", "None\n");
    options_.sbatch = fake_ / "sbatch";
    options_.squeue = fake_ / "squeue";
    options_.scontrol = fake_ / "scontrol";
    options_.scancel = fake_ / "scancel";
    options_.sacct = fake_ / "sacct";
    options_.poll_interval_s = 0.05;
    a_.trial_id = "t-9";
    a_.attempt = 2;
    a_.world_size = 2;
    a_.policy_name = "selective:[mlp]";
    a_.spec.parallel.tensor_model_parallel_size = 2;
    a_.spec.search.trial_timeout_s = 30;
  }
  void Script(const std::string& name, const std::string& body) {
    WriteText(fake_ / name, "#!/bin/sh\n" + body);
    chmod((fake_ / name).c_str(), 0755);
  }
  std::unique_ptr<TrialExecutor> MakeExecutor() {
    return MakeTrialExecutor(MakeBuiltinBackend({"/opt/remat/bin/remat-trial"}),
                             MakeSlurmLauncher(options_));
  }
  search::TrialResult Run(const CancelToken* cancel = nullptr) {
    auto executor = MakeExecutor();
    TrialContext context;
    context.assignment = &a_;
    context.trial_dir = trial_.path();
    context.cancel = cancel;
    return executor->Run(context);
  }
  TempDir fake_, trial_;
  SlurmLauncherOptions options_;
  Assignment a_;
};

TEST_F(FakeSlurmTest, SbatchRefusalIsAFailedTrialWithSlurmsWords) {
  WriteText(fake_ / "refuse", "sbatch: error: invalid partition specified: nope\n");
  search::TrialResult r = Run();
  EXPECT_EQ(r.status, search::TrialStatus::kFailed);
  EXPECT_EQ(r.message,
            "Slurm refused the trial's job: sbatch: error: invalid partition specified: nope");
}

TEST_F(FakeSlurmTest, WritesTheJobAndMapsOutOfMemory) {
  WriteText(fake_ / "state", "OUT_OF_MEMORY\n");
  WriteText(fake_ / "reason", "OutOfMemory\n");
  search::TrialResult r = Run();
  EXPECT_EQ(r.status, search::TrialStatus::kFailed);
  EXPECT_NE(r.message.find("Slurm job 77 ended OUT_OF_MEMORY, reason OutOfMemory"),
            std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("rank 1: remat-trial was killed with Slurm job 77"),
            std::string::npos)
      << r.message;
  const std::string args = ReadText(fake_ / "sbatch.args");
  EXPECT_NE(args.find("--job-name=remat-t-9.2"), std::string::npos) << args;
  EXPECT_NE(args.find("--ntasks=2"), std::string::npos) << args;
  EXPECT_NE(args.find(trial_ / "job.sh"), std::string::npos) << args;
  // Every rank has its request; the rank script takes its rank from srun and hides GPUs.
  EXPECT_FALSE(ReadText(trial_ / "request-1.pb").empty());
  const std::string rank = ReadText(trial_ / "rank.sh");
  EXPECT_NE(rank.find("SLURM_PROCID"), std::string::npos);
  EXPECT_NE(rank.find("export CUDA_VISIBLE_DEVICES="), std::string::npos);
  // The spec's environment (search.allocator_conf, worker/trial_pipeline.h TrialEnvironment).
  EXPECT_NE(rank.find("1) (export PYTORCH_CUDA_ALLOC_CONF='expandable_segments:True'; cd '" +
                      trial_.path() + "' && exec '/opt/remat/bin/remat-trial' "
                      "'--request' '" + trial_.path() + "/request-1.pb'"),
            std::string::npos)
      << rank;
  EXPECT_NE(ReadText(trial_ / "job.sh").find("srun --kill-on-bad-exit=1 --wait=60"),
            std::string::npos);
}

TEST_F(FakeSlurmTest, CancelScancelsTheJob) {
  CancelToken cancel;
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel.Cancel();
  });
  search::TrialResult r = Run(&cancel);
  later.join();
  EXPECT_EQ(r.status, search::TrialStatus::kCancelled);
  EXPECT_EQ(ReadText(fake_ / "scancel.args"), "77\n");
}

TEST_F(FakeSlurmTest, RunningPastTheTrialTimeoutIsScancelled) {
  a_.spec.search.trial_timeout_s = (0.3);
  search::TrialResult r = Run();
  EXPECT_EQ(r.status, search::TrialStatus::kTimeout);
  EXPECT_NE(r.message.find("Slurm job 77 scancelled"), std::string::npos) << r.message;
  EXPECT_EQ(ReadText(fake_ / "scancel.args"), "77\n");
}

TEST_F(FakeSlurmTest, QueuedTimeDoesNotCountAgainstTheTimeout) {
  a_.spec.search.trial_timeout_s = (0.3);
  WriteText(fake_ / "state", "PENDING\n");
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    WriteText(fake_ / "state", "FAILED\n");
  });
  search::TrialResult r = Run();
  later.join();
  // It ended (FAILED, no results) before it ever ran: failed, not timeout, and no scancel.
  EXPECT_EQ(r.status, search::TrialStatus::kFailed) << r.message;
  EXPECT_EQ(ReadText(fake_ / "scancel.args"), "");
}

TEST_F(FakeSlurmTest, OrphanedJobsOfThisWorkerTagAreCancelledOthersKept) {
  const std::string tag = SlurmWorkerTag("node1", "/var/lib/remat-worker");
  EXPECT_EQ(tag.size(), 16u);
  EXPECT_EQ(tag, SlurmWorkerTag("node1", "/var/lib/remat-worker"));
  EXPECT_NE(tag, SlurmWorkerTag("node2", "/var/lib/remat-worker"));
  WriteText(fake_ / "orphans", "5|remat:trial=t-1.1 remat:worker=" + tag +
                                  "\n6|a user job\n7|remat:trial=t-2.1 remat:worker=0123456789abcdef\n");
  options_.worker_tag = tag;
  absl::StatusOr<std::vector<std::string>> cancelled =
      CancelOrphanedSlurmJobs(options_, trial_ / "s");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(*cancelled, std::vector<std::string>{"5"});
  EXPECT_EQ(ReadText(fake_ / "scancel.args"), "5\n");
  // Jobs carry the tag.
  WriteText(fake_ / "state", "COMPLETED\n");
  Run();
  EXPECT_NE(ReadText(fake_ / "sbatch.args").find("--comment=remat:trial=t-9.2 remat:worker=" + tag),
            std::string::npos);
}

TEST_F(FakeSlurmTest, ARequeuedJobGetsTheWholeTimeoutAgain) {
  a_.spec.search.trial_timeout_s = (1.5);
  std::thread slurm([&] {
    // Two runs of 0.9 s each, with a requeue between: 1.8 s running in all, each run < 1.5 s.
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    WriteText(fake_ / "state", "PENDING\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    WriteText(fake_ / "state", "RUNNING\n");
    std::this_thread::sleep_for(std::chrono::milliseconds(900));
    WriteText(fake_ / "state", "COMPLETED\n");
  });
  search::TrialResult r = Run();
  slurm.join();
  EXPECT_NE(r.status, search::TrialStatus::kTimeout) << r.message;
  EXPECT_EQ(ReadText(fake_ / "scancel.args"), "");
  // The job starts each run clean.
  EXPECT_NE(ReadText(trial_ / "job.sh").find("rm -rf exit-* result-*.pb rendezvous && mkdir -p 'rendezvous'"),
            std::string::npos);
}

// A requeue ends the job's run before Slurm queues it again: a poll that reads FAILED once and
// then PENDING follows the job on (the real Slurm test saw this a second after `scontrol
// requeue`); FAILED on two polls in a row ends the trial.
TEST_F(FakeSlurmTest, AFailedEndIsTakenOnlyWhenTheNextPollStillSaysSo) {
  const std::string f = fake_.path();
  // squeue answers the states of `seq` one poll after another, then its last line.
  Script("squeue",
         "for a in \"$@\"; do case $a in --jobs=*) jobs=${a#--jobs=} ;; esac; done\n"
         "n=$(( $(cat " + f + "/polls 2>/dev/null || echo 0) + 1 )); echo $n > " + f + "/polls\n"
         "s=$(sed -n \"${n}p\" " + f + "/seq); [ -n \"$s\" ] || s=$(tail -n 1 " + f + "/seq)\n"
         "printf '%s|%s|None|0|\\n' \"$jobs\" \"$s\"\n");
  WriteText(fake_ / "seq", "RUNNING\nFAILED\nPENDING\nRUNNING\nCOMPLETED\n");
  search::TrialResult r = Run();
  EXPECT_EQ(r.message.find("FAILED"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("COMPLETED"), std::string::npos) << r.message;
  EXPECT_GE(std::stoi(ReadText(fake_ / "polls")), 5);

  WriteText(fake_ / "polls", "0\n");
  WriteText(fake_ / "seq", "RUNNING\nFAILED\n");
  r = Run();
  EXPECT_EQ(r.status, search::TrialStatus::kFailed);
  EXPECT_NE(r.message.find("(FAILED)"), std::string::npos) << r.message;
  EXPECT_EQ(ReadText(fake_ / "polls"), "3\n");
}

// One executor, several trials at once: every poll asks squeue about all of the jobs in one
// call, so the controller sees one request per poll interval however many trials run (before,
// each trial ran its own scontrol every interval).
TEST_F(FakeSlurmTest, ConcurrentTrialsShareOneBatchedPollPerInterval) {
  options_.poll_interval_s = 0.2;
  auto executor = MakeExecutor();
  constexpr int kTrials = 4;
  std::vector<Assignment> assignments(kTrials, a_);
  std::vector<TempDir> dirs(kTrials);
  std::vector<search::TrialResult> results(kTrials);
  std::vector<std::thread> threads;
  for (int i = 0; i < kTrials; ++i) {
    assignments[i].trial_id = "t-" + std::to_string(i);
    threads.emplace_back([&, i] {
      TrialContext context;
      context.assignment = &assignments[i];
      context.trial_dir = dirs[i].path();
      results[i] = executor->Run(context);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  WriteText(fake_ / "state", "FAILED\n");
  for (auto& t : threads) t.join();
  for (const auto& r : results) {
    EXPECT_EQ(r.status, search::TrialStatus::kFailed) << r.message;
  }
  std::istringstream calls(ReadText(fake_ / "squeue.calls"));
  std::string line;
  int n = 0, with_all = 0;
  while (std::getline(calls, line)) {
    ++n;
    if (std::count(line.begin(), line.end(), ',') == kTrials - 1) ++with_all;
  }
  // About 1.5 s / 0.2 s polls in all (not per trial), nearly all of them for the four jobs.
  EXPECT_GE(n, 4);
  EXPECT_LE(n, 12) << ReadText(fake_ / "squeue.calls");
  EXPECT_GE(with_all, n - 3) << ReadText(fake_ / "squeue.calls");
}

TEST(SlurmParse, SqueueAndSacctBatches) {
  // squeue -O JobID:|,State:|,Reason:|,exit_code:| as Slurm 22.05 prints it; exit_code is the
  // wait status (768: exit 3).
  auto jobs = ParseSqueueJobs("1|FAILED|NonZeroExitCode|768|\n3|PENDING|Resources|0|\n"
                              "2|RUNNING|None|0|\nslurm_load_jobs error: Invalid job id\n");
  ASSERT_EQ(jobs.size(), 3u);
  EXPECT_EQ(jobs["1"].state, "FAILED");
  EXPECT_EQ(jobs["1"].exit_code, 3);
  EXPECT_TRUE(jobs["1"].terminal());
  EXPECT_EQ(jobs["3"].reason, "Resources");
  EXPECT_FALSE(jobs["3"].started());
  EXPECT_TRUE(jobs["2"].started());
  auto acct = ParseSacctJobs("12|CANCELLED by 0|0:15|None\n12.batch|CANCELLED|0:15|\n"
                             "13|COMPLETED|0:0|None\n");
  ASSERT_EQ(acct.size(), 3u);  // 12.batch is its own row; the executor asks for 12 and 13
  EXPECT_EQ(acct["12"].state, "CANCELLED");
  EXPECT_EQ(acct["12"].signal, 15);
  EXPECT_EQ(acct["13"].state, "COMPLETED");
}

TEST(SlurmAccounts, TheOwnersMappedAccountOrTheDefault) {
  TempDir dir;
  WriteText(dir / "accounts", "# user account\nalice ml-alice\nbob   physics  # lab\n");
  auto accounts = ReadSlurmUserAccounts(dir / "accounts");
  ASSERT_TRUE(accounts.ok()) << accounts.status();
  SlurmLauncherOptions o;
  o.account = "remat";
  o.user_accounts = *accounts;
  EXPECT_EQ(SlurmAccountFor(o, "alice"), "ml-alice");
  EXPECT_EQ(SlurmAccountFor(o, "bob"), "physics");
  EXPECT_EQ(SlurmAccountFor(o, "carol"), "remat");
  EXPECT_EQ(SlurmAccountFor(o, ""), "remat");
  WriteText(dir / "bad", "alice ml\nbob\n");
  auto bad = ReadSlurmUserAccounts(dir / "bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("bad:2: expected \"USER ACCOUNT\""), std::string::npos)
      << bad.status();
  WriteText(dir / "twice", "alice a\nalice b\n");
  EXPECT_NE(ReadSlurmUserAccounts(dir / "twice").status().message().find("named twice"),
            std::string::npos);
  EXPECT_FALSE(ReadSlurmUserAccounts(dir / "missing").ok());
}

TEST_F(FakeSlurmTest, AJobIsChargedToItsOwnersMappedAccount) {
  options_.account = "remat";
  options_.user_accounts = {{"alice", "ml-alice"}};
  WriteText(fake_ / "state", "COMPLETED\n");
  a_.owner = "alice";
  Run();
  EXPECT_NE(ReadText(fake_ / "sbatch.args").find("--account=ml-alice"), std::string::npos)
      << ReadText(fake_ / "sbatch.args");
  a_.owner = "bob";
  Run();
  EXPECT_NE(ReadText(fake_ / "sbatch.args").find("--account=remat"), std::string::npos)
      << ReadText(fake_ / "sbatch.args");
}

}  // namespace
}  // namespace remat::worker
