// What `remat search SPEC` was asked to do (filled from flags by cli/commands.cc, run by
// RunLocalSearch in cli/local_search.h). A plain struct; no dependency on the services.
#pragma once

#include <atomic>
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
  std::string megatron_path;      // backend megatron: a folder holding megatron/core; "" = installed
  std::string python = "python3"; // backend megatron: the Python (with torch) for the driver
  std::string work_dir;           // "" = a temporary folder (removed afterwards)
  bool tty = false;               // progress as a redrawn bar instead of plain lines
  const std::atomic<bool>* interrupted = nullptr;  // set by a signal handler: cancel and stop
};

}  // namespace remat::cli
