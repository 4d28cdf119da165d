// The SQLite job store: round trips, idempotent results, cancel, WAL mode, reopening a file.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "server/job_store.h"

namespace remat::server {
namespace {

class TempDb {
 public:
  TempDb() {
    char tmpl[] = "/tmp/remat-store-test-XXXXXX";
    dir_ = mkdtemp(tmpl);
  }
  ~TempDb() { std::filesystem::remove_all(dir_); }
  std::string path() const { return dir_ + "/remat.db"; }

 private:
  std::string dir_;
};

SearchRecord NewSearch(const std::string& id, const std::string& owner = "alice") {
  SearchRecord s;
  s.id = id;
  s.owner = owner;
  s.state = v1::SEARCH_STATE_QUEUED;
  s.spec.set_name("spec-" + id);
  s.spec.mutable_model()->set_num_layers(2);
  (*s.replay_table.mutable_trials())["selective:[]"].set_wall_s(1.5);
  s.created_unix_ms = s.updated_unix_ms = 1000;
  return s;
}

TrialRecord NewTrial(const std::string& id, const std::string& search, int seq,
                     const std::string& policy) {
  TrialRecord t;
  t.id = id;
  t.search_id = search;
  t.seq = seq;
  t.policy = policy;
  t.reason = "because";
  return t;
}

v1::TrialResult Ok(double step) {
  v1::TrialResult r;
  r.set_status(v1::TRIAL_STATUS_OK);
  r.set_step_time_s(step);
  auto* rank = r.add_ranks();
  rank->set_rank(0);
  rank->set_peak_reserved_bytes(42);
  return r;
}

TEST(SqliteStoreTest, SearchAndTrialsRoundTrip) {
  auto store = OpenSqliteStore(":memory:");
  ASSERT_TRUE(store.ok()) << store.status();
  JobStore& db = **store;
  ASSERT_TRUE(db.CreateSearch(NewSearch("s-1")).ok());
  ASSERT_TRUE(db.AddTrials({NewTrial("t-1", "s-1", 0, "selective:[]"),
                            NewTrial("t-2", "s-1", 1, "full:uniform:1")})
                  .ok());
  auto loaded = db.LoadSearch("s-1");
  ASSERT_TRUE(loaded.ok());
  ASSERT_TRUE(loaded->has_value());
  EXPECT_EQ((*loaded)->owner, "alice");
  EXPECT_EQ((*loaded)->spec.name(), "spec-s-1");
  EXPECT_DOUBLE_EQ((*loaded)->replay_table.trials().at("selective:[]").wall_s(), 1.5);
  EXPECT_FALSE((*loaded)->recommendation.has_value());

  auto trials = db.LoadTrials("s-1");
  ASSERT_TRUE(trials.ok());
  ASSERT_EQ(trials->size(), 2u);
  EXPECT_EQ((*trials)[1].policy, "full:uniform:1");
  EXPECT_EQ((*trials)[0].status, v1::TRIAL_STATUS_PENDING);

  SearchRecord update = **loaded;
  update.state = v1::SEARCH_STATE_SUCCEEDED;
  update.frontier = {"selective:[]", "full:uniform:1"};
  update.recommendation = "selective:[]";
  update.apply.set_megatron_lm("--x");
  ASSERT_TRUE(db.UpdateSearch(update).ok());
  auto again = db.LoadSearch("s-1");
  EXPECT_EQ((*again)->frontier, update.frontier);
  EXPECT_EQ((*again)->recommendation, "selective:[]");
  EXPECT_EQ((*again)->apply.megatron_lm(), "--x");

  EXPECT_FALSE(db.LoadSearch("s-none")->has_value());
  EXPECT_EQ(db.UpdateSearch(NewSearch("s-none")).code(), absl::StatusCode::kNotFound);
}

TEST(SqliteStoreTest, RecordResultIsIdempotent) {
  auto store = OpenSqliteStore(":memory:");
  JobStore& db = **store;
  ASSERT_TRUE(db.CreateSearch(NewSearch("s-1")).ok());
  ASSERT_TRUE(db.AddTrials({NewTrial("t-1", "s-1", 0, "selective:[]")}).ok());
  ASSERT_TRUE(db.LeaseTrial("t-1", 1, "w-1").ok());

  auto first = db.RecordResult("t-1", Ok(0.5), "w-1", "key-1");
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(*first);
  auto second = db.RecordResult("t-1", Ok(0.9), "w-2", "key-1");
  ASSERT_TRUE(second.ok());
  EXPECT_FALSE(*second);  // a duplicate: not recorded again

  auto trials = db.LoadTrials("s-1");
  ASSERT_EQ(trials->size(), 1u);
  EXPECT_EQ((*trials)[0].status, v1::TRIAL_STATUS_OK);
  EXPECT_DOUBLE_EQ((*trials)[0].result->step_time_s(), 0.5);
  EXPECT_EQ((*trials)[0].result->policy().canonical(), "selective:[]");
  EXPECT_EQ((*trials)[0].worker_id, "w-1");
  EXPECT_EQ((*trials)[0].attempts, 1);

  auto cached = db.LookupCache("key-1");
  ASSERT_TRUE(cached.ok());
  ASSERT_TRUE(cached->has_value());
  EXPECT_DOUBLE_EQ((*cached)->step_time_s(), 0.5);
  EXPECT_FALSE(db.LookupCache("key-2")->has_value());

  EXPECT_EQ(db.RecordResult("t-none", Ok(1), "w", "").status().code(),
            absl::StatusCode::kNotFound);
  // A finished trial cannot be leased again.
  EXPECT_EQ(db.LeaseTrial("t-1", 2, "w-2").code(), absl::StatusCode::kFailedPrecondition);
}

TEST(SqliteStoreTest, CancelMarksOpenTrialsOnly) {
  auto store = OpenSqliteStore(":memory:");
  JobStore& db = **store;
  ASSERT_TRUE(db.CreateSearch(NewSearch("s-1")).ok());
  ASSERT_TRUE(db.AddTrials({NewTrial("t-1", "s-1", 0, "selective:[]"),
                            NewTrial("t-2", "s-1", 1, "full:uniform:1"),
                            NewTrial("t-3", "s-1", 2, "full:block:1")})
                  .ok());
  ASSERT_TRUE(db.LeaseTrial("t-2", 1, "w-1").ok());
  ASSERT_TRUE(*db.RecordResult("t-1", Ok(0.5), "w-1", ""));
  ASSERT_TRUE(db.CancelSearch("s-1", 2000, "cancelled by alice").ok());
  auto trials = db.LoadTrials("s-1");
  EXPECT_EQ((*trials)[0].status, v1::TRIAL_STATUS_OK);
  EXPECT_EQ((*trials)[1].status, v1::TRIAL_STATUS_CANCELLED);
  EXPECT_EQ((*trials)[2].status, v1::TRIAL_STATUS_CANCELLED);
  EXPECT_EQ((*trials)[2].result->message(), "cancelled by alice");
  EXPECT_EQ((*db.LoadSearch("s-1"))->state, v1::SEARCH_STATE_CANCELLED);
  EXPECT_EQ(db.CancelSearch("s-none", 1, "x").code(), absl::StatusCode::kNotFound);
}

TEST(SqliteStoreTest, ListAndCountByOwnerAndState) {
  auto store = OpenSqliteStore(":memory:");
  JobStore& db = **store;
  SearchRecord a = NewSearch("s-a", "alice");
  SearchRecord b = NewSearch("s-b", "bob");
  b.created_unix_ms = 2000;
  ASSERT_TRUE(db.CreateSearch(a).ok());
  ASSERT_TRUE(db.CreateSearch(b).ok());
  ASSERT_TRUE(db.AddTrials({NewTrial("t-1", "s-b", 0, "selective:[]"),
                            NewTrial("t-2", "s-b", 1, "full:uniform:1")})
                  .ok());
  ASSERT_TRUE(*db.RecordResult("t-1", Ok(0.5), "w", ""));
  auto all = db.ListSearches(std::nullopt, 10);
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].search.id, "s-b");  // newest first
  EXPECT_EQ((*all)[0].trials_done, 1);
  auto alice = db.ListSearches(std::string("alice"), 10);
  ASSERT_EQ(alice->size(), 1u);
  EXPECT_EQ((*alice)[0].search.id, "s-a");
  EXPECT_EQ(db.ListSearches(std::nullopt, 1)->size(), 1u);
  auto counts = db.CountSearchesByState();
  EXPECT_EQ((*counts)[v1::SEARCH_STATE_QUEUED], 2);
  auto unfinished = db.LoadUnfinishedSearches();
  EXPECT_EQ(unfinished->size(), 2u);
}

TEST(SqliteStoreTest, FileSurvivesReopenAndUsesWal) {
  TempDb tmp;
  {
    auto store = OpenSqliteStore(tmp.path());
    ASSERT_TRUE(store.ok()) << store.status();
    ASSERT_TRUE((*store)->CreateSearch(NewSearch("s-1")).ok());
    ASSERT_TRUE((*store)->AddTrials({NewTrial("t-1", "s-1", 0, "selective:[]")}).ok());
    ASSERT_TRUE((*store)->LeaseTrial("t-1", 1, "w-1").ok());
    WorkerRecord w;
    w.id = "w-1";
    w.hostname = "node";
    w.registration.add_gpus()->set_name("NVIDIA H200");
    ASSERT_TRUE((*store)->UpsertWorker(w).ok());
  }
  // WAL mode is a property of the file.
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(tmp.path().c_str(), &raw), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
  sqlite3_close(raw);

  auto store = OpenSqliteStore(tmp.path());
  ASSERT_TRUE(store.ok());
  auto trials = (*store)->LoadTrials("s-1");
  ASSERT_EQ(trials->size(), 1u);
  EXPECT_EQ((*trials)[0].status, v1::TRIAL_STATUS_RUNNING);
  EXPECT_EQ((*trials)[0].worker_id, "w-1");
  auto workers = (*store)->LoadWorkers();
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_EQ(workers->front().registration.gpus(0).name(), "NVIDIA H200");
}

TEST(SqliteStoreTest, UnopenablePathIsAnError) {
  auto store = OpenSqliteStore("/nonexistent-dir/remat.db");
  EXPECT_FALSE(store.ok());
  EXPECT_NE(std::string(store.status().message()).find("/nonexistent-dir/remat.db"),
            std::string::npos);
}

// A store that can be read but not written is refused at open, not one change at a time later
// (a read-only URI stands for a read-only file, folder or mount, which root would not feel).
TEST(SqliteStoreTest, AReadOnlyStoreIsRefusedAtOpen) {
  TempDb tmp;
  ASSERT_TRUE(OpenSqliteStore(tmp.path()).ok());
  auto store = OpenSqliteStore("file:" + tmp.path() + "?mode=ro");
  ASSERT_FALSE(store.ok());
  EXPECT_EQ(store.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(store.status().message()).find("cannot be written"), std::string::npos)
      << store.status().message();
}

}  // namespace
}  // namespace remat::server
