// The coordinator's service logic on any message a user or a worker may send: SubmitSearch,
// ReportTrial, Register and Heartbeat, each parsed from the input and handed to a real Scheduler
// over a real (in-memory) SQLite store that already runs one search with one trial leased. No
// input may crash it, leave it unable to answer, or be quoted back without bound: after every
// call the running search still reads back, and every error's message stays within what a gRPC
// reply's trailers carry.
//
// Input: the first byte picks the message (mod 4), the rest is its wire bytes. A report with no
// trial id is aimed at the leased trial (same worker, same attempt), so it reaches validation.
#include <google/protobuf/stubs/logging.h>
#include <spdlog/spdlog.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "proto/convert.h"
#include "remat/v1/remat.pb.h"
#include "server/job_store.h"
#include "server/scheduler.h"

namespace {

using remat::server::Principal;
using remat::server::Scheduler;
namespace v1 = remat::v1;

// An error's message must fit a reply's trailers (gRPC's default metadata limit is 8 KiB).
void CheckStatus(const absl::Status& status) {
  if (status.message().size() > 4096) __builtin_trap();
}

v1::SubmitSearchRequest FixedSearch() {
  remat::search::SearchSpec spec;
  spec.name = "fuzz";
  spec.model.num_layers = 2;
  spec.model.hidden_size = 64;
  spec.model.num_attention_heads = 4;
  spec.model.seq_length = 128;
  spec.model.vocab_size = 1000;
  spec.search.backend = remat::search::Backend::kReplay;
  v1::SubmitSearchRequest request;
  *request.mutable_spec() = remat::proto::ToProto(spec);
  for (const char* policy : {"selective:[]", "full:uniform:1"}) {
    v1::ReplayEntry& e = (*request.mutable_replay_table()->mutable_trials())[policy];
    e.mutable_result()->set_status(v1::TRIAL_STATUS_OK);
    e.mutable_result()->set_step_time_s(0.5);
    e.mutable_result()->add_ranks()->set_rank(0);
  }
  return request;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 is a parse failure, also logged
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int kind = data[0] % 4;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);

  auto store = remat::server::OpenSqliteStore(":memory:");
  if (!store.ok()) __builtin_trap();
  remat::server::SchedulerOptions options;
  int64_t now = 1'700'000'000'000;
  options.monotonic_ms = [&now] { return now; };
  options.unix_ms = [&now] { return now; };
  Scheduler scheduler(options, store->get(), nullptr);
  if (!scheduler.Resume().ok()) __builtin_trap();
  v1::RegisterRequest worker;
  worker.set_hostname("node");
  worker.add_gpus()->set_name("cpu-slot");
  auto registered = scheduler.Register(worker, "cred");
  if (!registered.ok()) __builtin_trap();
  const std::string worker_id = registered->worker_id();
  auto submitted = scheduler.SubmitSearch(Principal::User("alice"), FixedSearch());
  if (!submitted.ok()) __builtin_trap();
  v1::LeaseTrialRequest lease;
  lease.set_worker_id(worker_id);
  lease.set_free_slots(1);
  std::optional<v1::TrialAssignment> leased;
  scheduler.LeaseTrial(
      lease,
      [&](absl::StatusOr<v1::LeaseTrialResponse> r) {
        if (r.ok() && r->trials_size() > 0) leased = r->trials(0);
      },
      "cred");
  if (!leased) __builtin_trap();

  switch (kind) {
    case 0: {
      v1::SubmitSearchRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      auto r = scheduler.SubmitSearch(Principal::User("mallory"), request);
      CheckStatus(r.status());
      break;
    }
    case 1: {
      v1::ReportTrialRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      if (request.trial_id().empty()) {
        request.set_trial_id(leased->trial_id());
        request.set_attempt(leased->attempt());
        request.set_worker_id(worker_id);
      }
      auto r = scheduler.ReportTrial(request, "cred");
      CheckStatus(r.status());
      break;
    }
    case 2: {
      v1::RegisterRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      auto r = scheduler.Register(request, "other");
      CheckStatus(r.status());
      break;
    }
    default: {
      v1::HeartbeatRequest request;
      if (!request.ParseFromString(bytes)) return 0;
      if (request.worker_id().empty()) request.set_worker_id(worker_id);
      auto r = scheduler.Heartbeat(request, "cred");
      CheckStatus(r.status());
      break;
    }
  }
  // Still answering, and the running search still reads back.
  now += 60'000;
  scheduler.Tick();
  auto search = scheduler.GetSearch(Principal::User("alice"), submitted->id());
  if (!search.ok()) __builtin_trap();
  scheduler.Shutdown();
  return 0;
}
