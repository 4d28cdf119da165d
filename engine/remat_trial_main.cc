// remat-trial: runs one rank of one trial with the LibTorch engine.
//
//   remat-trial --request FILE --result FILE     binary remat.v1.TrialRequest in, TrialResult out
//   remat-trial --spec FILE.yaml --policy STR [--rank R --world-size W --rendezvous DIR]
//               [--collective-timeout S] [--json]   developer mode: prints the result
//   remat-trial --spec FILE.yaml --policy STR --stand-in --rank R [--world-size W] [--json]
//               rank R of the spec's layout alone, with stand-in collectives (a layout proxy's
//               role): prints its result, and without --json its collectives per step
//   remat-trial --version                        versions, one key=value per line
//
// Exit codes: 0 whenever a result was produced (an OOM or an invalid policy included), 2 bad input
// (the message names the argument or field), 1 anything else.

#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>

#include "common/main_util.h"
#include "proto/convert.h"
#include "search/policy.h"
#include "search/spec.h"
#include "search/trial.h"
#include "specfile/spec_file.h"
#include "engine/result_json.h"
#include "engine/trial_runner.h"

namespace {

using Clock = std::chrono::steady_clock;

// A crash (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) prints its signal and the stack to stderr,
// which the worker puts in the failed trial's reason, leaves the rendezvous marker that tells the
// other ranks to give up now rather than at their collective timeout (the file a failed rank
// writes, engine/README.md), then dies of the same signal. Only async-signal-safe calls
// (open, write, backtrace_symbols_fd) after the first backtrace(), which is made in advance so
// that libgcc is already loaded.
char g_left_marker[4096];  // "<rendezvous>/left-<rank>", empty with one rank

void OnFatalSignal(int sig) {
  if (g_left_marker[0] != '\0') {
    const int fd = open(g_left_marker, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      (void)!write(fd, "crashed\n", 8);
      close(fd);
    }
  }
  char line[96];
  const int n = snprintf(line, sizeof(line), "remat-trial: fatal signal %d (%s); stack:\n", sig,
                         sig == SIGSEGV ? "segmentation fault" : sig == SIGABRT ? "abort" : "crash");
  if (n > 0) (void)!write(STDERR_FILENO, line, static_cast<size_t>(n));
  void* frames[64];
  const int depth = backtrace(frames, 64);
  backtrace_symbols_fd(frames, depth, STDERR_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallCrashReporter() {
  void* warm[1];
  (void)backtrace(warm, 1);
  struct sigaction sa {};
  sa.sa_handler = OnFatalSignal;
  sa.sa_flags = SA_RESETHAND;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) sigaction(sig, &sa, nullptr);
}

using remat::common::Fail;

constexpr const char* kUsage =
    "usage: remat-trial --request FILE --result FILE\n"
    "       remat-trial --spec FILE.yaml --policy POLICY [--rank R --world-size W --rendezvous DIR]\n"
    "                   [--collective-timeout SECONDS] [--json]\n"
    "       remat-trial --spec FILE.yaml --policy POLICY --stand-in --rank R [--world-size W]\n"
    "                   [--json]\n"
    "       remat-trial --version\n";

std::optional<int> ParseInt(const std::string& s) {
  try {
    size_t used = 0;
    int v = std::stoi(s, &used);
    if (used == s.size()) return v;
  } catch (...) {
  }
  return std::nullopt;
}

// The command line: flags with a value in `values`, the switches by name.
struct Args {
  std::map<std::string, std::string> values;
  bool json = false, version = false, stand_in = false;
  bool Has(const char* flag) const { return values.count(flag) > 0; }
  const std::string& operator[](const char* flag) const { return values.at(flag); }
};

// Reads the command line; an exit code when that is all there is to do (help, a bad argument).
std::optional<int> ParseArgs(int argc, char** argv, Args& args) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      args.json = true;
    } else if (a == "--version") {
      args.version = true;
    } else if (a == "--stand-in") {
      args.stand_in = true;
    } else if (a == "--help" || a == "-h") {
      std::cout << kUsage;
      return 0;
    } else if (a.rfind("--", 0) == 0 && i + 1 < argc) {
      args.values[a] = argv[++i];
    } else {
      return Fail(2, "unexpected argument '" + a + "'\n" + kUsage);
    }
  }
  return std::nullopt;
}

// The trial of a binary remat.v1.TrialRequest (--request). 0, or the exit code.
int OptionsFromRequest(const Args& args, remat::engine::TrialOptions& options) {
  if (!args.Has("--result")) return Fail(2, "--result: required with --request");
  std::ifstream in(args["--request"], std::ios::binary);
  if (!in) return Fail(2, "--request: cannot read " + args["--request"]);
  remat::v1::TrialRequest request;
  if (!request.ParseFromIstream(&in)) {
    return Fail(2, "--request: " + args["--request"] + " is not a remat.v1.TrialRequest");
  }
  auto spec = remat::proto::FromProto(request.spec());
  if (!spec.ok()) return Fail(2, "request.spec: " + spec.status().message());
  remat::search::Status valid = remat::search::ValidateSpec(*spec);
  if (!valid.ok()) return Fail(2, "request.spec: " + valid.message());
  auto policy = remat::search::ParsePolicy(request.policy().canonical());
  if (!policy.ok()) return Fail(2, "request.policy: " + policy.status().message());
  options.spec = *spec;
  options.policy = *policy;
  options.rank = request.rank();
  options.world_size = request.world_size() > 0 ? request.world_size() : 1;
  options.rendezvous_dir = request.rendezvous_dir();
  if (request.collective_timeout_s() > 0) {
    options.collective_timeout_s = request.collective_timeout_s();
  }
  return 0;
}

// The developer mode's trial: a YAML spec, a policy, and optionally this process's rank, the
// world size and the rendezvous folder. 0, or the exit code.
int OptionsFromSpecFile(const Args& args, remat::engine::TrialOptions& options) {
  if (!args.Has("--spec")) return Fail(2, std::string("--spec or --request is required\n") + kUsage);
  if (!args.Has("--policy")) return Fail(2, "--policy: required with --spec");
  auto spec = remat::spec::LoadSpecFile(args["--spec"]);
  if (!spec.ok()) return Fail(2, spec.status().message());
  auto policy = remat::search::ParsePolicy(args["--policy"]);
  if (!policy.ok()) return Fail(2, "--policy: " + policy.status().message());
  options.spec = *spec;
  options.policy = *policy;
  options.world_size = options.spec.parallel.WorldSize();
  for (const char* flag : {"--rank", "--world-size"}) {
    if (!args.Has(flag)) continue;
    auto v = ParseInt(args[flag]);
    if (!v || *v < 0) return Fail(2, std::string(flag) + ": must be a non-negative integer");
    (std::string(flag) == "--rank" ? options.rank : options.world_size) = *v;
  }
  if (args.Has("--rendezvous")) {
    options.rendezvous_dir = args["--rendezvous"];
    std::error_code ec;
    std::filesystem::create_directories(options.rendezvous_dir, ec);
    if (ec) return Fail(2, "--rendezvous: cannot create " + options.rendezvous_dir);
  }
  return 0;
}

// --stand-in runs one rank of the spec's own layout alone. 0, or the exit code.
int CheckStandIn(const Args& args, bool request_mode, const remat::engine::TrialOptions& options) {
  if (request_mode) return Fail(2, "--stand-in: a developer flag, not for --request");
  if (args.Has("--rendezvous")) return Fail(2, "--stand-in: runs alone, without --rendezvous");
  if (!args.Has("--rank")) return Fail(2, "--stand-in: needs --rank");
  if (options.world_size != options.spec.parallel.WorldSize() ||
      options.rank >= options.world_size) {
    return Fail(2, "--world-size: the spec's layout has " +
                       std::to_string(options.spec.parallel.WorldSize()) + " ranks");
  }
  return 0;
}

// Writes the binary remat.v1.TrialResult to `path` (through a temporary file, renamed).
int WriteResultFile(const std::string& path, const remat::search::TrialResult& result) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !remat::proto::ToProto(result).SerializeToOstream(&out)) {
      return Fail(1, "cannot write the result to " + tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    return Fail(1, "cannot write the result to " + path);
  }
  return 0;
}

// The developer mode's one line of result; a stand-in rank's step parts and collectives after it.
void PrintResult(const remat::search::TrialResult& result,
                 const remat::search::RoleMeasurement* stand_in) {
  std::cout << result.policy.ToString() << ": " << remat::search::Name(result.status);
  if (!result.ranks.empty()) {
    const auto& k = result.ranks[0];
    std::cout << "  peak " << k.peak_allocated_bytes / 1048576.0 << " MiB allocated, "
              << k.peak_reserved_bytes / 1048576.0 << " MiB reserved";
  }
  if (result.status == remat::search::TrialStatus::kOk) {
    std::cout << "  step " << result.step_time_s << " s, " << result.tokens_per_s
              << " tokens/s, " << result.model_tflops << " TFLOP/s, loss " << result.loss
              << ", grad norm " << result.grad_norm;
  }
  if (!result.message.empty()) std::cout << "  (" << result.message << ")";
  std::cout << std::endl;
  if (stand_in != nullptr && result.status == remat::search::TrialStatus::kOk) {
    const remat::search::RoleMeasurement& role = *stand_in;
    std::cout << "stand-in rank " << role.role.rank << " (pipeline rank " << role.role.pp_rank
              << "): forward/backward " << role.schedule_s << " s, optimizer "
              << role.optimizer_s << " s per step\n";
    static const char* kKinds[] = {"all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                                   "send/recv"};
    for (const remat::search::CommRecord& r : role.comm) {
      std::cout << "  " << r.group << " " << kKinds[static_cast<int>(r.kind)] << ": " << r.calls
                << " calls, " << r.bytes << " bytes per step, ranks";
      for (int k : r.ranks) std::cout << " " << k;
      std::cout << "\n";
    }
  }
}

}  // namespace

static int RealMain(int argc, char** argv) {
  const auto process_start = Clock::now();
  InstallCrashReporter();
  Args args;
  if (std::optional<int> code = ParseArgs(argc, argv, args)) return *code;
  if (args.version) {
    for (const auto& [key, value] : remat::engine::EngineVersions()) {
      std::cout << key << "=" << value << "\n";
    }
    return 0;
  }

  remat::engine::TrialOptions options;
  const bool request_mode = args.Has("--request");
  if (int code = request_mode ? OptionsFromRequest(args, options)
                              : OptionsFromSpecFile(args, options);
      code != 0) {
    return code;
  }
  if (args.Has("--collective-timeout")) {
    try {
      options.collective_timeout_s = std::stod(args["--collective-timeout"]);
    } catch (...) {
      return Fail(2, "--collective-timeout: must be a number of seconds");
    }
    if (options.collective_timeout_s <= 0) return Fail(2, "--collective-timeout: must be positive");
  }

  // A test switch, not a product setting: CPU ranks check a schedule against NCCL's semantics.
  options.nccl_point_to_point = std::getenv("REMAT_TCP_NCCL_P2P") != nullptr;

  if (options.world_size > 1 && !options.rendezvous_dir.empty()) {
    const std::string marker = options.rendezvous_dir + "/left-" + std::to_string(options.rank);
    if (marker.size() < sizeof(g_left_marker)) {
      std::copy(marker.begin(), marker.end(), g_left_marker);
      g_left_marker[marker.size()] = '\0';
    }
  }
  if (args.stand_in) {
    if (int code = CheckStandIn(args, request_mode, options); code != 0) return code;
  }
  // The spec's allocator settings, before LibTorch's CUDA allocator reads them at its first use;
  // a value the launcher put in the environment stands (the worker sets the same one).
  if (!options.spec.search.allocator_conf.empty() && std::getenv("PYTORCH_CUDA_ALLOC_CONF") == nullptr) {
    setenv("PYTORCH_CUDA_ALLOC_CONF", options.spec.search.allocator_conf.c_str(), 1);
  }
  const double before_trial_s = std::chrono::duration<double>(Clock::now() - process_start).count();
  remat::search::RoleMeasurement role;
  if (args.stand_in) role = remat::engine::RunStandInRank(options);
  remat::search::TrialResult result =
      args.stand_in ? role.result : remat::engine::RunTrial(options);
  result.setup_s += before_trial_s;  // process start and argument handling count as set-up
  result.wall_s = std::chrono::duration<double>(Clock::now() - process_start).count();

  if (request_mode) return WriteResultFile(args["--result"], result);
  if (args.json) {
    std::cout << remat::engine::TrialResultJson(result) << std::endl;
  } else {
    PrintResult(result, args.stand_in ? &role : nullptr);
  }
  return 0;
}

int main(int argc, char** argv) {
  return remat::common::GuardedMain([&] { return RealMain(argc, argv); });
}
