// rematd as a child process of a bench (remat-load-bench, remat-submit-bench): started on
// loopback with ephemeral ports, its address read from the line it prints when listening, and what
// the benches measure of it read from /proc and its metrics endpoint.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace remat::bench {

struct RematdProcess {
  pid_t pid = -1;
  std::string address;   // "" when rematd did not start
  int metrics_port = 0;  // 0 unless started with --metrics-listen

  // Runs `rematd --listen 127.0.0.1:0 --db DB EXTRA_ARGS...`, its stderr appended to `log`, and
  // returns once it printed its listening line (and its metrics line, when EXTRA_ARGS holds
  // --metrics-listen) or exited.
  static RematdProcess Start(const std::string& rematd, const std::string& db,
                             const std::string& log, const std::vector<std::string>& extra_args);

  double CpuSeconds() const;                       // utime + stime
  double StatusMiB(const std::string& key) const;  // a /proc/PID/status line: VmHWM, VmRSS
  int Stop(int signal_number = 15);                // signals it and reaps it; its exit code or -1
};

// GET http://127.0.0.1:PORT/metrics; "" on failure.
std::string ScrapeMetrics(int port);

// The coordinator's own view of an RPC's latency: the upper bound of the histogram bucket
// holding quantile q of remat_rpc_duration_seconds{method}, in ms (-1 when absent). The series of
// every status code (the `code` label) are summed bucket by bucket.
double ServerQuantileMs(const std::string& page, const std::string& method, double q);

}  // namespace remat::bench
