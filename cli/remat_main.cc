// remat: the user's command line, and its composition root: the CLI (remat_cli) with the
// embedded coordinator and worker of `remat search` (remat_local_search, which links server/ and
// worker/). Nothing else composes them.
#include "cli/commands.h"
#include "cli/local_search.h"
#include "common/main_util.h"

int main(int argc, char** argv) {
  return remat::common::GuardedMain(
      [&] { return remat::cli::RunCli(argc, argv, remat::cli::RunLocalSearch); });
}
