#include "common/main_util.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

namespace remat::common {
namespace {

TEST(MainUtil, FailPrintsOneErrorLineAndReturnsTheCode) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(Fail(2, "--db: must be set"), 2);
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "error: --db: must be set\n");
}

TEST(MainUtil, ReadFileReturnsTheBytesOrNothing) {
  const std::string path = ::testing::TempDir() + "/main_util_test.bin";
  const std::string bytes("a\0b\nc", 5);
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << bytes;
  }
  auto text = ReadFile(path);
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ(*text, bytes);
  EXPECT_FALSE(ReadFile(path + ".missing").has_value());
}

TEST(MainUtil, SelfDirIsTheFolderOfThisProgram) {
  const std::filesystem::path dir = SelfDir();
  EXPECT_TRUE(dir.is_absolute());
  EXPECT_TRUE(std::filesystem::exists(dir / "common_unit_test")) << dir;
}

TEST(MainUtil, StopSignalsCallsOnStopOnceForTheFirstSignal) {
  StopSignals signals;
  std::atomic<int> calls{0}, seen{0};
  signals.OnStop([&](int sig) {
    seen = sig;
    ++calls;
  });
  kill(getpid(), SIGTERM);  // blocked in every thread but the waiter: it does not end the test
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (calls.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  signals.Finish();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(seen.load(), SIGTERM);
}

TEST(MainUtil, StopSignalsReloadsOnHangupAndStillStopsOnTerm) {
  StopSignals signals(StopSignals::kReloadOnHangup);
  std::atomic<int> stops{0}, reloads{0};
  signals.OnStop([&](int) { ++stops; }, [&] { ++reloads; });
  auto wait_for = [](const std::atomic<int>& n, int want) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (n.load() < want && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  };
  kill(getpid(), SIGHUP);  // without the reload set this would end the test program
  wait_for(reloads, 1);
  kill(getpid(), SIGHUP);
  wait_for(reloads, 2);
  EXPECT_EQ(reloads.load(), 2);
  EXPECT_EQ(stops.load(), 0);
  kill(getpid(), SIGTERM);
  wait_for(stops, 1);
  signals.Finish();
  EXPECT_EQ(stops.load(), 1);
  EXPECT_EQ(reloads.load(), 2);
}

TEST(MainUtil, StopSignalsFinishWithoutASignalCallsNothing) {
  StopSignals signals;
  std::atomic<int> calls{0};
  signals.OnStop([&](int) { ++calls; });
  const auto t0 = std::chrono::steady_clock::now();
  signals.Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(calls.load(), 0);
  signals.Finish();  // idempotent
}

}  // namespace
}  // namespace remat::common
