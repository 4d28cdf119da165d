// WorkerRegistry on its own: the free-slot count it keeps against a count from scratch.
#include "server/worker_registry.h"

#include <gtest/gtest.h>

#include "tests/server/test_util.h"

namespace remat::server {
namespace {

WorkerRecord Rec(const std::string& id, int gpus) {
  WorkerRecord rec;
  rec.id = id;
  rec.registration = testing::Worker(gpus);
  rec.registration.set_worker_id(id);
  return rec;
}

// The free slots as a sum over connected workers: what FreeSlots() must always equal.
int64_t Recount(const WorkerRegistry& r) { return r.Count().free; }

TEST(WorkerRegistryTest, FreeSlotsFollowLeasesConnectionsAndReRegistration) {
  WorkerRegistry r;
  bool known = true;
  WorkerEntry& a = r.Register(Rec("w-a", 4), 0, &known);
  EXPECT_FALSE(known);
  EXPECT_EQ(r.FreeSlots(), 4);
  r.AddLease(a, "t-1", 2);
  EXPECT_EQ(r.FreeSlots(), 2);
  EXPECT_EQ(a.FreeFor(8), 2);
  EXPECT_EQ(a.FreeFor(1), 1);

  r.SetConnected(a, false);
  EXPECT_EQ(r.FreeSlots(), 0);
  EXPECT_TRUE(r.Touch(a, 10));  // back: it was not connected
  EXPECT_FALSE(r.Touch(a, 20));
  EXPECT_EQ(r.FreeSlots(), 2);

  r.Register(Rec("w-a", 2), 30, &known);  // fewer GPUs now, lease kept
  EXPECT_TRUE(known);
  EXPECT_EQ(a.leases.count("t-1"), 1u);
  EXPECT_EQ(r.FreeSlots(), 0);
  EXPECT_EQ(Recount(r), r.FreeSlots());

  r.DropLease("w-a", "t-1", 2);
  r.DropLease("w-a", "t-1", 2);   // twice: no-op
  r.DropLease("w-zz", "t-1", 2);  // unknown worker: no-op
  EXPECT_EQ(r.FreeSlots(), 2);
  EXPECT_EQ(Recount(r), r.FreeSlots());
}

TEST(WorkerRegistryTest, LoadedWorkersAreKnownButOfferNothingUntilHeard) {
  WorkerRegistry r;
  r.Load(Rec("w-a", 3));
  ASSERT_NE(r.Find("w-a"), nullptr);
  EXPECT_EQ(r.Find("w-b"), nullptr);
  EXPECT_EQ(r.FreeSlots(), 0);
  EXPECT_EQ(r.Count().connected, 0);
  r.Touch(*r.Find("w-a"), 5);
  EXPECT_EQ(r.FreeSlots(), 3);
  EXPECT_EQ(r.Count().connected, 1);
}

TEST(WorkerRegistryTest, SilentWorkersAndCapabilities) {
  WorkerRegistry r;
  bool known;
  WorkerRecord rec = Rec("w-a", 1);
  rec.registration.clear_backends();
  rec.registration.add_backends("command");
  rec.registration.add_command_templates("bridge");
  WorkerEntry& a = r.Register(rec, 0, &known);
  r.Register(Rec("w-b", 1), 10'000, &known);
  auto silent = r.Silent(15'001, 15'000);
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_EQ(silent[0]->rec.id, "w-a");

  EXPECT_TRUE(a.Supports("command", true, "bridge"));
  EXPECT_FALSE(a.Supports("command", true, "other"));
  EXPECT_FALSE(a.Supports("builtin", false, ""));
  WorkerEntry any;  // no backends listed: any
  EXPECT_TRUE(any.Supports("builtin", false, ""));
}

}  // namespace
}  // namespace remat::server
