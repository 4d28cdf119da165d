// `remat search SPEC`: the one-command main job. Starts a coordinator (server/) and one worker
// daemon (worker/) inside this process, on loopback, submits the spec, shows progress, prints the
// result and writes the JSON / SVG files asked for.
//
// The worker offers this machine's GPUs when it has some (and the spec does not ask for the CPU),
// otherwise as many plain CPU slots as the spec's world size needs; it runs remat-trial from the
// folder of the running remat binary. The coordinator keeps its SQLite database in a temporary
// folder unless db_path is given.
//
// Returns the exit code: 0 when the search completed (also when nothing fits: the result says
// so), 2 for a bad spec (the message names the field), 1 for anything else (the search failed,
// was interrupted, or could not start). Writes the JSON whenever a search ran.
// Thread-safety: one call at a time per process (it owns the process's embedded services).
//
// Library remat_local_search (cli/CMakeLists.txt): the one place that composes the CLI with the
// coordinator (server/) and the worker (worker/); the `remat` main links it.
#pragma once

#include <ostream>

#include "cli/local_search_options.h"

namespace remat::cli {


int RunLocalSearch(const LocalSearchOptions& options, std::ostream& out, std::ostream& err);

}  // namespace remat::cli
