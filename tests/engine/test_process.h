// Helpers for engine tests that run remat-trial as processes: a fresh temporary folder and a
// shell command with its captured stdout and exit code.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/engine/test_models.h"  // RelDiff

namespace remat::engine::testing {

// A new, empty folder under the system's temporary folder, unique per call and process.
inline std::filesystem::path TempDir(const std::string& prefix) {
  static int counter = 0;
  std::filesystem::path d = std::filesystem::temp_directory_path() /
                            (prefix + "-" + std::to_string(::getpid()) + "-" +
                             std::to_string(counter++));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

struct Output {
  int exit_code = -1;
  std::string out;
};

// Runs a shell command; stdout captured (stderr folded in with 2>&1 by the caller when wanted).
inline Output Sh(const std::string& command) {
  Output o;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return o;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) o.out.append(buf, n);
  const int status = ::pclose(p);
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return o;
}

// Writes `yaml` to dir/name and returns the path.
inline std::filesystem::path WriteSpec(const std::filesystem::path& dir, const std::string& name,
                                       const std::string& yaml) {
  std::filesystem::path p = dir / name;
  std::ofstream(p) << yaml;
  return p;
}

// Runs a one-rank trial as one `trial` process (remat-trial) and returns its JSON result.
inline nlohmann::json RunAlone(const std::string& trial, const std::filesystem::path& spec,
                               const std::string& policy) {
  const Output o = Sh(trial + " --spec " + spec.string() + " --policy '" + policy + "' --json");
  EXPECT_EQ(o.exit_code, 0) << o.out;
  return nlohmann::json::parse(o.out);
}

// Starts every rank of a trial as its own `trial` process (remat-trial), meeting in a fresh
// rendezvous folder; returns each rank's JSON result, in rank order.
inline std::vector<nlohmann::json> RunRanks(const std::string& trial,
                                            const std::filesystem::path& spec,
                                            const std::string& policy, int world,
                                            double timeout_s = 60) {
  const std::filesystem::path rendezvous = TempDir("remat-ranks");
  std::vector<std::thread> threads;
  std::vector<Output> outs(world);
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      std::ostringstream cmd;
      cmd << trial << " --spec " << spec.string() << " --policy '" << policy << "' --rank " << r
          << " --world-size " << world << " --rendezvous " << rendezvous.string()
          << " --collective-timeout " << timeout_s << " --json";
      outs[r] = Sh(cmd.str());
    });
  }
  for (auto& t : threads) t.join();
  std::vector<nlohmann::json> results;
  for (const Output& o : outs) {
    EXPECT_EQ(o.exit_code, 0) << o.out;
    results.push_back(nlohmann::json::parse(o.out));
  }
  return results;
}

}  // namespace remat::engine::testing
