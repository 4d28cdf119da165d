// The coordinator (rematd) as a library: gRPC API (RematService, WorkerService, health,
// reflection), SQLite job store, scheduler, results cache and metrics, behind one object.
//
// Lifecycle: Create (validates options, opens the store) -> Start (binds, resumes unfinished
// searches) -> Shutdown (graceful drain) -> destruction. `rematd` and the embedded coordinator of
// `remat search` both use it; no gRPC types leak through this header.
//
// Thread-safety: Create/Start/Shutdown/Wait are meant for one controlling thread; port() and
// metrics_port() may be called from any thread after Start. Shutdown may be called from another
// thread while Wait blocks (that is how rematd drains on SIGTERM). Shutdown is idempotent and the
// destructor calls it.
//
// Errors: Create returns InvalidArgument naming the option for bad options and unreadable or
// malformed token files, and the store's error (Unavailable) for a database that cannot be
// opened; Start returns Unavailable when the listen address (or the metrics address) cannot be
// bound, InvalidArgument for unreadable TLS files.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/version.h"

namespace remat::server {

struct CoordinatorOptions {
  // HOST:PORT to serve gRPC on; port 0 picks a free one (see Coordinator::port()).
  std::string listen = "127.0.0.1:0";
  // SQLite database file (WAL mode). ":memory:" keeps everything in memory (tests, embedded).
  std::string db_path;
  // HOST:PORT for the Prometheus page (/metrics); "" = no metrics endpoint. Port 0 = free port.
  std::string metrics_listen;
  // HOST:PORT for a plaintext gRPC server that serves only the standard health service, with the
  // main server's status: probes that cannot speak TLS (kubelet's) use it while `listen` serves
  // TLS. It answers nothing else, so it exposes no API. "" = none. Port 0 = free port.
  std::string health_listen;
  // "" = no auth for users. Otherwise lines "TOKEN USER [admin]" ('#' comments, blank lines
  // ignored); an admin lists, watches and cancels every user's searches (auth.h).
  std::string user_tokens_file;
  // Set: users may also authenticate with a MUNGE credential (remat --munge), decoded by the
  // munged behind this socket (the cluster's, sharing its key); see auth.h. "" = no MUNGE.
  std::string munge_socket;
  // "" = no auth for workers. Otherwise lines "TOKEN [NAME]".
  std::string worker_tokens_file;
  // Both set = serve TLS with this certificate chain and private key (PEM files).
  std::string tls_cert_file;
  std::string tls_key_file;
  // What workers are told to use; a worker silent for lease_timeout_s loses its leases (their
  // trials are requeued, each requeue counting as one attempt).
  double heartbeat_interval_s = 2;
  double lease_timeout_s = 15;
  // A trial whose lease expired this many times is recorded as failed, with the reason.
  int max_trial_attempts = 3;
  // Longest long-poll a LeaseTrial call may wait (a worker's wait_s is capped to this).
  double max_lease_wait_s = 10;
  // Per user (all anonymous callers count as one user): searches queued or running, and trials
  // they may still run (planned, not yet final), at most; a submit beyond either is
  // RESOURCE_EXHAUSTED. 0: no limit.
  int max_searches_per_user = 100;
  int64_t max_trials_per_user = 100000;
  // A search no connected worker can run (backend, command template, world size) says why in
  // its message at once and fails after this many seconds of it while any worker is connected;
  // 0: waits for ever (SchedulerOptions::unserved_search_timeout_s).
  double unserved_search_timeout_s = 600;
  // Per user, requests to the user API (RematService): `user_rate_burst` at once, then
  // `user_rate_limit` per second; a call over it is RESOURCE_EXHAUSTED (rate_limiter.h).
  // user_rate_limit 0: no limit.
  double user_rate_limit = 20;
  double user_rate_burst = 100;
  // remat_frontier_points has one series per active search (removed when it ends); this caps
  // how many, so the label stays bounded however many searches run at once.
  int max_frontier_series = 200;
  // Version reported in remat_build_info and used in the results-cache key of this coordinator.
  std::string version = common::kVersion;

  // Called once from Start as soon as the port is bound, with address(), before the unfinished
  // searches are resumed (rematd prints its "listening" line here). May be empty.
  std::function<void(const std::string& address)> on_listening;

  // Test seam: the clock the scheduler reads (lease expiry, long polls, timestamps), in
  // milliseconds; unset = the real clock (steady for expiry, system for timestamps). When set,
  // the coordinator runs no timer thread: tests call RunExpiryForTest() after moving their clock.
  std::function<int64_t()> clock_ms;
};

class Coordinator {
 public:
  // Validates `options` and opens the store (creating the schema when new).
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(CoordinatorOptions options);
  ~Coordinator();

  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Binds the gRPC port (and the metrics port), checks it really bound, calls on_listening, then
  // resumes every unfinished search found in the store (rebuilding its strategy, requeueing
  // leased-but-unreported trials; calls meanwhile answer UNAVAILABLE and the health service says
  // NOT_SERVING) and serves. Returns once serving; an error (port, store) stops both servers.
  // Call once.
  absl::Status Start();

  // The bound gRPC port (valid after a successful Start), and "127.0.0.1:PORT"-style address
  // clients of this process can dial.
  int port() const;
  std::string address() const;
  // The bound metrics port; 0 without a metrics endpoint.
  int metrics_port() const;
  // The plaintext health server's port, or 0 when health_listen was empty.
  int health_port() const;

  // Graceful: stops accepting calls, ends long polls and watch streams, lets calls in flight
  // finish for up to `drain`, then cancels the rest. The store stays consistent (every accepted
  // report is committed before its reply). Idempotent.
  void Shutdown(std::chrono::milliseconds drain = std::chrono::seconds(5));

  // Blocks until Shutdown has completed.
  void Wait();

  // Reads the token files again (rematd does on SIGHUP): new, changed and removed tokens take
  // effect for the next call; calls and streams in flight are not interrupted. A file that is
  // now missing, empty or malformed changes nothing: the tokens in use stay and the error
  // (InvalidArgument naming the file and line) is returned and logged. Without token files it
  // does nothing. May be called from any thread after Create.
  absl::Status ReloadTokens();

  // Tests with an injected clock: expire leases of workers silent past lease_timeout_s now.
  void RunExpiryForTest();

  class Impl;

 private:
  explicit Coordinator(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat::server
