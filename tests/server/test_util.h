// Test helpers for the coordinator: a fake clock, a scripted strategy, a fault-injecting store,
// small specs and replay tables.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "proto/convert.h"
#include "remat/v1/remat.pb.h"
#include "search/planner.h"
#include "search/policy.h"
#include "search/spec.h"
#include "server/job_store.h"

namespace remat::server::testing {

// Milliseconds that move only when a test says so.
class FakeClock {
 public:
  int64_t Now() const { return now_.load(); }
  void Advance(double seconds) { now_ += static_cast<int64_t>(seconds * 1000); }
  std::function<int64_t()> Fn() {
    return [this] { return Now(); };
  }

 private:
  std::atomic<int64_t> now_{1'700'000'000'000};
};

// Proposes a fixed list of policies in order; done when every one has been observed.
class ListStrategy : public search::Strategy {
 public:
  explicit ListStrategy(std::vector<std::string> policies) : policies_(std::move(policies)) {}

  std::vector<search::Candidate> Propose(int max_count) override {
    std::vector<search::Candidate> out;
    while (max_count-- > 0 && next_ < policies_.size()) {
      search::Candidate c;
      c.policy = *search::ParsePolicy(policies_[next_++]);
      c.reason = "scripted";
      out.push_back(c);
    }
    return out;
  }
  void Observe(const search::TrialResult& result) override {
    observed_.insert(result.policy.ToString());
  }
  bool Done() const override { return observed_.size() == policies_.size(); }
  int PlannedTotal() const override { return static_cast<int>(policies_.size()); }
  void Restore(const std::vector<search::Candidate>& proposed,
               const std::vector<search::TrialResult>& results) override {
    next_ = proposed.size();
    for (const auto& r : results) observed_.insert(r.policy.ToString());
  }

 private:
  std::vector<std::string> policies_;
  size_t next_ = 0;
  std::set<std::string> observed_;
};

// A JobStore that forwards to a real one but fails the calls a test arms.
class FaultyStore : public JobStore {
 public:
  explicit FaultyStore(std::unique_ptr<JobStore> inner) : inner_(std::move(inner)) {}

  // The next `count` calls of `method` fail with Unavailable.
  void FailNext(const std::string& method, int count = 1) { failures_[method] += count; }
  // Every call after the first `n` (of any method) fails: the store as a process killed after
  // its n-th call would have left it (a failed call writes nothing).
  void FailAllAfter(int n) { fail_after_ = n; }
  int total_calls() const { return total_; }
  int calls(const std::string& method) const {
    auto it = calls_.find(method);
    return it == calls_.end() ? 0 : it->second;
  }

  absl::Status CreateSearch(const SearchRecord& s) override {
    if (auto st = Hit("CreateSearch"); !st.ok()) return st;
    return inner_->CreateSearch(s);
  }
  absl::Status UpdateSearch(const SearchRecord& s) override {
    if (auto st = Hit("UpdateSearch"); !st.ok()) return st;
    return inner_->UpdateSearch(s);
  }
  absl::StatusOr<std::optional<SearchRecord>> LoadSearch(const std::string& id) override {
    if (auto st = Hit("LoadSearch"); !st.ok()) return st;
    return inner_->LoadSearch(id);
  }
  absl::StatusOr<std::vector<SearchRecord>> LoadUnfinishedSearches() override {
    if (auto st = Hit("LoadUnfinishedSearches"); !st.ok()) return st;
    return inner_->LoadUnfinishedSearches();
  }
  absl::StatusOr<std::vector<SearchSummaryRecord>> ListSearches(
      const std::optional<std::string>& owner, int limit) override {
    if (auto st = Hit("ListSearches"); !st.ok()) return st;
    return inner_->ListSearches(owner, limit);
  }
  absl::StatusOr<std::map<v1::SearchState, int64_t>> CountSearchesByState() override {
    if (auto st = Hit("CountSearchesByState"); !st.ok()) return st;
    return inner_->CountSearchesByState();
  }
  absl::Status CancelSearch(const std::string& id, int64_t now, const std::string& m) override {
    if (auto st = Hit("CancelSearch"); !st.ok()) return st;
    return inner_->CancelSearch(id, now, m);
  }
  absl::Status AddTrials(const std::vector<TrialRecord>& trials) override {
    if (auto st = Hit("AddTrials"); !st.ok()) return st;
    return inner_->AddTrials(trials);
  }
  absl::StatusOr<std::vector<TrialRecord>> LoadTrials(const std::string& id) override {
    if (auto st = Hit("LoadTrials"); !st.ok()) return st;
    return inner_->LoadTrials(id);
  }
  absl::Status LeaseTrial(const std::string& id, int32_t attempt,
                          const std::string& worker) override {
    if (auto st = Hit("LeaseTrial"); !st.ok()) return st;
    return inner_->LeaseTrial(id, attempt, worker);
  }
  absl::Status RequeueTrial(const std::string& id) override {
    if (auto st = Hit("RequeueTrial"); !st.ok()) return st;
    return inner_->RequeueTrial(id);
  }
  absl::StatusOr<bool> RecordResult(const std::string& id, const v1::TrialResult& result,
                                    const std::string& worker, const std::string& key) override {
    if (auto st = Hit("RecordResult"); !st.ok()) return st;
    return inner_->RecordResult(id, result, worker, key);
  }
  absl::Status UpsertWorker(const WorkerRecord& w) override {
    if (auto st = Hit("UpsertWorker"); !st.ok()) return st;
    return inner_->UpsertWorker(w);
  }
  absl::StatusOr<std::vector<WorkerRecord>> LoadWorkers() override {
    if (auto st = Hit("LoadWorkers"); !st.ok()) return st;
    return inner_->LoadWorkers();
  }
  absl::StatusOr<std::optional<v1::TrialResult>> LookupCache(const std::string& key) override {
    if (auto st = Hit("LookupCache"); !st.ok()) return st;
    return inner_->LookupCache(key);
  }

 private:
  absl::Status Hit(const std::string& method) {
    ++calls_[method];
    if (fail_after_ >= 0 && total_ >= fail_after_) {
      return absl::UnavailableError("injected crash before " + method);
    }
    ++total_;
    auto it = failures_.find(method);
    if (it != failures_.end() && it->second > 0) {
      --it->second;
      return absl::UnavailableError("injected fault in " + method);
    }
    return absl::OkStatus();
  }

  std::unique_ptr<JobStore> inner_;
  std::map<std::string, int> failures_;
  std::map<std::string, int> calls_;
  int total_ = 0;
  int fail_after_ = -1;
};

// A small valid dense spec (2 layers) with the replay backend.
inline search::SearchSpec SmallSpec(const std::string& name = "small") {
  search::SearchSpec s;
  s.name = name;
  s.model.num_layers = 2;
  s.model.hidden_size = 64;
  s.model.num_attention_heads = 4;
  s.model.seq_length = 128;
  s.model.vocab_size = 1000;
  s.search.backend = search::Backend::kReplay;
  s.search.memory_budget_gib = 80;
  return s;
}

// A replay entry: ok with the given reserved peak (GiB) and step time, or oom.
inline v1::ReplayEntry Entry(double reserved_gib, double step_time_s, bool oom = false,
                             double wall_s = 0) {
  v1::ReplayEntry e;
  v1::TrialResult* r = e.mutable_result();
  r->set_status(oom ? v1::TRIAL_STATUS_OOM : v1::TRIAL_STATUS_OK);
  r->set_step_time_s(oom ? 0 : step_time_s);
  r->set_tokens_per_s(oom ? 0 : 128.0 / step_time_s);
  v1::RankResult* rank = r->add_ranks();
  rank->set_rank(0);
  const auto bytes = static_cast<uint64_t>(reserved_gib * 1024 * 1024 * 1024);
  rank->set_peak_allocated_bytes(bytes - 1024);
  rank->set_peak_reserved_bytes(bytes);
  e.set_wall_s(wall_s);
  return e;
}

inline v1::SubmitSearchRequest Submit(const search::SearchSpec& spec,
                                      const std::map<std::string, v1::ReplayEntry>& table) {
  v1::SubmitSearchRequest req;
  *req.mutable_spec() = proto::ToProto(spec);
  for (const auto& [policy, entry] : table) (*req.mutable_replay_table()->mutable_trials())[policy] = entry;
  return req;
}

inline v1::RegisterRequest Worker(int slots, const std::string& gpu = "NVIDIA H200",
                                  uint64_t memory = 150'000'000'000ULL) {
  v1::RegisterRequest r;
  r.set_hostname("node");
  for (int i = 0; i < slots; ++i) {
    v1::Gpu* g = r.add_gpus();
    g->set_index(i);
    g->set_name(gpu);
    g->set_memory_bytes(memory);
  }
  (*r.mutable_versions())["remat"] = "0.1.0";
  (*r.mutable_versions())["torch"] = "1.13.1";
  r.add_backends("replay");
  r.add_backends("builtin");
  return r;
}

}  // namespace remat::server::testing
