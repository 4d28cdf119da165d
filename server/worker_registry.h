// WorkerRegistry: the workers the coordinator knows, their slots (one per GPU, or one), the
// trials leased to each, and whether each is connected (heard from within a lease timeout).
// It keeps the number of free slots over connected workers up to date on every change, since
// the scheduler reads it on every event (summing over a thousand workers each time is not free).
//
// Thread-safety: none of its own; the Scheduler calls it under its mutex.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "server/job_store.h"

namespace remat::server {

struct WorkerEntry {
  WorkerRecord rec;
  int slots = 1;
  int busy = 0;  // slots held by leased trials
  int64_t last_seen_ms = 0;
  bool connected = false;
  std::set<std::string> leases;     // trial ids
  std::set<std::string> backends;   // empty: any
  std::set<std::string> templates;  // command templates its operator configured

  // Whether it runs trials of `backend` (and, for the command backend, has `command_template`).
  bool Supports(const std::string& backend, bool needs_template,
                const std::string& command_template) const;
  // Slots it can give a request offering `asked` free slots.
  int FreeFor(int32_t asked) const;
};

class WorkerRegistry {
 public:
  WorkerEntry* Find(const std::string& id);
  const std::unordered_map<std::string, WorkerEntry>& all() const { return workers_; }

  // A worker read from the store at start: known, not connected (no free slots) until heard.
  void Load(WorkerRecord rec);
  // A worker (re-)registering: takes its slots, backends and templates from the registration,
  // keeps its leases, and counts it connected as of `now_ms`. *known: it was known before.
  WorkerEntry& Register(WorkerRecord rec, int64_t now_ms, bool* known);

  // A sign of life at `now_ms`. Returns true when it was not connected before.
  bool Touch(WorkerEntry& w, int64_t now_ms);
  void SetConnected(WorkerEntry& w, bool connected);

  // Trial `trial_id` of world size `slots` is leased to / no longer held by `w`.
  void AddLease(WorkerEntry& w, const std::string& trial_id, int slots);
  // No-op when `worker_id` is unknown or does not hold the lease.
  void DropLease(const std::string& worker_id, const std::string& trial_id, int slots);

  // Connected workers not heard from for more than `timeout_ms`.
  std::vector<WorkerEntry*> Silent(int64_t now_ms, int64_t timeout_ms);

  // Free slots over connected workers.
  int64_t FreeSlots() const { return free_slots_ < 0 ? 0 : free_slots_; }

  struct Gauges {
    int64_t connected = 0;
    int64_t free = 0;
    int64_t busy = 0;
  };
  Gauges Count() const;

 private:
  void AddBusy(WorkerEntry& w, int delta);
  void SetSlots(WorkerEntry& w, int slots);

  std::unordered_map<std::string, WorkerEntry> workers_;
  int64_t free_slots_ = 0;
};

}  // namespace remat::server
