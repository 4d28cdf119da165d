#include "worker/slots.h"

#include <gtest/gtest.h>

#include "common/version.h"
#include "worker/versions.h"

namespace remat::worker {
namespace {

TEST(Slots, ParsesNvidiaSmi) {
  auto slots = ParseNvidiaSmiCsv("0, NVIDIA H200, 143771\n1, NVIDIA H200, 143771\n\n");
  ASSERT_TRUE(slots.ok()) << slots.status();
  ASSERT_EQ(slots->size(), 2u);
  EXPECT_EQ((*slots)[1].index, 1);
  EXPECT_EQ((*slots)[1].name, "NVIDIA H200");
  EXPECT_EQ((*slots)[1].memory_bytes, 143771ull * 1024 * 1024);
  EXPECT_TRUE((*slots)[1].gpu);
  EXPECT_FALSE(ParseNvidiaSmiCsv("garbage line").ok());
}

TEST(Slots, DefaultIsEveryGpuOrOnePlainSlot) {
  auto none = SelectSlots({}, "");
  ASSERT_TRUE(none.ok());
  ASSERT_EQ(none->size(), 1u);
  EXPECT_FALSE((*none)[0].gpu);
  EXPECT_EQ((*none)[0].name, "cpu-slot");

  auto gpus = *ParseNvidiaSmiCsv("0, A, 10\n1, B, 10\n2, C, 10\n");
  auto all = SelectSlots(gpus, "");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 3u);
}

TEST(Slots, GpusFlagPicksGpusOrNamesPlainSlots) {
  auto gpus = *ParseNvidiaSmiCsv("0, A, 10\n1, B, 10\n2, C, 10\n");
  auto picked = SelectSlots(gpus, "2,0");
  ASSERT_TRUE(picked.ok());
  ASSERT_EQ(picked->size(), 2u);
  EXPECT_EQ((*picked)[0].name, "C");
  EXPECT_EQ((*picked)[1].index, 0);

  auto missing = SelectSlots(gpus, "0,7");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(std::string(missing.status().message()).find("--gpus: GPU 7 not found"),
            std::string::npos);
  EXPECT_FALSE(SelectSlots(gpus, "0,0").ok());
  EXPECT_FALSE(SelectSlots(gpus, "a").ok());

  auto plain = SelectSlots({}, "0,1,2,3");  // not checked without GPUs
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->size(), 4u);
  EXPECT_FALSE((*plain)[3].gpu);
}

TEST(Versions, ParsesKeyValueLines) {
  auto v = ParseKeyValueLines("torch=2.4.0\n cuda = 12.4\nnoise\n\nnccl=2.21.5\n");
  EXPECT_EQ(v["torch"], "2.4.0");
  EXPECT_EQ(v["cuda"], "12.4");
  EXPECT_EQ(v["nccl"], "2.21.5");
  EXPECT_EQ(v.size(), 3u);
  auto only_remat = ProbeVersions("/nonexistent/remat-trial");
  EXPECT_EQ(only_remat.size(), 1u);
  EXPECT_EQ(only_remat["remat"], common::kVersion);
}

}  // namespace
}  // namespace remat::worker
