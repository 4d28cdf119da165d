// The one writer of a trial result as a JSON line (remat-trial --json, remat-bench-engine).
#include "engine/result_json.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace remat::engine {
namespace {

TEST(ResultJson, OneLineWithTheTopLevelPeaksAndEveryRank) {
  search::TrialResult r;
  r.policy = search::Policy::Selective({search::Label::kCoreAttn});
  r.status = search::TrialStatus::kOk;
  r.step_time_s = 0.5;
  r.tokens_per_s = 8192;
  r.message = "a \"quoted\"\nnote";
  for (int rank : {0, 1}) {
    search::RankResult& k = r.ranks.emplace_back();
    k.rank = rank;
    k.peak_allocated_bytes = 100 + rank;
    k.peak_reserved_bytes = 200 + rank;
    k.static_bytes = 50 - rank;
    k.alloc_retries = rank * 3;
    k.step_times_s = {0.4, 0.5};
  }
  const std::string line = TrialResultJson(r);
  EXPECT_EQ(line.find('\n'), std::string::npos);  // one line, the message escaped
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j["policy"], "selective:[core_attn]");
  EXPECT_EQ(j["status"], "ok");
  EXPECT_EQ(j["peak_allocated_bytes"], 101u);
  EXPECT_EQ(j["peak_reserved_bytes"], 201u);
  EXPECT_EQ(j["static_bytes"], 50u);   // the maximum over ranks
  EXPECT_EQ(j["alloc_retries"], 3u);   // the maximum over ranks
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][1]["rank"], 1);
  EXPECT_EQ(j["ranks"][1]["step_times_s"].size(), 2u);
  EXPECT_DOUBLE_EQ(j["step_time_s"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["tokens_per_s"].get<double>(), 8192);
  EXPECT_EQ(j["message"], "a \"quoted\"\nnote");
  EXPECT_EQ(j["predicted"], false);
  EXPECT_TRUE(j["proxies"].empty());
}

TEST(ResultJson, AResultWithoutRanksStillWrites) {
  search::TrialResult r;
  r.status = search::TrialStatus::kFailed;
  r.message = "did not start";
  const nlohmann::json j = nlohmann::json::parse(TrialResultJson(r));
  EXPECT_EQ(j["status"], "failed");
  EXPECT_EQ(j["peak_allocated_bytes"], 0u);
  EXPECT_TRUE(j["ranks"].empty());
}

TEST(ResultJson, DepthProxiesCarryTheirRanks) {
  search::TrialResult r;
  r.status = search::TrialStatus::kOk;
  r.predicted = true;
  search::ProxyMeasurement& m = r.proxies.emplace_back();
  m.num_layers = 2;
  m.step_time_s = 0.1;
  m.ranks.emplace_back().peak_allocated_bytes = 7;
  const nlohmann::json j = nlohmann::json::parse(TrialResultJson(r));
  EXPECT_EQ(j["predicted"], true);
  ASSERT_EQ(j["proxies"].size(), 1u);
  EXPECT_EQ(j["proxies"][0]["num_layers"], 2);
  EXPECT_EQ(j["proxies"][0]["ranks"][0]["peak_allocated_bytes"], 7u);
  EXPECT_FALSE(j["proxies"][0].contains("role"));  // depth proxies have none
}

TEST(ResultJson, LayoutProxiesNameTheirRoleAndRank) {
  search::TrialResult r;
  r.status = search::TrialStatus::kOk;
  r.predicted = true;
  search::ProxyMeasurement& m = r.proxies.emplace_back();
  m.role = "stage 1 (last)";
  m.rank = 4;
  m.num_layers = 3;
  const nlohmann::json j = nlohmann::json::parse(TrialResultJson(r));
  EXPECT_EQ(j["proxies"][0]["role"], "stage 1 (last)");
  EXPECT_EQ(j["proxies"][0]["rank"], 4);
}

}  // namespace
}  // namespace remat::engine
