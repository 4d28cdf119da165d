// What the programs' mains share: the error line and exit code, the folder of the running
// program, and SIGINT/SIGTERM (SIGHUP: reload) taken by one thread (reading a whole file:
// common/read_file.h).
// Standard library and POSIX only (no gRPC, no LibTorch), so every main can link it, remat-trial
// included.
#pragma once

#include <atomic>
#include <functional>
#include <string>
#include <thread>

#include "common/read_file.h"

namespace remat::common {

// Writes "error: MESSAGE" as one line to stderr and returns `code` (the contract's exit codes:
// 2 bad input naming the field, 1 anything else): `return Fail(2, "--db: must be set");`.
int Fail(int code, const std::string& message);

// Runs a main's body so that nothing ends the program with an abort and a core dump: an
// exception that escapes `body` (or any thread: the terminate handler is replaced) becomes one
// "error: internal error: ..." line and exit 1. Bad input never gets here (parsers return
// statuses, and mains exit 2 naming the field); this is the backstop.
//   int main(int argc, char** argv) {
//     return common::GuardedMain([&] { return Run(argc, argv); });
//   }
int GuardedMain(const std::function<int()>& body);

// "" when `value` is HOST:PORT ("[::1]:PORT" for IPv6; port 0 picks a free one), else the one-line
// reason naming `flag`, for the daemons' listen flags.
std::string HostPortProblem(const std::string& flag, const std::string& value);

// The folder of the running executable (from /proc/self/exe); "." when that cannot be read.
// Programs find their siblings there (remat-worker's remat-trial).
std::string SelfDir();

// SIGINT and SIGTERM (and, when asked, SIGHUP) taken by one thread. Construct it first thing in
// main, before any other thread starts: the constructor blocks the signals in the calling
// thread, so every thread started later inherits them blocked and only the waiter sees them;
// SIGPIPE is ignored (a closed socket or pipe is an error return, not the end of the program).
//
//   common::StopSignals signals(common::StopSignals::kReloadOnHangup);
//   ... start servers ...
//   signals.OnStop([&](int sig) { server->Shutdown(); }, [&] { server->Reload(); });
//   server->Wait();
//   signals.Finish();  // before what on_stop and on_reload use goes away
//
// Without kReloadOnHangup SIGHUP keeps its default action (a hang-up ends the program), as an
// interactive program's should.
//
// Thread-safety: construct, OnStop and destroy from one thread; the callbacks run on the waiter.
class StopSignals {
 public:
  enum Hangup { kHangupEnds, kReloadOnHangup };

  explicit StopSignals(Hangup hangup = kHangupEnds);
  ~StopSignals();  // Finish()

  // Stops waiting and joins the waiter: no callback runs after this returns (a signal that
  // comes later stays blocked). Idempotent.
  void Finish();

  // Starts the waiter: on the first SIGINT or SIGTERM it calls on_stop(signal) once, then ends.
  // With kReloadOnHangup, each SIGHUP before that calls on_reload (when given; a SIGHUP without
  // it is ignored). Call at most once.
  void OnStop(std::function<void(int)> on_stop, std::function<void()> on_reload = nullptr);

  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  bool take_hangup_;
  std::atomic<bool> done_{false};
  std::thread waiter_;
};

}  // namespace remat::common
