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
#pragma once

#include <atomic>
#include <ostream>
#include <string>

namespace remat::cli {

struct LocalSearchOptions {
  std::string spec_path;
  std::string json_path;          // "" = no JSON file
  std::string svg_path;           // "" = no SVG file
  std::string db_path;            // "" = a database in a temporary folder
  std::string gpus;               // as remat-worker --gpus; "" = every GPU
  std::string trial_binary;       // "" = remat-trial beside the running remat
  std::string command_templates;  // YAML file for backend command; "" = none
  std::string work_dir;           // "" = a temporary folder (removed afterwards)
  bool tty = false;               // progress as a redrawn bar instead of plain lines
  const std::atomic<bool>* interrupted = nullptr;  // set by a signal handler: cancel and stop
};

int RunLocalSearch(const LocalSearchOptions& options, std::ostream& out, std::ostream& err);

}  // namespace remat::cli
