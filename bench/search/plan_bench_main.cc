// remat-plan-bench: what planning costs on the largest specs the limits accept
// (tests/search/largest_specs.h: every limit of search/limits.h at its maximum, together, in the
// layouts that cost most). For each spec and strategy it runs what a submit runs (ValidateSpec,
// MakeStrategy, PlannedTotal, the first proposals) and what `remat plan` adds (InitialPlan), in
// a child process of its own, and prints the wall time and the child's peak RSS.
//
//   remat-plan-bench [--max-ms N] [--max-mib N]
//
// Exits 1 when a spec is refused by ValidateSpec, or takes longer than --max-ms (default 100) or
// more than --max-mib (default 64) of peak RSS. docs/security.md records the figures.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "search/planner.h"
#include "search/spec.h"
#include "tests/search/largest_specs.h"

namespace {

using remat::search::SearchSpec;
using remat::search::StrategyKind;

// Runs in the child: plans `spec` and writes "ms" to `fd`. Exit 2 when the spec is refused.
int PlanOnce(const SearchSpec& spec, int fd) {
  const auto t0 = std::chrono::steady_clock::now();
  const remat::search::Status valid = remat::search::ValidateSpec(spec);
  if (!valid.ok()) {
    std::fprintf(stderr, "refused: %s\n", valid.message().c_str());
    return 2;
  }
  auto strategy = remat::search::MakeStrategy(spec);
  const int planned = strategy->PlannedTotal();
  const auto proposed = strategy->Propose(64);
  const auto plan = remat::search::InitialPlan(spec);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  char line[128];
  const int n = std::snprintf(line, sizeof(line), "%.2f %d %zu %zu", ms, planned, proposed.size(),
                              plan.size());
  return write(fd, line, static_cast<size_t>(n)) == n ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  double max_ms = 100, max_mib = 64;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--max-ms") == 0 && i + 1 < argc) {
      max_ms = std::atof(argv[++i]);
    } else if (std::strcmp(argv[i], "--max-mib") == 0 && i + 1 < argc) {
      max_mib = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: remat-plan-bench [--max-ms N] [--max-mib N]\n");
      return 2;
    }
  }
  bool all_ok = true;
  for (const auto& [name, base] : remat::search::testing::LargestSpecs()) {
    for (StrategyKind kind : {StrategyKind::kGuided, StrategyKind::kExhaustive}) {
      SearchSpec spec = base;
      spec.search.strategy = kind;
      int pipe_fd[2];
      if (pipe(pipe_fd) != 0) return 1;
      std::fflush(stdout);
      const pid_t pid = fork();
      if (pid == 0) {
        close(pipe_fd[0]);
        _exit(PlanOnce(spec, pipe_fd[1]));
      }
      close(pipe_fd[1]);
      char buf[128] = {};
      ssize_t got = 0, n = 0;
      while ((n = read(pipe_fd[0], buf + got, sizeof(buf) - 1 - got)) > 0) got += n;
      close(pipe_fd[0]);
      int status = 0;
      struct rusage usage {};
      wait4(pid, &status, 0, &usage);
      const double mib = usage.ru_maxrss / 1024.0;  // Linux: KiB
      const double cpu_ms = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1e3 +
                            (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e3;
      double ms = 0;
      int planned = 0;
      size_t proposed = 0, plan = 0;
      const bool ran = WIFEXITED(status) && WEXITSTATUS(status) == 0 &&
                       std::sscanf(buf, "%lf %d %zu %zu", &ms, &planned, &proposed, &plan) == 4;
      const bool ok = ran && ms <= max_ms && mib <= max_mib;
      all_ok = all_ok && ok;
      std::printf(
          "%-4s %-10s %8.2f ms (%.0f ms CPU) %6.1f MiB peak RSS  planned %d, proposed %zu,"
          " plan %zu  %s\n",
          ok ? "ok" : "OVER", remat::search::Name(kind), ms, cpu_ms, mib, planned, proposed, plan,
          name.c_str());
    }
  }
  return all_ok ? 0 : 1;
}
