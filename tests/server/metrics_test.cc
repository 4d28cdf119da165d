// The coordinator's metrics: cache hits are counted apart from trials that ran.
#include "server/metrics.h"

#include <gtest/gtest.h>
#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <string>

namespace remat::server {
namespace {

// The value of the series of `family` whose labels include `label`=`value` ("" = unlabelled).
double Value(Metrics& m, const std::string& family, const std::string& label = "",
             const std::string& value = "") {
  for (const auto& f : m.collectable()->Collect()) {
    if (f.name != family) continue;
    for (const auto& metric : f.metric) {
      bool match = label.empty();
      for (const auto& l : metric.label) match |= (l.name == label && l.value == value);
      if (match) return metric.counter.value;
    }
  }
  return -1;
}

TEST(MetricsTest, CacheHitsAreNotTrialsThatRan) {
  Metrics m("test");
  m.TrialFinished(v1::TRIAL_STATUS_OK, /*reused=*/false, 2.0);
  m.TrialFinished(v1::TRIAL_STATUS_OK, /*reused=*/true, 0);
  m.TrialFinished(v1::TRIAL_STATUS_OK, /*reused=*/true, 0);
  m.TrialFinished(v1::TRIAL_STATUS_FAILED, /*reused=*/false, 1.0);
  EXPECT_EQ(Value(m, "remat_trials_total", "status", "ok"), 1);
  EXPECT_EQ(Value(m, "remat_trials_total", "status", "failed"), 1);
  EXPECT_EQ(Value(m, "remat_trials_reused_total"), 2);
}

}  // namespace
}  // namespace remat::server
