// The `remat` command line: parses arguments (CLI11) and runs one subcommand.
//
//   plan SPEC [--json]                 what the guided search will try (cli/plan_validate.h)
//   validate SPEC --policy POLICY      exit 0 valid, 2 invalid with the reason
//   search SPEC [--json F] [--svg F]   embedded coordinator + local worker (cli/local_search.h)
//   submit SPEC                        prints the search id as its last line
//   get ID [--json] [--svg F] | watch ID [--svg F] | cancel ID | list
// Client commands take --coordinator HOST:PORT (or env REMAT_COORDINATOR), --token-file F (or
// env REMAT_TOKEN), --tls / --tls-ca F and --timeout S (deadline of each call).
//
// Flags and the environment are read here and nowhere else. Returns the process exit code
// (0 ok, 2 bad input, 1 other); errors go to stderr as one line starting with "error:".
//
// `remat search` embeds a coordinator and a worker; remat_cli links neither. The composition
// root (cli/remat_main.cc) hands RunCli the runner (RunLocalSearch of the remat_local_search
// library); without one, `remat search` is refused with exit 1.
#pragma once

#include <functional>
#include <ostream>

#include "cli/local_search_options.h"

namespace remat::cli {

using LocalSearchRunner =
    std::function<int(const LocalSearchOptions&, std::ostream& out, std::ostream& err)>;

int RunCli(int argc, char** argv, const LocalSearchRunner& local_search = nullptr);

}  // namespace remat::cli
