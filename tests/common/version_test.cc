// The version comes from project(remat VERSION ...) alone: the generated header carries it.
#include "common/version.h"

#include <gtest/gtest.h>

#include <regex>
#include <string>

namespace remat::common {
namespace {

TEST(Version, IsTheProjectVersionFromCMake) {
  EXPECT_EQ(std::string(kVersion), REMAT_PROJECT_VERSION);
  EXPECT_TRUE(std::regex_match(kVersion, std::regex(R"(\d+\.\d+\.\d+)"))) << kVersion;
}

}  // namespace
}  // namespace remat::common
