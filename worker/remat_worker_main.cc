// remat-worker: the worker daemon on a GPU node. Flags are read here and only here.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>

#include "absl/strings/ascii.h"
#include "common/main_util.h"
#include "common/version.h"
#include "absl/strings/str_join.h"
#include "worker/slots.h"
#include "worker/slurm_launcher.h"
#include "worker/worker_daemon.h"
#include "worker/worker_setup.h"

namespace {

namespace fs = std::filesystem;
using remat::common::Fail;
using remat::common::ReadFile;

// Every command-line flag.
struct Flags {
  std::string coordinator, gpus, token_file, tls_ca, work_dir, trial_binary, templates_file;
  std::string log_level = "info";
  double grace_s = 10;
  int plain_slots = 0;
  bool tls = false, keep_trial_dirs = false;
  std::string executor = "local";
  std::string megatron_path, megatron_driver, python = "python3";
  remat::worker::SlurmLauncherOptions slurm;
  std::string slurm_user_accounts;
  std::string metrics_listen, health_listen;
};

void AddFlags(CLI::App& app, Flags& f) {
  app.add_option("--coordinator", f.coordinator, "the coordinator, HOST:PORT")->required();
  app.add_option("--gpus", f.gpus,
                 "GPUs to offer, e.g. 0,1 (default: all); without GPUs, names plain slots");
  app.add_option("--plain-slots", f.plain_slots,
                 "offer N plain (CPU) slots and no GPUs (replay rehearsals, CPU trials)")
      ->check(CLI::PositiveNumber)
      ->excludes("--gpus");
  app.add_option("--token-file", f.token_file,
                 "file holding this worker's bearer token (or env REMAT_WORKER_TOKEN)");
  app.add_flag("--tls", f.tls, "connect with TLS (system roots unless --tls-ca)");
  app.add_option("--tls-ca", f.tls_ca, "PEM file of the CA that signed the coordinator's cert");
  app.add_option("--work-dir", f.work_dir,
                 "trial folders and undelivered results (default: $TMPDIR/remat-worker-UID)");
  app.add_option("--trial-binary", f.trial_binary,
                 "remat-trial to run (default: beside this program)");
  app.add_option("--command-templates", f.templates_file,
                 "YAML file of command templates for the command backend (worker/README.md)");
  app.add_option("--megatron-path", f.megatron_path,
                 "offer the megatron backend with this Megatron-LM checkout (a folder holding "
                 "megatron/core), put first on the driver's sys.path");
  app.add_flag("--megatron-installed",
               "offer the megatron backend with the megatron-core installed for --python");
  app.add_option("--python", f.python,
                 "the Python (with torch) that runs the megatron driver (default python3)");
  app.add_option("--megatron-driver", f.megatron_driver,
                 "remat_megatron_driver.py (default: megatron_driver/ beside this program)");
  app.add_option("--trial-timeout-grace", f.grace_s,
                 "seconds between SIGTERM and SIGKILL when a trial is killed")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--keep-trial-dirs", f.keep_trial_dirs, "keep each trial's folder for debugging");
  app.add_option("--executor", f.executor,
                 "local: trials run on this machine; slurm: every trial is a Slurm job")
      ->check(CLI::IsMember({"local", "slurm"}));
  remat::worker::SlurmLauncherOptions& slurm = f.slurm;
  app.add_option("--slurm-partition", slurm.partition, "with --executor slurm: sbatch --partition");
  app.add_option("--slurm-account", slurm.account, "with --executor slurm: sbatch --account");
  app.add_option("--slurm-user-accounts", f.slurm_user_accounts,
                 "with --executor slurm: file of \"USER ACCOUNT\" lines: a trial of USER's "
                 "search is charged to ACCOUNT (others to --slurm-account)");
  app.add_option("--slurm-poll-interval", slurm.poll_interval_s,
                 "with --executor slurm: seconds between the one batched squeue of all the "
                 "worker's jobs (default 1)")
      ->check(CLI::Range(0.1, 600.0));
  app.add_option("--slurm-qos", slurm.qos, "with --executor slurm: sbatch --qos");
  app.add_option("--slurm-time-limit", slurm.time_limit,
                 "with --executor slurm: sbatch --time (default: the trial's timeout + 1 min)");
  app.add_option("--slurm-gpus-per-node", slurm.gpus_per_node,
                 "with --executor slurm: GPUs per node (0: CPU nodes, no GRES)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--slurm-arg", slurm.extra_sbatch_args,
                 "with --executor slurm: one more sbatch flag, e.g. --slurm-arg=--mem=64G "
                 "(repeatable)");
  app.add_option("--metrics-listen", f.metrics_listen,
                 "Prometheus /metrics address HOST:PORT (remat_worker_* and process_*; "
                 "default: none)");
  app.add_option("--health-listen", f.health_listen,
                 "plaintext gRPC health address HOST:PORT for probes: service \"\" while the "
                 "daemon runs, \"remat.v1.WorkerService\" while registered (default: none)");
  app.set_version_flag("--version", remat::common::kVersion);
  app.add_option("--log-level", f.log_level, "trace, debug, info, warn, error")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
}

// The coordinator, the bearer token and TLS. 0, or the exit code (the error written).
int ResolveConnection(const Flags& f, remat::worker::WorkerDaemonOptions& options) {
  options.connection.target = f.coordinator;
  if (!f.token_file.empty()) {
    auto token = ReadFile(f.token_file);
    if (!token) return Fail(2, "--token-file: cannot read " + f.token_file);
    options.connection.token = std::string(absl::StripAsciiWhitespace(*token));
    if (options.connection.token.empty())
      return Fail(2, "--token-file: " + f.token_file + " is empty");
  } else if (const char* env = getenv("REMAT_WORKER_TOKEN")) {
    options.connection.token = std::string(absl::StripAsciiWhitespace(env));
  }
  options.connection.tls = f.tls;
  if (!f.tls_ca.empty()) {
    auto pem = ReadFile(f.tls_ca);
    if (!pem) return Fail(2, "--tls-ca: cannot read " + f.tls_ca);
    options.connection.tls_ca_pem = *pem;
    options.connection.tls = true;
  }
  return 0;
}

// The slots offered: plain slots bounding the submitted ranks under Slurm, else plain slots or
// this machine's GPUs; the Slurm flags only with --executor slurm. 0, or the exit code.
int ResolveSlots(const CLI::App& app, Flags& f, remat::worker::WorkerDaemonOptions& options) {
  if (f.executor == "slurm") {
    // The worker holds no GPU: Slurm allocates them per trial. Its slots only bound how many
    // ranks it keeps submitted at once.
    if (!f.gpus.empty()) return Fail(2, "--gpus: not with --executor slurm (Slurm allocates GPUs)");
    options.slots = remat::worker::PlainSlots(f.plain_slots > 0 ? f.plain_slots : 16);
    if (!f.slurm_user_accounts.empty()) {
      auto accounts = remat::worker::ReadSlurmUserAccounts(f.slurm_user_accounts);
      if (!accounts.ok()) return Fail(2, std::string(accounts.status().message()));
      f.slurm.user_accounts = *accounts;
    }
  } else if (app.count("--slurm-partition") + app.count("--slurm-account") +
                 app.count("--slurm-user-accounts") + app.count("--slurm-poll-interval") +
                 app.count("--slurm-qos") + app.count("--slurm-time-limit") +
                 app.count("--slurm-gpus-per-node") + app.count("--slurm-arg") > 0) {
    return Fail(2, "--slurm-*: only with --executor slurm");
  } else if (f.plain_slots > 0) {
    options.slots = remat::worker::PlainSlots(f.plain_slots);
  } else {
    auto slots = remat::worker::SelectSlots(remat::worker::DiscoverGpus(), f.gpus);
    if (!slots.ok()) return Fail(2, std::string(slots.status().message()));
    options.slots = *slots;
  }
  return 0;
}

// The backends offered (worker/worker_setup.h, shared with `remat search`). 0, or the exit code.
int ResolveBackends(const CLI::App& app, const Flags& f,
                    remat::worker::WorkerDaemonOptions& options) {
  remat::worker::BackendFlags backends;
  backends.trial_binary = f.trial_binary;
  backends.command_templates = f.templates_file;
  backends.megatron = !f.megatron_path.empty() || app.count("--megatron-installed") > 0;
  if (!backends.megatron && (!f.megatron_driver.empty() || app.count("--python") > 0)) {
    return Fail(2, "--megatron-driver/--python: only with --megatron-path or --megatron-installed");
  }
  backends.megatron_path = f.megatron_path;
  backends.megatron_driver = f.megatron_driver;
  backends.python = f.python;
  std::string warning;
  if (absl::Status set_up = remat::worker::SetUpBackends(
          backends, remat::common::SelfDir(), "remat-worker", &options, &warning);
      !set_up.ok()) {
    return Fail(2, std::string(set_up.message()));
  }
  if (!warning.empty()) spdlog::warn("{}", warning);
  return 0;
}

// Every backend's trials become Slurm jobs (worker/slurm_launcher.h); the jobs a previous worker
// on this work dir left are cancelled first.
void UseSlurm(remat::worker::SlurmLauncherOptions slurm, const std::string& work_dir,
              remat::worker::WorkerDaemonOptions& options) {
  slurm.peer_exit_grace_s = options.peer_exit_grace_s;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  slurm.worker_tag = remat::worker::SlurmWorkerTag(host, fs::absolute(work_dir).string());
  const absl::StatusOr<std::vector<std::string>> orphans =
      remat::worker::CancelOrphanedSlurmJobs(slurm, (fs::path(work_dir) / "slurm").string());
  if (!orphans.ok()) {
    spdlog::warn("could not look for jobs a previous worker left in Slurm: {}",
                 std::string(orphans.status().message()));
  } else if (!orphans->empty()) {
    spdlog::info("cancelled {} Slurm job(s) a previous worker on this work dir left: {}",
                 orphans->size(), absl::StrJoin(*orphans, " "));
  }
  options.launcher = remat::worker::MakeSlurmLauncher(slurm);
}

// Runs the daemon with its metrics and health endpoints until a signal or the coordinator
// stops it.
int Serve(const Flags& f, remat::worker::WorkerDaemonOptions& options,
          remat::worker::WorkerMetrics& metrics, remat::common::StopSignals& stop_signals) {
  auto daemon = remat::worker::WorkerDaemon::Create(options);
  if (!daemon.ok()) return Fail(2, std::string(daemon.status().message()));
  std::string slot_names;
  for (const auto& s : options.slots) {
    slot_names += (slot_names.empty() ? "" : ", ") + std::to_string(s.index) + ":" + s.name;
  }
  remat::worker::WorkerDaemon* d = daemon->get();
  auto endpoints = remat::worker::WorkerEndpoints::Start(
      {f.metrics_listen, f.health_listen}, &metrics, [d] { return d->stats(); });
  if (!endpoints.ok()) {
    return Fail(endpoints.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1,
                std::string(endpoints.status().message()));
  }
  if ((*endpoints)->metrics_port() != 0) {
    std::cout << "remat-worker metrics on port " << (*endpoints)->metrics_port() << std::endl;
  }
  if ((*endpoints)->health_port() != 0) {
    std::cout << "remat-worker health on port " << (*endpoints)->health_port() << std::endl;
  }
  spdlog::info("remat-worker {} offering {} slot(s) [{}], work dir {}{}",
               remat::common::kVersion, options.slots.size(), slot_names, options.work_dir,
               f.executor == "slurm" ? ", trials run as Slurm jobs" : "");

  stop_signals.OnStop([&](int sig) {
    spdlog::info("signal {}: stopping", sig);
    (*daemon)->Stop();
  });
  absl::Status status = (*daemon)->Run();
  stop_signals.Finish();
  (*endpoints)->Stop();
  if (!status.ok()) return Fail(1, "coordinator " + f.coordinator + ": " + status.ToString());
  return 0;
}

}  // namespace

static int RealMain(int argc, char** argv) {
  CLI::App app{"remat-worker: runs remat trials on this machine for a remat coordinator"};
  Flags f;
  AddFlags(app, f);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::cout << remat::common::kVersion << std::endl;
    return 0;
  } catch (const CLI::ParseError& e) {
    return Fail(2, e.what());
  }

  spdlog::set_default_logger(spdlog::stderr_color_mt("remat-worker"));
  spdlog::set_level(spdlog::level::from_str(f.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ [%n] %v");  // ISO 8601 with the zone

  remat::worker::WorkerDaemonOptions options;
  if (int code = ResolveConnection(f, options); code != 0) return code;
  if (int code = ResolveSlots(app, f, options); code != 0) return code;
  if (f.work_dir.empty()) {
    std::error_code ec;
    fs::path tmp = fs::temp_directory_path(ec);
    if (ec) tmp = "/tmp";
    f.work_dir = (tmp / ("remat-worker-" + std::to_string(getuid()))).string();
  }
  options.work_dir = f.work_dir;
  if (int code = ResolveBackends(app, f, options); code != 0) return code;
  options.kill_grace_s = f.grace_s;
  options.keep_trial_dirs = f.keep_trial_dirs;
  remat::worker::WorkerMetrics metrics(remat::common::kVersion);
  options.metrics = &metrics;

  // SIGINT/SIGTERM stop the daemon from one waiting thread; children get default handling.
  remat::common::StopSignals stop_signals;
  if (f.executor == "slurm") UseSlurm(f.slurm, f.work_dir, options);
  return Serve(f, options, metrics, stop_signals);
}

int main(int argc, char** argv) {
  return remat::common::GuardedMain([&] { return RealMain(argc, argv); });
}
