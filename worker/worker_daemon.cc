#include "worker/worker_daemon.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "search/limits.h"
#include "search/text.h"
#include "worker/assignment.h"
#include "worker/trial_pipeline.h"
#include "worker/process_runner.h"
#include "worker/result_spool.h"

namespace remat::worker {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::shared_ptr<spdlog::logger> Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::get("worker");
    return l ? l : spdlog::stderr_color_mt("worker");
  }();
  return logger;
}

// Errors that no retry will cure: the coordinator does not accept this worker's credentials.
bool IsFatal(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnauthenticated ||
         s.code() == absl::StatusCode::kPermissionDenied;
}

// Errors that mean "the coordinator is away (or restarting)": retry later, keep the report.
bool IsTransient(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable ||
         s.code() == absl::StatusCode::kDeadlineExceeded ||
         s.code() == absl::StatusCode::kCancelled || s.code() == absl::StatusCode::kAborted ||
         s.code() == absl::StatusCode::kResourceExhausted ||
         s.code() == absl::StatusCode::kUnknown || s.code() == absl::StatusCode::kInternal;
}

std::string SafeName(const std::string& s) {
  std::string out;
  for (char c : s) {
    out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
  }
  return out.empty() ? "trial" : out;
}

std::string Tag(const Assignment& a) { return "[" + a.search_id + " " + a.trial_id + "]"; }

}  // namespace

class WorkerDaemon::Impl {
 public:
  Impl(WorkerDaemonOptions options, WorkerDaemonSeams seams)
      : options_(std::move(options)),
        client_(std::move(seams.client)),
        executors_(std::move(seams.executors)),
        spool_((fs::path(options_.work_dir) / "spool").string()),
        busy_(options_.slots.size(), false) {
    if (!client_) client_ = MakeGrpcCoordinatorClient(options_.connection);
    GroupLimits limits;
    limits.kill_grace_s = options_.kill_grace_s;
    limits.peer_failure_grace_s = options_.peer_failure_grace_s;
    limits.peer_exit_grace_s = options_.peer_exit_grace_s;
    // Every backend this worker offers, composed with the one launcher (worker/trial_pipeline.h).
    std::shared_ptr<Launcher> launcher =
        options_.launcher ? options_.launcher : std::shared_ptr<Launcher>(MakeLocalLauncher(limits));
    if (!executors_.count("builtin") && !options_.trial_binary.empty()) {
      executors_["builtin"] = MakeTrialExecutor(
          MakeBuiltinBackend({options_.trial_binary, options_.collective_timeout_s}), launcher);
    }
    if (!executors_.count("replay")) executors_["replay"] = MakeReplayExecutor();
    if (!executors_.count("command") && !options_.command_templates.empty()) {
      executors_["command"] =
          MakeTrialExecutor(MakeCommandBackend({options_.command_templates}), launcher);
    }
    if (!executors_.count("megatron") && !options_.megatron_driver.empty()) {
      MegatronBackendOptions m;
      m.driver = options_.megatron_driver;
      m.python = options_.megatron_python;
      m.megatron_path = options_.megatron_path;
      m.collective_timeout_s = options_.collective_timeout_s;
      executors_["megatron"] = MakeTrialExecutor(MakeMegatronBackend(m), launcher);
    }
  }

  ~Impl() {
    Stop();
    WaitForTrials();
    if (heartbeat_.joinable()) heartbeat_.join();
  }

  absl::Status Run() {
    absl::Status init = spool_.Init();
    if (!init.ok()) return init;
    std::error_code ec;
    CleanUpAfterAPreviousRun();
    fs::create_directories(fs::path(options_.work_dir) / "trials", ec);
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    absl::Status result = MainLoop();
    Stop();
    KillAllTrials();
    WaitForTrials();
    if (heartbeat_.joinable()) heartbeat_.join();
    return result;
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
      stopping_ = true;
      cv_.notify_all();
    }
    client_->Shutdown();
  }

  WorkerStats stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    WorkerStats s;
    s.registered = registered_;
    s.worker_id = worker_id_;
    s.running_trials = static_cast<int>(running_.size());
    s.free_slots = static_cast<int>(std::count(busy_.begin(), busy_.end(), false));
    s.total_slots = static_cast<int>(busy_.size());
    s.trials_finished = trials_finished_;
    s.reports_delivered = reports_delivered_;
    s.spooled = static_cast<int>(spool_.Size());
    return s;
  }

 private:
  struct RunningTrial {
    Assignment assignment;
    std::vector<int> slot_ids;
    CancelToken cancel;
    bool report = true;  // false when the worker stops: the coordinator re-runs it elsewhere
  };

  // ---- main loop -------------------------------------------------------------------------

  absl::Status MainLoop() {
    double backoff = options_.backoff_initial_s;
    bool warned = false;
    while (!stopping()) {
      if (!registered()) {
        absl::Status s = Register();
        if (s.ok()) {
          if (warned) Log()->info("coordinator {} is back", options_.connection.target);
          warned = false;
          backoff = options_.backoff_initial_s;
        } else if (IsFatal(s)) {
          Log()->error("coordinator {} refused this worker: {}", options_.connection.target,
                       s.ToString());
          return s;
        } else {
          if (!warned) {
            Log()->warn("cannot reach coordinator {}: {}; retrying with backoff",
                        options_.connection.target, s.ToString());
            warned = true;
          }
          SleepUnlessStopped(Jitter(backoff));
          backoff = std::min(backoff * 2, options_.backoff_max_s);
          continue;
        }
      }
      RedeliverSpooled();
      const int free = FreeSlots();
      if (free == 0) {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(1), [this] {
          return stopping_ || std::count(busy_.begin(), busy_.end(), false) > 0;
        });
        continue;
      }
      v1::LeaseTrialRequest request;
      request.set_worker_id(worker_id());
      request.set_free_slots(free);
      request.set_wait_s(options_.lease_wait_s);
      const auto lease_start = Clock::now();
      auto response = client_->LeaseTrial(request);
      if (options_.metrics != nullptr) {
        options_.metrics->ObserveLease(
            !response.ok()                 ? WorkerMetrics::LeaseOutcome::kError
            : response->trials_size() > 0 ? WorkerMetrics::LeaseOutcome::kTrials
                                           : WorkerMetrics::LeaseOutcome::kEmpty,
            std::chrono::duration<double>(Clock::now() - lease_start).count());
      }
      if (!response.ok()) {
        if (stopping()) break;
        if (IsFatal(response.status())) return response.status();
        Log()->warn("lease failed: {}", response.status().ToString());
        MarkUnregistered();
        SleepUnlessStopped(Jitter(backoff));
        backoff = std::min(backoff * 2, options_.backoff_max_s);
        continue;
      }
      backoff = options_.backoff_initial_s;
      // The one conversion of each assignment into domain types (worker/assignment.h).
      for (const v1::TrialAssignment& a : response->trials()) StartTrial(ToAssignment(a));
    }
    return absl::OkStatus();
  }

  absl::Status Register() {
    v1::RegisterRequest request;
    request.set_hostname(options_.hostname);
    for (const Slot& slot : options_.slots) {
      v1::Gpu* g = request.add_gpus();
      g->set_index(slot.index);
      g->set_name(slot.name);
      g->set_memory_bytes(slot.memory_bytes);
    }
    for (const auto& [k, v] : options_.versions) (*request.mutable_versions())[k] = v;
    for (const auto& [name, executor] : executors_) request.add_backends(name);
    for (const auto& [name, t] : options_.command_templates) request.add_command_templates(name);
    request.set_worker_id(worker_id());
    auto response = client_->Register(request);
    if (!response.ok()) return response.status();
    std::lock_guard<std::mutex> lock(mu_);
    if (!worker_id_.empty() && worker_id_ != response->worker_id()) {
      Log()->info("re-registered as {} (was {})", response->worker_id(), worker_id_);
    } else {
      Log()->info("registered as {} with {} slot(s) at {}", response->worker_id(),
                  options_.slots.size(), options_.connection.target);
    }
    worker_id_ = response->worker_id();
    if (response->heartbeat_interval_s() > 0) {
      heartbeat_interval_s_ = response->heartbeat_interval_s();
    }
    registered_ = true;
    cv_.notify_all();
    return absl::OkStatus();
  }

  // ---- heartbeats --------------------------------------------------------------------------

  void HeartbeatLoop() {
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::duration<double>(heartbeat_interval_s_),
                     [this] { return stopping_; });
        if (stopping_) return;
        if (!registered_) continue;
      }
      v1::HeartbeatRequest request;
      {
        std::lock_guard<std::mutex> lock(mu_);
        request.set_worker_id(worker_id_);
        for (const auto& [id, t] : running_) request.add_running_trial_ids(id);
      }
      auto response = client_->Heartbeat(request);
      if (!response.ok()) {
        if (stopping()) return;
        if (IsTransient(response.status()) || IsFatal(response.status()) ||
            response.status().code() == absl::StatusCode::kNotFound) {
          Log()->warn("heartbeat failed: {}", response.status().ToString());
          MarkUnregistered();
        }
        continue;
      }
      std::lock_guard<std::mutex> lock(mu_);
      for (const std::string& id : response->cancel_trial_ids()) {
        auto it = running_.find(id);
        if (it != running_.end() && !it->second->cancel.cancelled()) {
          Log()->info("{} cancelled by the coordinator", Tag(it->second->assignment));
          it->second->cancel.Cancel();
        }
      }
      if (response->reregister()) {
        Log()->info("coordinator asks to re-register");
        registered_ = false;
        cv_.notify_all();
      }
    }
  }

  // ---- trials ------------------------------------------------------------------------------

  void StartTrial(Assignment a) {
    if (!a.error.empty()) {
      Log()->warn("{} cannot be read: {}", Tag(a), a.error);
      Deliver(a, StatusResult(search::TrialStatus::kFailed, a.error));
      return;
    }
    const std::string backend = search::Name(a.spec.search.backend);
    auto executor = executors_.find(backend);
    if (executor == executors_.end()) {
      Log()->warn("{} backend {} is not available on this worker", Tag(a), backend);
      Deliver(a, StatusResult(search::TrialStatus::kFailed,
                              "this worker has no " + backend + " backend"));
      return;
    }
    const int world = a.world_size;
    auto trial = std::make_shared<RunningTrial>();
    trial->assignment = a;
    std::string refused;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_.count(a.trial_id)) {
        Log()->warn("{} is already running on this worker; ignored", Tag(a));
        return;
      }
      for (size_t i = 0; i < busy_.size() && static_cast<int>(trial->slot_ids.size()) < world;
           ++i) {
        if (!busy_[i]) trial->slot_ids.push_back(static_cast<int>(i));
      }
      if (static_cast<int>(trial->slot_ids.size()) < world) {
        refused = "needs " + std::to_string(world) + " slots; this worker had " +
                  std::to_string(trial->slot_ids.size()) + " free";
      } else {
        for (int i : trial->slot_ids) busy_[i] = true;
        running_[a.trial_id] = trial;
        ++active_threads_;
      }
    }
    if (!refused.empty()) {
      Log()->warn("{} refused: {}", Tag(a), refused);
      Deliver(a, StatusResult(search::TrialStatus::kFailed, refused));
      return;
    }
    Log()->info("{} {} starts on {} slot(s), backend {}, attempt {}", Tag(a), a.policy_name, world,
                backend, a.attempt);
    TrialExecutor* exec = executor->second.get();
    std::thread([this, trial, exec] { RunTrial(trial, exec); }).detach();
  }

  // A run of this worker that was killed (SIGKILL, OOM killer, power cut of the daemon only) may
  // have left trial processes running beside the coordinator's re-run of their trials, and their
  // folders behind: end each group its record names (group, pid and start time, so a recycled
  // pid is never hit) and remove the folders, before any trial of this run starts. The work
  // folder is this worker's alone.
  void CleanUpAfterAPreviousRun() {
    std::vector<fs::path> stale;
    std::error_code ec;
    for (fs::directory_iterator it(fs::path(options_.work_dir) / "trials", ec), end;
         !ec && it != end; it.increment(ec)) {
      stale.push_back(it->path());
    }
    for (const fs::path& dir : stale) {
      if (KillRecordedGroup((dir / kGroupRecordFile).string())) {
        Log()->warn("killed the trial processes a previous run left in {}", dir.string());
      }
      if (!options_.keep_trial_dirs) {
        std::error_code removed;
        fs::remove_all(dir, removed);
      }
    }
    if (!stale.empty() && !options_.keep_trial_dirs) {
      Log()->info("removed {} trial folder(s) a previous run left", stale.size());
    }
  }

  void RunTrial(std::shared_ptr<RunningTrial> trial, TrialExecutor* executor) {
    const Assignment& a = trial->assignment;
    const auto t0 = Clock::now();
    const fs::path dir = fs::path(options_.work_dir) / "trials" /
                         (SafeName(a.trial_id) + "." + std::to_string(a.attempt));
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::create_directories(dir, ec);

    TrialContext context;
    context.assignment = &trial->assignment;
    for (int i : trial->slot_ids) context.slots.push_back(options_.slots[i]);
    context.trial_dir = dir.string();
    context.cancel = &trial->cancel;
    search::TrialResult result;
    if (ec) {
      result = StatusResult(search::TrialStatus::kFailed,
                            "cannot create trial folder " + dir.string() + ": " + ec.message());
    } else {
      result = executor->Run(context);
    }
    result.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!options_.keep_trial_dirs) fs::remove_all(dir, ec);

    bool report;
    {
      std::lock_guard<std::mutex> lock(mu_);
      report = trial->report;
    }
    if (report) {
      Log()->info("{} {} finished: {} in {:.2f} s{}{}", Tag(a), a.policy_name,
                  search::Name(result.status), result.wall_s, result.message.empty() ? "" : ": ",
                  result.message);
      if (options_.metrics != nullptr) options_.metrics->TrialFinished(result.status);
      Deliver(a, result);
    } else {
      Log()->info("{} stopped with the worker; not reported", Tag(a));
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (int i : trial->slot_ids) busy_[i] = false;
    running_.erase(a.trial_id);
    ++trials_finished_;
    --active_threads_;
    cv_.notify_all();
  }

  // Spools the report, then tries to hand it over; what fails now is re-sent by the main loop.
  void Deliver(const Assignment& a, const search::TrialResult& result) {
    const v1::ReportTrialRequest report = MakeReport(worker_id(), a, result);
    absl::Status spooled = spool_.Put(report);
    if (!spooled.ok()) Log()->warn("cannot spool report: {}", spooled.ToString());
    if (!registered()) return;
    Send(report);
  }

  // True when the report is settled (delivered or refused for good).
  bool Send(v1::ReportTrialRequest report) {
    // A report answers the lease of the id it was made under (the coordinator accepts it only
    // from that id): a restarted worker redelivers its predecessor's spooled reports under the
    // predecessor's id, which its token registered too.
    if (report.worker_id().empty()) report.set_worker_id(worker_id());
    auto response = client_->ReportTrial(report);
    if (!response.ok()) {
      if (IsTransient(response.status())) {
        Log()->warn("[{}] report not delivered ({}); kept in the spool", report.trial_id(),
                    response.status().ToString());
        return false;
      }
      Log()->warn("[{}] report refused: {}", report.trial_id(), response.status().ToString());
      if (response.status().code() == absl::StatusCode::kInvalidArgument &&
          report.result().status() != v1::TRIAL_STATUS_FAILED) {
        // What was measured cannot be delivered; that it failed, and why, can (the search sees
        // the reason at once instead of a lease lost three times).
        v1::ReportTrialRequest failed = report;
        v1::TrialResult* r = failed.mutable_result();
        const double wall_s = r->wall_s();
        const v1::Policy policy = r->policy();
        r->Clear();
        r->set_status(v1::TRIAL_STATUS_FAILED);
        *r->mutable_policy() = policy;
        r->set_wall_s(wall_s);
        r->set_message(search::BoundedUtf8("the coordinator refused this trial's report: " +
                                               std::string(response.status().message()),
                                           search::limits::kMaxTrialMessageBytes));
        absl::Status spooled = spool_.Put(failed);  // replaces the refused one (same file)
        if (!spooled.ok()) Log()->warn("cannot spool report: {}", spooled.ToString());
        return Send(std::move(failed));
      }
    } else if (!response->accepted()) {
      Log()->info("[{}] report was a duplicate or stale; dropped", report.trial_id());
    }
    spool_.Remove(report);
    std::lock_guard<std::mutex> lock(mu_);
    ++reports_delivered_;
    return true;
  }

  void RedeliverSpooled() {
    std::vector<v1::ReportTrialRequest> pending = spool_.List();
    for (const auto& report : pending) {
      {
        // A report of a trial still being delivered by its own thread is left to that thread.
        std::lock_guard<std::mutex> lock(mu_);
        if (running_.count(report.trial_id())) continue;
      }
      if (stopping() || !registered()) return;
      if (!Send(report)) return;
    }
  }

  void KillAllTrials() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, trial] : running_) {
      trial->report = false;
      trial->cancel.Cancel();
    }
  }

  void WaitForTrials() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return active_threads_ == 0; });
  }

  // ---- helpers -----------------------------------------------------------------------------

  bool stopping() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stopping_;
  }
  bool registered() const {
    std::lock_guard<std::mutex> lock(mu_);
    return registered_;
  }
  std::string worker_id() const {
    std::lock_guard<std::mutex> lock(mu_);
    return worker_id_;
  }
  void MarkUnregistered() {
    std::lock_guard<std::mutex> lock(mu_);
    registered_ = false;
    cv_.notify_all();
  }
  int FreeSlots() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(std::count(busy_.begin(), busy_.end(), false));
  }
  void SleepUnlessStopped(double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, std::chrono::duration<double>(seconds), [this] { return stopping_; });
  }
  double Jitter(double seconds) {
    std::lock_guard<std::mutex> lock(mu_);
    std::uniform_real_distribution<double> d(0.8, 1.2);
    return seconds * d(rng_);
  }

  const WorkerDaemonOptions options_;
  std::unique_ptr<CoordinatorClient> client_;
  std::map<std::string, std::unique_ptr<TrialExecutor>> executors_;
  ResultSpool spool_;
  std::thread heartbeat_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool registered_ = false;
  std::string worker_id_;
  double heartbeat_interval_s_ = 2;
  std::vector<bool> busy_;
  std::map<std::string, std::shared_ptr<RunningTrial>> running_;
  int active_threads_ = 0;
  int trials_finished_ = 0;
  int reports_delivered_ = 0;
  std::mt19937 rng_{std::random_device{}()};
};

absl::StatusOr<std::unique_ptr<WorkerDaemon>> WorkerDaemon::Create(WorkerDaemonOptions options,
                                                                   WorkerDaemonSeams seams) {
  if (options.slots.empty()) return absl::InvalidArgumentError("worker: no slots to offer");
  if (options.work_dir.empty()) return absl::InvalidArgumentError("--work-dir: must be set");
  if (!seams.client && options.connection.target.empty()) {
    return absl::InvalidArgumentError("--coordinator: must be set (HOST:PORT)");
  }
  if (options.hostname.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    options.hostname = host;
  }
  return std::unique_ptr<WorkerDaemon>(
      new WorkerDaemon(std::make_unique<Impl>(std::move(options), std::move(seams))));
}

WorkerDaemon::WorkerDaemon(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
WorkerDaemon::~WorkerDaemon() = default;
absl::Status WorkerDaemon::Run() { return impl_->Run(); }
void WorkerDaemon::Stop() { impl_->Stop(); }
WorkerStats WorkerDaemon::stats() const { return impl_->stats(); }

}  // namespace remat::worker
