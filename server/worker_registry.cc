#include "server/worker_registry.h"

#include <algorithm>
#include <utility>

namespace remat::server {
namespace {

int SlotsOf(const v1::RegisterRequest& registration) {
  return std::max(1, registration.gpus_size());
}

void TakeCapabilities(const v1::RegisterRequest& registration, WorkerEntry* w) {
  w->backends = {registration.backends().begin(), registration.backends().end()};
  w->templates = {registration.command_templates().begin(), registration.command_templates().end()};
}

}  // namespace

bool WorkerEntry::Supports(const std::string& backend, bool needs_template,
                           const std::string& command_template) const {
  if (!backends.empty() && backends.count(backend) == 0) return false;
  return !needs_template || templates.count(command_template) != 0;
}

int WorkerEntry::FreeFor(int32_t asked) const {
  return std::max(0, std::min<int>(asked, slots - busy));
}

void WorkerRegistry::Load(WorkerRecord rec) {
  WorkerEntry w;
  w.slots = SlotsOf(rec.registration);  // not connected: no free slots yet
  TakeCapabilities(rec.registration, &w);
  w.rec = std::move(rec);
  const std::string id = w.rec.id;
  workers_.emplace(id, std::move(w));
}

WorkerEntry& WorkerRegistry::Register(WorkerRecord rec, int64_t now_ms, bool* known) {
  WorkerEntry& w = workers_[rec.id];
  *known = !w.rec.id.empty();
  w.rec = std::move(rec);
  SetSlots(w, SlotsOf(w.rec.registration));
  TakeCapabilities(w.rec.registration, &w);
  Touch(w, now_ms);
  return w;
}

WorkerEntry* WorkerRegistry::Find(const std::string& id) {
  auto it = workers_.find(id);
  return it == workers_.end() ? nullptr : &it->second;
}

bool WorkerRegistry::Touch(WorkerEntry& w, int64_t now_ms) {
  const bool was_connected = w.connected;
  w.last_seen_ms = now_ms;
  SetConnected(w, true);
  return !was_connected;
}

void WorkerRegistry::SetConnected(WorkerEntry& w, bool connected) {
  if (w.connected == connected) return;
  w.connected = connected;
  free_slots_ += (connected ? 1 : -1) * static_cast<int64_t>(w.slots - w.busy);
}

void WorkerRegistry::AddLease(WorkerEntry& w, const std::string& trial_id, int slots) {
  AddBusy(w, slots);
  w.leases.insert(trial_id);
}

void WorkerRegistry::DropLease(const std::string& worker_id, const std::string& trial_id,
                               int slots) {
  WorkerEntry* w = Find(worker_id);
  if (w != nullptr && w->leases.erase(trial_id) != 0) AddBusy(*w, -slots);
}

std::vector<WorkerEntry*> WorkerRegistry::Silent(int64_t now_ms, int64_t timeout_ms) {
  std::vector<WorkerEntry*> out;
  for (auto& [id, w] : workers_) {
    if (w.connected && now_ms - w.last_seen_ms > timeout_ms) out.push_back(&w);
  }
  return out;
}

WorkerRegistry::Gauges WorkerRegistry::Count() const {
  Gauges g;
  for (const auto& [id, w] : workers_) {
    if (!w.connected) continue;
    ++g.connected;
    g.free += std::max(0, w.slots - w.busy);
    g.busy += w.busy;
  }
  return g;
}

void WorkerRegistry::AddBusy(WorkerEntry& w, int delta) {
  w.busy += delta;
  if (w.connected) free_slots_ -= delta;
}

void WorkerRegistry::SetSlots(WorkerEntry& w, int slots) {
  if (w.connected) free_slots_ += slots - w.slots;
  w.slots = slots;
}

}  // namespace remat::server
