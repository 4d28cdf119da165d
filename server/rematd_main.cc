// rematd: the remat coordinator. Flags fill CoordinatorOptions; SIGTERM/SIGINT drain gracefully,
// SIGHUP reloads the token files. Exit codes: 0 after a drain, 2 bad flags or configuration
// (unreadable, empty or malformed token files included: systemd must not restart it for that),
// 1 anything else (port in use, database unopenable).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "absl/synchronization/mutex.h"
#include "common/main_util.h"
#include "common/version.h"
#include "server/coordinator.h"

namespace {

using remat::common::Fail;

}  // namespace

static int RealMain(int argc, char** argv) {
  remat::server::CoordinatorOptions options;
  std::string log_level = "info";
  double drain_s = 10;

  CLI::App app{"rematd: the remat coordinator (gRPC API, job store, scheduler, metrics)",
               "rematd"};
  app.set_version_flag("--version", remat::common::kVersion);
  app.add_option("--listen", options.listen, "gRPC address HOST:PORT (port 0: a free port)")
      ->required();
  app.add_option("--db", options.db_path, "SQLite database file (created when missing)")
      ->required();
  app.add_option("--metrics-listen", options.metrics_listen,
                 "Prometheus /metrics address HOST:PORT (default: no metrics endpoint)");
  app.add_option("--health-listen", options.health_listen,
                 "plaintext gRPC health-only address HOST:PORT for probes that cannot speak TLS");
  app.add_option("--user-tokens", options.user_tokens_file,
                 "file of \"TOKEN USER [admin]\" lines: users must send a bearer token; admins "
                 "list, watch and cancel every user's searches (SIGHUP reloads it)");
  app.add_option("--worker-tokens", options.worker_tokens_file,
                 "file of \"TOKEN [NAME]\" lines: workers must send a bearer token (SIGHUP "
                 "reloads it)");
  app.add_option("--munge-socket", options.munge_socket,
                 "also accept users' MUNGE credentials (remat --munge), decoded by the munged "
                 "of this socket, e.g. /run/munge/munge.socket.2");
  app.add_option("--tls-cert", options.tls_cert_file, "PEM certificate chain (serve TLS)");
  app.add_option("--tls-key", options.tls_key_file, "PEM private key (serve TLS)");
  app.add_option("--heartbeat-interval", options.heartbeat_interval_s,
                 "seconds between worker heartbeats")
      ->capture_default_str();
  app.add_option("--lease-timeout", options.lease_timeout_s,
                 "seconds of silence after which a worker loses its leases")
      ->capture_default_str();
  app.add_option("--max-attempts", options.max_trial_attempts,
                 "leases per trial before it is recorded as failed")
      ->capture_default_str();
  app.add_option("--max-searches-per-user", options.max_searches_per_user,
                 "searches one user may have queued or running (0: no limit)")
      ->capture_default_str();
  app.add_option("--max-trials-per-user", options.max_trials_per_user,
                 "trials one user's searches may still run (0: no limit)")
      ->capture_default_str();
  app.add_option("--user-rate-limit", options.user_rate_limit,
                 "requests per second one user may make to the user API, after the burst "
                 "(0: no limit)")
      ->capture_default_str();
  app.add_option("--user-rate-burst", options.user_rate_burst,
                 "requests one user may make at once")
      ->capture_default_str();
  app.add_option("--unserved-search-timeout", options.unserved_search_timeout_s,
                 "seconds a search no connected worker can run waits before it fails (0: for ever)")
      ->capture_default_str();
  app.add_option("--drain", drain_s, "seconds to let calls finish on SIGTERM")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical, off")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return Fail(2, e.what());
  }
  const auto level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off") {
    return Fail(2, "--log-level: unknown level \"" + log_level + "\"");
  }

  // gRPC's abseil mutexes check lock order on every acquisition in this build; that costs a
  // few per cent of the coordinator's CPU under load and protects against nothing in production.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  // Logs go to stderr; configured once here, before any component logger exists.
  auto logger = spdlog::stderr_color_mt("rematd");
  spdlog::set_default_logger(logger);
  spdlog::set_level(level);
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e%z %^%l%$ [%n] %v");  // ISO 8601 with the zone

  // Signals are taken by one thread; every other thread has them blocked. SIGHUP reloads the
  // token files (systemctl reload rematd) instead of ending the coordinator.
  remat::common::StopSignals signals(remat::common::StopSignals::kReloadOnHangup);

  // Printed as soon as the port is bound, before the unfinished searches are resumed.
  remat::server::Coordinator* self = nullptr;
  options.on_listening = [&self](const std::string& address) {
    std::cout << "rematd listening on " << address << std::endl;
    if (self->metrics_port() != 0) {
      std::cout << "rematd metrics on port " << self->metrics_port() << std::endl;
    }
  };
  auto coordinator = remat::server::Coordinator::Create(options);
  if (!coordinator.ok()) {
    return Fail(coordinator.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1,
                std::string(coordinator.status().message()));
  }
  self = coordinator->get();
  absl::Status started = (*coordinator)->Start();
  if (!started.ok()) {
    return Fail(started.code() == absl::StatusCode::kInvalidArgument ? 2 : 1,
                std::string(started.message()));
  }

  remat::server::Coordinator* c = coordinator->get();
  signals.OnStop(
      [c, drain_s](int sig) {
        spdlog::info("signal {}: draining", sig);
        c->Shutdown(std::chrono::milliseconds(static_cast<int64_t>(drain_s * 1000)));
      },
      [c] {
        spdlog::info("SIGHUP: reloading the token files");
        c->ReloadTokens().IgnoreError();  // logged; the tokens in use stay
      });
  c->Wait();
  signals.Finish();
  return 0;
}

int main(int argc, char** argv) {
  return remat::common::GuardedMain([&] { return RealMain(argc, argv); });
}
