// The layout proxy's check against the real trial, one home for every engine test that makes
// it: each rank of a layout run alone in this process with the stand-in collectives
// (RunStandInRank, one after the other, as a layout proxy runs its roles) against the same rank
// of the real multi-rank trial (one remat-trial process per rank over TCP).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/trial_runner.h"
#include "search/layout_proxy.h"
#include "search/policy.h"
#include "search/spec.h"
#include "specfile/spec_file.h"
#include "tests/engine/test_models.h"
#include "tests/engine/test_process.h"

namespace remat::engine::testing {

struct ProxyCheck {
  std::string name;                 // names the case in messages
  double tolerance = 0.02;          // bound on |stand-in peak - real peak| / real peak, per rank
  std::vector<std::string> groups;  // groups every stand-in rank must record traffic on
};

// For every rank r of `spec` under `policy`: the rank run alone with the stand-in collectives
// must finish ok; its allocated peak must be within check.tolerance of real[r]'s (the real
// trial's JSON result for rank r, status ok) and its static bytes equal to real[r]'s; it must
// report a positive schedule and optimizer time; every collective it records must span more
// than one rank, r among them; and it must record bytes on each of check.groups. Prints one line
// per rank (stand-in peak, real peak, their ratio). Failures are gtest failures (a failed
// ASSERT ends the check).
inline void ExpectStandInsMatchReal(const search::SearchSpec& spec, const std::string& policy,
                                    const std::vector<nlohmann::json>& real,
                                    const ProxyCheck& check) {
  const search::Policy parsed = ParsedPolicy(policy);
  const int world = spec.parallel.WorldSize();
  ASSERT_EQ(static_cast<int>(real.size()), world) << check.name;
  for (int r = 0; r < world; ++r) {
    const std::string where = check.name + " " + policy + " rank " + std::to_string(r);
    ASSERT_EQ(real[r]["status"], "ok") << where << ": " << real[r].dump();
    TrialOptions o;
    o.spec = spec;
    o.policy = parsed;
    o.rank = r;
    o.world_size = world;
    const search::RoleMeasurement m = RunStandInRank(o);
    ASSERT_EQ(m.result.status, search::TrialStatus::kOk) << where << ": " << m.result.message;
    ASSERT_EQ(m.result.ranks.size(), 1u) << where;
    const double proxy = static_cast<double>(m.result.ranks[0].peak_allocated_bytes);
    const double measured = real[r]["ranks"][0]["peak_allocated_bytes"].get<double>();
    std::printf("%s: stand-in %.0f, real %.0f (%.4f)\n", where.c_str(), proxy, measured,
                proxy / measured);
    EXPECT_LT(RelDiff(proxy, measured), check.tolerance)
        << where << ": stand-in " << proxy << ", real " << measured;
    EXPECT_EQ(m.result.ranks[0].static_bytes, real[r]["ranks"][0]["static_bytes"].get<uint64_t>())
        << where;
    EXPECT_GT(m.schedule_s, 0) << where;
    EXPECT_GT(m.optimizer_s, 0) << where;
    for (const search::CommRecord& c : m.comm) {
      EXPECT_GT(c.ranks.size(), 1u) << where << ": a record on " << c.group;
      EXPECT_NE(std::find(c.ranks.begin(), c.ranks.end(), r), c.ranks.end())
          << where << ": a record on " << c.group << " without this rank";
    }
    for (const std::string& g : check.groups) {
      double bytes = 0;
      for (const search::CommRecord& c : m.comm) {
        if (c.group == g) bytes += c.bytes;
      }
      EXPECT_GT(bytes, 0) << where << ": nothing recorded on " << g;
    }
  }
}

// The same check where the real trial is still to run: writes `yaml` (a whole spec) to a fresh
// folder, runs every rank of it under `policy` as a remat-trial process (`trial`: the binary's
// path), then checks each rank's stand-in against it (ExpectStandInsMatchReal).
inline void ExpectStandInsMatchRealTrial(const std::string& trial, const std::string& yaml,
                                         const std::string& policy, const ProxyCheck& check) {
  auto spec = spec::ParseSpecYaml(yaml);
  ASSERT_TRUE(spec.ok()) << check.name << ": " << spec.status().message();
  const std::filesystem::path file =
      WriteSpec(TempDir("remat-proxy-check"), check.name + ".yaml", yaml);
  const std::vector<nlohmann::json> real =
      RunRanks(trial, file, policy, spec->parallel.WorldSize());
  ExpectStandInsMatchReal(*spec, policy, real, check);
}

}  // namespace remat::engine::testing
