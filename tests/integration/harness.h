// Integration-test harness: real rematd, remat-worker and remat processes on loopback.
//
// Each test gets a scratch folder; every process logs into it, and a failing test prints the
// tail of each log. Processes are killed (by pid, never by name) when the test ends.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "search/spec.h"
#include "specfile/spec_file.h"

namespace remat::integration {

// A child process running in the background, in its own process group.
class Daemon {
 public:
  Daemon(std::string name, std::vector<std::string> argv, std::string log_path);
  ~Daemon();  // SIGKILLs the group if still running
  bool running();
  void Kill(int sig);          // signal the whole group
  int Wait(double timeout_s);  // exit code, 128+signal, or -1 on timeout
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  const std::string& log_path() const { return log_path_; }

 private:
  std::string name_;
  std::string log_path_;
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

struct CommandResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

class Cluster {
 public:
  Cluster();
  ~Cluster();

  const std::string& dir() const { return dir_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }

  // rematd on this cluster's port with the database in the scratch folder.
  Daemon* StartCoordinator(std::vector<std::string> extra_args = {});
  // A worker with `slots` plain slots.
  Daemon* StartWorker(int slots, std::vector<std::string> extra_args = {});

  // Runs `remat ARGS...` (with --coordinator for client commands when `with_coordinator`).
  CommandResult Remat(std::vector<std::string> args, bool with_coordinator = true);
  // Runs any program to its end (killed after `timeout_s`: exit code 128 + 9).
  CommandResult Run(std::vector<std::string> argv, double timeout_s = 60);

  // Writes a replay spec and its table; returns the spec's path.
  std::string WriteReplaySpec(const std::string& name, const nlohmann::json& table,
                              const std::string& strategy = "exhaustive", double budget_gib = 10);
  // Submits and returns the search id (fails the test on error).
  std::string Submit(const std::string& spec_path, std::vector<std::string> extra_args = {});
  nlohmann::json Get(const std::string& id, std::vector<std::string> extra_args = {});
  // Polls `remat get` until `pred` holds; returns the last result (fails the test on timeout).
  nlohmann::json WaitFor(const std::string& id,
                         const std::function<bool(const nlohmann::json&)>& pred,
                         double timeout_s = 60, std::vector<std::string> extra_args = {});
  nlohmann::json WaitFinal(const std::string& id, double timeout_s = 60,
                           std::vector<std::string> extra_args = {});

  // The tails of every log, for a failing test.
  std::string LogTails() const;

 private:
  std::string dir_;
  int port_ = 0;
  int next_id_ = 0;
  std::vector<std::unique_ptr<Daemon>> daemons_;
};

// The spec every replay test uses (a tiny dense model: 12 valid policies).
search::SearchSpec TestModel();
// A replay table covering every valid policy of TestModel: memory and throughput vary with the
// policy and `seed`; a few entries are oom, `missing` of them are left out.
nlohmann::json MakeReplayTable(int seed, double wall_s, int missing = 0);
// The frontier the contract says a table gives, over the policies `ran` (canonical strings).
std::vector<std::string> ExpectedFrontier(const nlohmann::json& table,
                                          const std::vector<std::string>& ran, double budget_gib);

int FreePort();
// HTTP GET http://host:port/path; returns the body ("" on failure).
std::string HttpGet(int port, const std::string& path);

}  // namespace remat::integration
