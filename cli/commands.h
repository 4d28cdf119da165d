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
#pragma once

namespace remat::cli {

int RunCli(int argc, char** argv);

}  // namespace remat::cli
