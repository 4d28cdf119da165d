// The SQLite implementation of JobStore. One connection, guarded by a mutex; prepared statements
// are cached per SQL text. Schema version 1 (table meta).
#include <sqlite3.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <thread>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "server/job_store.h"
#include "server/status_util.h"

namespace remat::server {
namespace {

constexpr int kSchemaVersion = 1;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS searches(
  id TEXT PRIMARY KEY,
  owner TEXT NOT NULL,
  name TEXT NOT NULL,
  state INTEGER NOT NULL,             -- remat.v1.SearchState
  spec BLOB NOT NULL,                 -- remat.v1.SearchSpec, resolved
  replay_table BLOB NOT NULL,         -- remat.v1.ReplayTable
  frontier TEXT NOT NULL DEFAULT '',  -- canonical policies, one per line, memory ascending
  recommendation TEXT,                -- NULL when nothing fits / not finished
  apply BLOB NOT NULL DEFAULT x'',    -- remat.v1.Apply
  message TEXT NOT NULL DEFAULT '',
  trials_planned INTEGER NOT NULL DEFAULT 0,
  created_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS searches_by_state ON searches(state);
CREATE INDEX IF NOT EXISTS searches_by_owner ON searches(owner, created_ms);
CREATE TABLE IF NOT EXISTS trials(
  id TEXT PRIMARY KEY,
  search_id TEXT NOT NULL REFERENCES searches(id),
  seq INTEGER NOT NULL,
  policy TEXT NOT NULL,
  reason TEXT NOT NULL DEFAULT '',
  status INTEGER NOT NULL,            -- remat.v1.TrialStatus: 7 pending, 8 running, else final
  attempts INTEGER NOT NULL DEFAULT 0,
  worker_id TEXT NOT NULL DEFAULT '',
  result BLOB,                        -- remat.v1.TrialResult; NULL until final
  step_time_s REAL,
  tokens_per_s REAL,
  peak_allocated_bytes INTEGER,
  peak_reserved_bytes INTEGER,
  reused INTEGER,
  message TEXT,
  UNIQUE(search_id, seq));
CREATE TABLE IF NOT EXISTS trial_ranks(
  trial_id TEXT NOT NULL REFERENCES trials(id),
  rank INTEGER NOT NULL,
  peak_allocated_bytes INTEGER NOT NULL,
  peak_reserved_bytes INTEGER NOT NULL,
  static_bytes INTEGER NOT NULL,
  alloc_retries INTEGER NOT NULL,
  failing_request_bytes INTEGER NOT NULL,
  step_time_s REAL NOT NULL,
  PRIMARY KEY(trial_id, rank));
CREATE TABLE IF NOT EXISTS workers(
  id TEXT PRIMARY KEY,
  hostname TEXT NOT NULL,
  registration BLOB NOT NULL,         -- remat.v1.RegisterRequest
  registered_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS results_cache(
  key BLOB PRIMARY KEY,               -- see server/cache_key.h
  result BLOB NOT NULL,               -- remat.v1.TrialResult
  trial_id TEXT NOT NULL,
  worker_id TEXT NOT NULL);
)sql";

// A prepared statement, reset and cleared when the holder goes out of scope.
class Stmt {
 public:
  explicit Stmt(sqlite3_stmt* stmt) : stmt_(stmt) {}
  ~Stmt() {
    if (stmt_ == nullptr) return;
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  Stmt(Stmt&& other) noexcept : stmt_(other.stmt_) { other.stmt_ = nullptr; }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  Stmt& operator=(Stmt&&) = delete;

  void Bind(int i, const std::string& s) {
    sqlite3_bind_text(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void BindBlob(int i, const std::string& s) {
    sqlite3_bind_blob(stmt_, i, s.data(), static_cast<int>(s.size()), SQLITE_TRANSIENT);
  }
  void Bind(int i, int64_t v) { sqlite3_bind_int64(stmt_, i, v); }
  void Bind(int i, double v) { sqlite3_bind_double(stmt_, i, v); }
  void BindNull(int i) { sqlite3_bind_null(stmt_, i); }

  int Step() { return sqlite3_step(stmt_); }
  std::string Text(int col) const {
    const auto* p = sqlite3_column_text(stmt_, col);
    return p ? std::string(reinterpret_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(stmt_, col)))
             : std::string();
  }
  std::string Blob(int col) const {
    const void* p = sqlite3_column_blob(stmt_, col);
    return p ? std::string(static_cast<const char*>(p),
                           static_cast<size_t>(sqlite3_column_bytes(stmt_, col)))
             : std::string();
  }
  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }

 private:
  sqlite3_stmt* stmt_;
};

std::string Serialize(const google::protobuf::MessageLite& msg) {
  std::string out;
  msg.SerializeToString(&out);
  return out;
}

// Copies the WAL into the database file from its own connection and thread, so the fsyncs of
// a checkpoint never run inside a transaction of the scheduler (SQLite's automatic checkpoint
// would run them in whichever commit crosses the threshold, holding the scheduler's lock).
class Checkpointer {
 public:
  explicit Checkpointer(sqlite3* db) : db_(db), thread_([this] { Loop(); }) {}
  ~Checkpointer() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
    sqlite3_close(db_);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::milliseconds(500), [this] { return stop_; })) {
      lock.unlock();
      sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
      lock.lock();
    }
  }

  sqlite3* db_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

class SqliteStore : public JobStore {
 public:
  explicit SqliteStore(sqlite3* db) : db_(db) {}
  ~SqliteStore() override {
    checkpointer_.reset();
    for (auto& [sql, stmt] : stmts_) sqlite3_finalize(stmt);
    sqlite3_close(db_);
  }

  // With a file, checkpoints move to a background connection.
  void StartCheckpointer(const std::string& path) {
    sqlite3* db = nullptr;
    if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_FULLMUTEX,
                        nullptr) != SQLITE_OK) {
      sqlite3_close(db);
      return;  // automatic checkpoints stay on
    }
    sqlite3_busy_timeout(db, 5000);
    std::lock_guard<std::mutex> lock(mu_);
    if (Exec("PRAGMA wal_autocheckpoint=0").ok()) {
      checkpointer_ = std::make_unique<Checkpointer>(db);
    } else {
      sqlite3_close(db);
    }
  }

  absl::Status Init() {
    std::lock_guard<std::mutex> lock(mu_);
    sqlite3_busy_timeout(db_, 5000);
    REMAT_RETURN_IF_ERROR(Exec("PRAGMA journal_mode=WAL"));
    REMAT_RETURN_IF_ERROR(Exec("PRAGMA synchronous=NORMAL"));
    REMAT_RETURN_IF_ERROR(Exec("PRAGMA foreign_keys=ON"));
    REMAT_RETURN_IF_ERROR(Exec(kSchema));
    {
      REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare("SELECT value FROM meta WHERE key='schema_version'"));
      if (s.Step() == SQLITE_ROW) {
        const std::string v = s.Text(0);
        if (v != std::to_string(kSchemaVersion)) {
          return absl::FailedPreconditionError(absl::StrCat(
              "database schema version ", v, " is not the supported version ", kSchemaVersion));
        }
        // A store that reads but cannot be written (a read-only file, folder or mount) would
        // refuse every change later, one UNAVAILABLE at a time: refused here, at start.
        absl::Status writable = Exec("UPDATE meta SET value = value WHERE key = 'schema_version'");
        if (!writable.ok()) {
          return absl::FailedPreconditionError(
              absl::StrCat("cannot be written: ", writable.message()));
        }
        return absl::OkStatus();
      }
    }
    return Exec(absl::StrCat("INSERT INTO meta(key, value) VALUES('schema_version', '",
                             kSchemaVersion, "')"));
  }

  absl::Status CreateSearch(const SearchRecord& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
        "INSERT INTO searches(id, owner, name, state, spec, replay_table, frontier, "
        "recommendation, apply, message, trials_planned, created_ms, updated_ms) "
        "VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?)"));
    s.Bind(1, r.id);
    s.Bind(2, r.owner);
    s.Bind(3, r.spec.name());
    s.Bind(4, static_cast<int64_t>(r.state));
    s.BindBlob(5, Serialize(r.spec));
    s.BindBlob(6, Serialize(r.replay_table));
    s.Bind(7, absl::StrJoin(r.frontier, "\n"));
    if (r.recommendation) s.Bind(8, *r.recommendation); else s.BindNull(8);
    s.BindBlob(9, Serialize(r.apply));
    s.Bind(10, r.message);
    s.Bind(11, static_cast<int64_t>(r.trials_planned));
    s.Bind(12, r.created_unix_ms);
    s.Bind(13, r.updated_unix_ms);
    return StepDone(s, "insert search");
  }

  absl::Status UpdateSearch(const SearchRecord& r) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
        "UPDATE searches SET state=?, frontier=?, recommendation=?, apply=?, message=?, "
        "trials_planned=?, updated_ms=? WHERE id=?"));
    s.Bind(1, static_cast<int64_t>(r.state));
    s.Bind(2, absl::StrJoin(r.frontier, "\n"));
    if (r.recommendation) s.Bind(3, *r.recommendation); else s.BindNull(3);
    s.BindBlob(4, Serialize(r.apply));
    s.Bind(5, r.message);
    s.Bind(6, static_cast<int64_t>(r.trials_planned));
    s.Bind(7, r.updated_unix_ms);
    s.Bind(8, r.id);
    REMAT_RETURN_IF_ERROR(StepDone(s, "update search"));
    if (sqlite3_changes(db_) == 0) return absl::NotFoundError("search " + r.id + " not found");
    return absl::OkStatus();
  }

  absl::StatusOr<std::optional<SearchRecord>> LoadSearch(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(std::string(kSelectSearch) + " WHERE id=?"));
    s.Bind(1, id);
    int rc = s.Step();
    if (rc == SQLITE_DONE) return std::optional<SearchRecord>();
    if (rc != SQLITE_ROW) return SqlError("load search");
    REMAT_ASSIGN_OR_RETURN(SearchRecord r, ReadSearch(s));
    return std::optional<SearchRecord>(std::move(r));
  }

  absl::StatusOr<std::vector<SearchRecord>> LoadUnfinishedSearches() override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(std::string(kSelectSearch) +
                                           " WHERE state IN (1, 2) ORDER BY created_ms, id"));
    std::vector<SearchRecord> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      REMAT_ASSIGN_OR_RETURN(SearchRecord r, ReadSearch(s));
      out.push_back(std::move(r));
    }
    if (rc != SQLITE_DONE) return SqlError("load unfinished searches");
    return out;
  }

  absl::StatusOr<std::vector<SearchSummaryRecord>> ListSearches(
      const std::optional<std::string>& owner, int limit) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::string sql = std::string(kSelectSearch);
    sql.insert(std::string("SELECT ").size(),
               "(SELECT COUNT(*) FROM trials t WHERE t.search_id = searches.id AND "
               "t.status NOT IN (7, 8)), ");
    if (owner) sql += " WHERE owner=?";
    sql += " ORDER BY created_ms DESC, id DESC LIMIT ?";
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(sql));
    int i = 1;
    if (owner) s.Bind(i++, *owner);
    s.Bind(i, static_cast<int64_t>(limit));
    std::vector<SearchSummaryRecord> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      SearchSummaryRecord row;
      row.trials_done = static_cast<int32_t>(s.Int(0));
      REMAT_ASSIGN_OR_RETURN(row.search, ReadSearch(s, 1));
      out.push_back(std::move(row));
    }
    if (rc != SQLITE_DONE) return SqlError("list searches");
    return out;
  }

  absl::StatusOr<std::map<v1::SearchState, int64_t>> CountSearchesByState() override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare("SELECT state, COUNT(*) FROM searches GROUP BY state"));
    std::map<v1::SearchState, int64_t> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) out[static_cast<v1::SearchState>(s.Int(0))] = s.Int(1);
    if (rc != SQLITE_DONE) return SqlError("count searches");
    return out;
  }

  absl::Status CancelSearch(const std::string& search_id, int64_t now_unix_ms,
                            const std::string& message) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    absl::Status st = [&]() -> absl::Status {
      {
        REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
            "UPDATE searches SET state=?, message=?, updated_ms=? WHERE id=?"));
        s.Bind(1, static_cast<int64_t>(v1::SEARCH_STATE_CANCELLED));
        s.Bind(2, message);
        s.Bind(3, now_unix_ms);
        s.Bind(4, search_id);
        REMAT_RETURN_IF_ERROR(StepDone(s, "cancel search"));
        if (sqlite3_changes(db_) == 0) return absl::NotFoundError("search " + search_id);
      }
      v1::TrialResult cancelled;
      cancelled.set_status(v1::TRIAL_STATUS_CANCELLED);
      cancelled.set_message(message);
      REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
          "UPDATE trials SET status=?, result=?, message=? "
          "WHERE search_id=? AND status IN (7, 8)"));
      s.Bind(1, static_cast<int64_t>(v1::TRIAL_STATUS_CANCELLED));
      s.BindBlob(2, Serialize(cancelled));  // policy is filled in when read
      s.Bind(3, message);
      s.Bind(4, search_id);
      return StepDone(s, "cancel trials");
    }();
    return Finish(st);
  }

  absl::Status AddTrials(const std::vector<TrialRecord>& trials) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    absl::Status st = [&]() -> absl::Status {
      for (const TrialRecord& t : trials) {
        REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
            "INSERT INTO trials(id, search_id, seq, policy, reason, status, attempts, worker_id) "
            "VALUES(?,?,?,?,?,?,?,?)"));
        s.Bind(1, t.id);
        s.Bind(2, t.search_id);
        s.Bind(3, static_cast<int64_t>(t.seq));
        s.Bind(4, t.policy);
        s.Bind(5, t.reason);
        s.Bind(6, static_cast<int64_t>(t.status));
        s.Bind(7, static_cast<int64_t>(t.attempts));
        s.Bind(8, t.worker_id);
        REMAT_RETURN_IF_ERROR(StepDone(s, "insert trial"));
      }
      return absl::OkStatus();
    }();
    return Finish(st);
  }

  absl::StatusOr<std::vector<TrialRecord>> LoadTrials(const std::string& search_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
        "SELECT id, search_id, seq, policy, reason, status, attempts, worker_id, result "
        "FROM trials WHERE search_id=? ORDER BY seq"));
    s.Bind(1, search_id);
    std::vector<TrialRecord> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      TrialRecord t;
      t.id = s.Text(0);
      t.search_id = s.Text(1);
      t.seq = static_cast<int32_t>(s.Int(2));
      t.policy = s.Text(3);
      t.reason = s.Text(4);
      t.status = static_cast<v1::TrialStatus>(s.Int(5));
      t.attempts = static_cast<int32_t>(s.Int(6));
      t.worker_id = s.Text(7);
      if (!s.IsNull(8)) {
        v1::TrialResult result;
        if (!result.ParseFromString(s.Blob(8))) {
          return absl::DataLossError("trial " + t.id + ": unreadable result");
        }
        result.mutable_policy()->set_canonical(t.policy);
        t.result = std::move(result);
      }
      out.push_back(std::move(t));
    }
    if (rc != SQLITE_DONE) return SqlError("load trials");
    return out;
  }

  absl::Status LeaseTrial(const std::string& trial_id, int32_t attempt,
                          const std::string& worker_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
        "UPDATE trials SET status=8, attempts=?, worker_id=? WHERE id=? AND status IN (7, 8)"));
    s.Bind(1, static_cast<int64_t>(attempt));
    s.Bind(2, worker_id);
    s.Bind(3, trial_id);
    REMAT_RETURN_IF_ERROR(StepDone(s, "lease trial"));
    if (sqlite3_changes(db_) == 0) {
      return absl::FailedPreconditionError("trial " + trial_id + " is not waiting to run");
    }
    return absl::OkStatus();
  }

  absl::Status RequeueTrial(const std::string& trial_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
        "UPDATE trials SET status=7 WHERE id=? AND status IN (7, 8)"));
    s.Bind(1, trial_id);
    return StepDone(s, "requeue trial");
  }

  absl::StatusOr<bool> RecordResult(const std::string& trial_id, const v1::TrialResult& result,
                                    const std::string& worker_id,
                                    const std::string& cache_key) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_RETURN_IF_ERROR(Exec("BEGIN IMMEDIATE"));
    bool recorded = false;
    absl::Status st = [&]() -> absl::Status {
      {
        REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
            "UPDATE trials SET status=?, result=?, step_time_s=?, tokens_per_s=?, "
            "peak_allocated_bytes=?, peak_reserved_bytes=?, reused=?, message=?, worker_id=? "
            "WHERE id=? AND result IS NULL"));
        uint64_t alloc = 0, reserved = 0;
        for (const auto& r : result.ranks()) {
          alloc = std::max<uint64_t>(alloc, r.peak_allocated_bytes());
          reserved = std::max<uint64_t>(reserved, r.peak_reserved_bytes());
        }
        s.Bind(1, static_cast<int64_t>(result.status()));
        s.BindBlob(2, Serialize(result));
        s.Bind(3, result.step_time_s());
        s.Bind(4, result.tokens_per_s());
        s.Bind(5, static_cast<int64_t>(alloc));
        s.Bind(6, static_cast<int64_t>(reserved));
        s.Bind(7, static_cast<int64_t>(result.reused() ? 1 : 0));
        s.Bind(8, result.message());
        s.Bind(9, worker_id);
        s.Bind(10, trial_id);
        REMAT_RETURN_IF_ERROR(StepDone(s, "record result"));
      }
      if (sqlite3_changes(db_) == 0) {
        REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare("SELECT 1 FROM trials WHERE id=?"));
        s.Bind(1, trial_id);
        if (s.Step() != SQLITE_ROW) return absl::NotFoundError("trial " + trial_id + " not found");
        return absl::OkStatus();  // already final: a duplicate
      }
      recorded = true;
      for (const auto& r : result.ranks()) {
        REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
            "INSERT OR REPLACE INTO trial_ranks(trial_id, rank, peak_allocated_bytes, "
            "peak_reserved_bytes, static_bytes, alloc_retries, failing_request_bytes, "
            "step_time_s) VALUES(?,?,?,?,?,?,?,?)"));
        s.Bind(1, trial_id);
        s.Bind(2, static_cast<int64_t>(r.rank()));
        s.Bind(3, static_cast<int64_t>(r.peak_allocated_bytes()));
        s.Bind(4, static_cast<int64_t>(r.peak_reserved_bytes()));
        s.Bind(5, static_cast<int64_t>(r.static_bytes()));
        s.Bind(6, static_cast<int64_t>(r.alloc_retries()));
        s.Bind(7, static_cast<int64_t>(r.failing_request_bytes()));
        s.Bind(8, r.step_time_s());
        REMAT_RETURN_IF_ERROR(StepDone(s, "insert rank result"));
      }
      if (!cache_key.empty()) {
        REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
            "INSERT OR IGNORE INTO results_cache(key, result, trial_id, worker_id) "
            "VALUES(?,?,?,?)"));
        s.BindBlob(1, cache_key);
        s.BindBlob(2, Serialize(result));
        s.Bind(3, trial_id);
        s.Bind(4, worker_id);
        REMAT_RETURN_IF_ERROR(StepDone(s, "insert cache entry"));
      }
      return absl::OkStatus();
    }();
    REMAT_RETURN_IF_ERROR(Finish(st));
    return recorded;
  }

  absl::Status UpsertWorker(const WorkerRecord& w) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
        "INSERT INTO workers(id, hostname, registration, registered_ms) VALUES(?,?,?,?) "
        "ON CONFLICT(id) DO UPDATE SET hostname=excluded.hostname, "
        "registration=excluded.registration, registered_ms=excluded.registered_ms"));
    s.Bind(1, w.id);
    s.Bind(2, w.hostname);
    s.BindBlob(3, Serialize(w.registration));
    s.Bind(4, w.registered_unix_ms);
    return StepDone(s, "upsert worker");
  }

  absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers() override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare(
        "SELECT id, hostname, registration, registered_ms FROM workers ORDER BY id"));
    std::vector<WorkerRecord> out;
    int rc;
    while ((rc = s.Step()) == SQLITE_ROW) {
      WorkerRecord w;
      w.id = s.Text(0);
      w.hostname = s.Text(1);
      if (!w.registration.ParseFromString(s.Blob(2))) {
        return absl::DataLossError("worker " + w.id + ": unreadable registration");
      }
      w.registered_unix_ms = s.Int(3);
      out.push_back(std::move(w));
    }
    if (rc != SQLITE_DONE) return SqlError("load workers");
    return out;
  }

  absl::StatusOr<std::optional<v1::TrialResult>> LookupCache(const std::string& key) override {
    std::lock_guard<std::mutex> lock(mu_);
    REMAT_ASSIGN_OR_RETURN(Stmt s, Prepare("SELECT result FROM results_cache WHERE key=?"));
    s.BindBlob(1, key);
    int rc = s.Step();
    if (rc == SQLITE_DONE) return std::optional<v1::TrialResult>();
    if (rc != SQLITE_ROW) return SqlError("look up cache");
    v1::TrialResult result;
    if (!result.ParseFromString(s.Blob(0))) return absl::DataLossError("unreadable cache entry");
    return std::optional<v1::TrialResult>(std::move(result));
  }

 private:
  static constexpr const char* kSelectSearch =
      "SELECT id, owner, state, spec, replay_table, frontier, recommendation, apply, message, "
      "trials_planned, created_ms, updated_ms FROM searches";

  absl::StatusOr<SearchRecord> ReadSearch(const Stmt& s, int base = 0) {
    SearchRecord r;
    r.id = s.Text(base + 0);
    r.owner = s.Text(base + 1);
    r.state = static_cast<v1::SearchState>(s.Int(base + 2));
    if (!r.spec.ParseFromString(s.Blob(base + 3)) ||
        !r.replay_table.ParseFromString(s.Blob(base + 4)) ||
        !r.apply.ParseFromString(s.Blob(base + 7))) {
      return absl::DataLossError("search " + r.id + ": unreadable record");
    }
    const std::string frontier = s.Text(base + 5);
    if (!frontier.empty()) r.frontier = absl::StrSplit(frontier, '\n');
    if (!s.IsNull(base + 6)) r.recommendation = s.Text(base + 6);
    r.message = s.Text(base + 8);
    r.trials_planned = static_cast<int32_t>(s.Int(base + 9));
    r.created_unix_ms = s.Int(base + 10);
    r.updated_unix_ms = s.Int(base + 11);
    return r;
  }

  absl::Status SqlError(const std::string& what) {
    return absl::UnavailableError(absl::StrCat("store: ", what, ": ", sqlite3_errmsg(db_)));
  }

  absl::Status Exec(const std::string& sql) {
    char* err = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string msg = err ? err : sqlite3_errmsg(db_);
      sqlite3_free(err);
      return absl::UnavailableError("store: " + msg);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Stmt> Prepare(const std::string& sql) {
    auto it = stmts_.find(sql);
    if (it == stmts_.end()) {
      sqlite3_stmt* stmt = nullptr;
      if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
        return absl::InternalError(absl::StrCat("store: prepare: ", sqlite3_errmsg(db_)));
      }
      it = stmts_.emplace(sql, stmt).first;
    }
    return absl::StatusOr<Stmt>(absl::in_place, it->second);
  }

  absl::Status StepDone(Stmt& s, const char* what) {
    if (s.Step() != SQLITE_DONE) return SqlError(what);
    return absl::OkStatus();
  }

  // Commits when `st` is ok, rolls back otherwise; returns the first error.
  absl::Status Finish(const absl::Status& st) {
    if (!st.ok()) {
      Exec("ROLLBACK").IgnoreError();
      return st;
    }
    absl::Status commit = Exec("COMMIT");
    if (!commit.ok()) Exec("ROLLBACK").IgnoreError();
    return commit;
  }

  std::mutex mu_;
  sqlite3* db_;
  std::map<std::string, sqlite3_stmt*> stmts_;
  std::unique_ptr<Checkpointer> checkpointer_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<JobStore>> OpenSqliteStore(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("db: a database path is required");
  sqlite3* db = nullptr;
  int rc = sqlite3_open_v2(path.c_str(), &db,
                           SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX,
                           nullptr);
  if (rc != SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return absl::UnavailableError(absl::StrCat("db: cannot open ", path, ": ", msg));
  }
  auto store = std::make_unique<SqliteStore>(db);
  absl::Status st = store->Init();
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat("db: ", path, ": ", st.message()));
  }
  if (path != ":memory:" && path.rfind("file:", 0) != 0) store->StartCheckpointer(path);
  return std::unique_ptr<JobStore>(std::move(store));
}

}  // namespace remat::server
