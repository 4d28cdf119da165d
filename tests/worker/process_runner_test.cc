#include "worker/process_runner.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <sstream>
#include <thread>

#include "tests/worker/test_util.h"

namespace remat::worker {
namespace {

using testing::ProcessEnded;
using testing::ReadText;
using testing::TempDir;
using testing::WaitUntil;
using testing::WriteText;

ChildSpec Shell(const std::string& script, const std::string& dir) {
  ChildSpec c;
  c.argv = {"/bin/sh", "-c", script};
  c.cwd = dir;
  c.stdout_path = dir + "/out.log";
  c.stderr_path = dir + "/err.log";
  return c;
}

TEST(ProcessRunner, ReportsExitCodeAndStderr) {
  TempDir dir;
  GroupOutcome o = RunProcessGroup(
      {Shell("echo first >&2; echo 'last words' >&2; exit 3", dir.path())}, GroupLimits{}, nullptr);
  ASSERT_EQ(o.children.size(), 1u);
  EXPECT_TRUE(o.children[0].started);
  EXPECT_TRUE(o.children[0].exited);
  EXPECT_EQ(o.children[0].exit_code, 3);
  EXPECT_FALSE(o.children[0].ok());
  EXPECT_EQ(o.children[0].Describe(), "exited with status 3");
  EXPECT_FALSE(o.timed_out);
  EXPECT_EQ(FileTail(dir / "err.log"), "first | last words");
}

TEST(ProcessRunner, ReportsSignal) {
  TempDir dir;
  GroupOutcome o = RunProcessGroup({Shell("kill -SEGV $$", dir.path())}, GroupLimits{}, nullptr);
  EXPECT_FALSE(o.children[0].exited);
  EXPECT_EQ(o.children[0].signal, SIGSEGV);
  EXPECT_NE(o.children[0].Describe().find("killed by signal 11"), std::string::npos);
}

TEST(ProcessRunner, SetsEnvironmentAndWorkingDirectory) {
  TempDir dir;
  ChildSpec c = Shell("echo \"$REMAT_TEST_VAR $(pwd)\"", dir.path());
  c.env = {{"REMAT_TEST_VAR", "hello"}};
  GroupOutcome o = RunProcessGroup({c}, GroupLimits{}, nullptr);
  ASSERT_TRUE(o.children[0].ok());
  std::string expected_dir = std::filesystem::canonical(dir.path()).string();
  EXPECT_EQ(ReadText(dir / "out.log"), "hello " + expected_dir + "\n");
}

TEST(ProcessRunner, SpawnFailureIsAnOutcomeNotACrash) {
  ChildSpec c;
  c.argv = {"/nonexistent/remat-trial"};
  GroupOutcome o = RunProcessGroup({c}, GroupLimits{}, nullptr);
  EXPECT_FALSE(o.children[0].started);
  EXPECT_NE(o.children[0].Describe().find("did not start"), std::string::npos);
}

TEST(ProcessRunner, TimeoutKillsTheWholeGroup) {
  TempDir dir;
  // The child starts a grandchild and ignores SIGTERM, so only SIGKILL of the group ends both.
  ChildSpec c = Shell("trap '' TERM; sleep 1000 & echo $! > gc.pid; wait", dir.path());
  GroupLimits limits;
  limits.timeout_s = 0.3;
  limits.kill_grace_s = 0.2;
  GroupOutcome o = RunProcessGroup({c}, limits, nullptr);
  EXPECT_TRUE(o.timed_out);
  EXPECT_FALSE(o.children[0].exited);
  EXPECT_EQ(o.children[0].signal, SIGKILL);
  EXPECT_LT(o.elapsed_s, 5);
  pid_t grandchild = std::stoi(ReadText(dir / "gc.pid"));
  EXPECT_TRUE(ProcessEnded(grandchild));
}

TEST(ProcessRunner, StrayGrandchildrenAreKilledAfterANormalExit) {
  TempDir dir;
  ChildSpec c = Shell("sleep 1000 & echo $! > gc.pid; exit 0", dir.path());
  GroupOutcome o = RunProcessGroup({c}, GroupLimits{}, nullptr);
  EXPECT_TRUE(o.children[0].ok());
  pid_t grandchild = std::stoi(ReadText(dir / "gc.pid"));
  EXPECT_TRUE(ProcessEnded(grandchild));
}

TEST(ProcessRunner, CancelEndsTheGroup) {
  TempDir dir;
  CancelToken cancel;
  std::thread canceller([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    cancel.Cancel();
  });
  GroupLimits limits;
  limits.kill_grace_s = 0.5;
  GroupOutcome o = RunProcessGroup({Shell("sleep 1000", dir.path())}, limits, &cancel);
  canceller.join();
  EXPECT_TRUE(o.cancelled);
  EXPECT_FALSE(o.timed_out);
  EXPECT_FALSE(o.children[0].ok());
}

TEST(ProcessRunner, PeersOfAFailedChildAreKilledAfterTheGrace) {
  TempDir dir;
  GroupLimits limits;
  limits.peer_failure_grace_s = 0.2;
  limits.kill_grace_s = 0.2;
  GroupOutcome o = RunProcessGroup({Shell("exit 4", dir.path()), Shell("sleep 1000", dir.path())},
                                   limits, nullptr);
  EXPECT_TRUE(o.lingered_kill);
  EXPECT_EQ(o.first_ended, 0);
  EXPECT_FALSE(o.first_ended_cleanly);
  EXPECT_EQ(o.children[0].exit_code, 4);
  EXPECT_EQ(o.children[1].signal, SIGTERM);
}

TEST(ProcessRunner, PeersStillRunningLongAfterAChildFinishedAreKilled) {
  TempDir dir;
  GroupLimits limits;
  limits.peer_exit_grace_s = 0.3;
  limits.kill_grace_s = 0.2;
  GroupOutcome o = RunProcessGroup({Shell("sleep 1000", dir.path()), Shell("exit 0", dir.path())},
                                   limits, nullptr);
  EXPECT_TRUE(o.lingered_kill);
  EXPECT_EQ(o.first_ended, 1);
  EXPECT_TRUE(o.first_ended_cleanly);
  EXPECT_TRUE(o.children[1].ok());
  EXPECT_EQ(o.children[0].signal, SIGTERM);
  EXPECT_LT(o.elapsed_s, 10.0);
}

TEST(ProcessRunner, ChildrenFinishingAtDifferentTimesWithinTheGraceAreLeftAlone) {
  TempDir dir;
  GroupLimits limits;
  limits.peer_exit_grace_s = 30;
  GroupOutcome o = RunProcessGroup({Shell("sleep 0.5", dir.path()), Shell("exit 0", dir.path())},
                                   limits, nullptr);
  EXPECT_FALSE(o.lingered_kill);
  EXPECT_TRUE(o.children[0].ok());
  EXPECT_TRUE(o.children[1].ok());
}

TEST(ProcessRunner, AllChildrenShareOneProcessGroup) {
  TempDir dir;
  GroupOutcome o =
      RunProcessGroup({Shell("cut -d' ' -f5 /proc/$$/stat > a.pgid", dir.path()),
                       Shell("sleep 0.2; cut -d' ' -f5 /proc/$$/stat > b.pgid", dir.path())},
                      GroupLimits{}, nullptr);
  ASSERT_TRUE(o.children[0].ok());
  ASSERT_TRUE(o.children[1].ok());
  std::string a = ReadText(dir / "a.pgid"), b = ReadText(dir / "b.pgid");
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_NE(std::stoi(a), getpgrp());
}

// The record a restarted worker reads: a live member with its start time ends the group; a
// record whose start time does not match (a recycled pid) kills nothing.
TEST(ProcessRunner, RecordedGroupsAreKilledOnlyWhileTheirProcessesLive) {
  TempDir dir;
  const std::string record = dir / "group";
  std::thread run([&] {
    GroupLimits limits;
    limits.timeout_s = 60;
    limits.group_record_path = record;
    GroupOutcome o = RunProcessGroup({Shell("sleep 300", dir.path())}, limits, nullptr);
    EXPECT_EQ(o.children[0].signal, SIGKILL);
  });
  ASSERT_TRUE(WaitUntil([&] { return !ReadText(record).empty(); }));
  std::istringstream fields(ReadText(record));
  long long pgid = 0, pid = 0;
  unsigned long long start = 0;
  ASSERT_TRUE(fields >> pgid >> pid >> start);
  EXPECT_EQ(pgid, pid);
  const std::string wrong = dir / "wrong";
  WriteText(wrong, std::to_string(pgid) + " " + std::to_string(pid) + " " +
                       std::to_string(start + 1) + "\n");
  EXPECT_FALSE(KillRecordedGroup(wrong));
  EXPECT_TRUE(KillRecordedGroup(record));
  run.join();
  EXPECT_FALSE(KillRecordedGroup(record));  // gone: nothing to kill
}

TEST(ProcessRunner, CaptureOutput) {
  std::string out;
  EXPECT_TRUE(CaptureOutput({"/bin/echo", "a=1"}, 5, &out));
  EXPECT_EQ(out, "a=1\n");
  EXPECT_FALSE(CaptureOutput({"/bin/false"}, 5, &out));
  EXPECT_FALSE(CaptureOutput({"/bin/sleep", "100"}, 0.2, &out));
}

TEST(ProcessRunner, FileTailKeepsTheLastLines) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 100; ++i) text += "line " + std::to_string(i) + "\n";
  testing::WriteText(dir / "log", text);
  EXPECT_EQ(FileTail(dir / "log", 2), "line 98 | line 99");
  EXPECT_EQ(FileTail(dir / "missing"), "");
}

}  // namespace
}  // namespace remat::worker
