// WorkerDaemon: the worker side of remat. It registers its slots (GPUs, or plain CPU slots) and
// software versions with the coordinator, heartbeats, leases trials that fit its free slots,
// runs each with the trial's backend (worker/trial_executor.h) and reports the result.
//
//   auto daemon = WorkerDaemon::Create(options);   // options filled by main (or `remat search`)
//   std::thread t([&] { status = (*daemon)->Run(); });  // blocks until Stop()
//   ...
//   (*daemon)->Stop(); t.join();
//
// Resilience: when the coordinator is away, the daemon retries with exponential backoff and
// re-registers under its old id; finished trials are spooled in work_dir/spool and reported when
// the coordinator is back (ReportTrial is idempotent). A trial that crashes, hangs or OOMs is a
// result; nothing a trial does ends the daemon. On Stop, running trials are killed and not
// reported (the coordinator's lease expires and the trial runs elsewhere).
//
// Thread-safety: Run is called once, from one thread; Stop and stats may be called from any
// thread, at any time (also before Run). Create returns InvalidArgument for bad options; Run
// returns OK after Stop, or the error that made the worker give up (the coordinator refused
// its credentials: UNAUTHENTICATED / PERMISSION_DENIED).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/command_template.h"
#include "worker/coordinator_client.h"
#include "worker/launcher.h"
#include "worker/slots.h"
#include "worker/trial_executor.h"
#include "worker/worker_metrics.h"

namespace remat::worker {

struct WorkerDaemonOptions {
  ConnectionOptions connection;  // the coordinator, token, TLS, per-call deadline
  std::vector<Slot> slots;       // the slots to offer; must not be empty
  std::string work_dir;          // trial folders (trials/) and undelivered results (spool/)
  std::string trial_binary;      // remat-trial; "" offers no builtin backend
  std::map<std::string, CommandTemplate> command_templates;  // empty: no command backend
  // The megatron backend (worker/megatron_executor.h): offered when megatron_driver is set.
  std::string megatron_driver;           // remat_megatron_driver.py
  std::string megatron_python = "python3";
  std::string megatron_path;             // "" : an installed megatron-core
  // Where every backend's trials run (worker/launcher.h): null runs them on this machine's slots
  // (MakeLocalLauncher with the limits below); remat-worker --executor slurm sets the Slurm one.
  std::shared_ptr<Launcher> launcher;
  double kill_grace_s = 10;           // a timed-out trial's group: SIGTERM, then SIGKILL after this
  double peer_failure_grace_s = 30;   // one rank died: the others get this long, then are killed
  double peer_exit_grace_s = 60;      // one rank finished: the others get this long, then are killed
  double collective_timeout_s = 300;  // handed to remat-trial ranks
  std::string hostname;               // reported to the coordinator
  std::map<std::string, std::string> versions;  // software versions reported (remat, torch, ...)
  double lease_wait_s = 2;                      // LeaseTrial long-poll wait
  double backoff_initial_s = 0.1;               // reconnect backoff: initial, doubled up to max
  double backoff_max_s = 5;
  bool keep_trial_dirs = false;  // keep each trial's folder (requests, logs) for debugging
  // Where trial results and lease calls are counted (--metrics-listen); null: nowhere. Must
  // outlive the daemon.
  WorkerMetrics* metrics = nullptr;
};

// What tests and `remat search` may replace. Left empty, Create builds the real ones.
struct WorkerDaemonSeams {
  std::unique_ptr<CoordinatorClient> client;
  std::map<std::string, std::unique_ptr<TrialExecutor>> executors;  // by backend name
};

struct WorkerStats {
  bool registered = false;
  std::string worker_id;
  int running_trials = 0;
  int free_slots = 0;
  int total_slots = 0;
  int trials_finished = 0;    // trials that ended (any status)
  int reports_delivered = 0;  // reports the coordinator answered
  int spooled = 0;            // reports waiting on disk
};

class WorkerDaemon {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerDaemon>> Create(WorkerDaemonOptions options,
                                                              WorkerDaemonSeams seams = {});
  ~WorkerDaemon();  // stops and waits for everything

  absl::Status Run();
  void Stop();
  WorkerStats stats() const;

  WorkerDaemon(const WorkerDaemon&) = delete;
  WorkerDaemon& operator=(const WorkerDaemon&) = delete;

 private:
  class Impl;
  explicit WorkerDaemon(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace remat::worker
