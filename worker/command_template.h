// Operator-configured command templates for the `command` trial backend.
//
// Only templates from the worker's --command-templates file ever run; a search names one by
// search.command_template, never sends a command. The file is YAML, name -> template:
//
//   llama3-bridge:
//     command: >-
//       torchrun --nproc-per-node {nproc} /opt/recipes/pretrain_llama3.py
//       {overrides} train.train_iters={train_iters}
//     env: {PYTORCH_CUDA_ALLOC_CONF: "expandable_segments:True"}
//     workdir: /opt/recipes
//   plain: "bash /opt/jobs/run.sh {megatron_lm_flags}"   # a bare string is the command
//
// Placeholders (each substituted shell-quoted, one word per override/flag):
//   {overrides}          Megatron Bridge Hydra overrides of the policy
//   {megatron_lm_flags}  the Megatron-LM flags of the policy
//   {metrics_file}       where the job writes its metrics (format: worker/README.md)
//   {nproc}              number of ranks (the trial's world size)
//   {gpus}               comma-separated GPU indices of the trial's slots
//   {policy} {trial_id} {warmup_steps} {measure_steps} {train_iters} {micro_batch_size}
//   {seq_length}
// `${VAR}` is left to the shell. An unknown `{name}` is refused when the file is loaded.
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace remat::worker {

struct CommandTemplate {
  std::string name;
  std::string command;  // run with /bin/sh -c after substitution
  std::vector<std::pair<std::string, std::string>> env;
  std::string workdir;  // "" -> the trial's own folder
};

const std::vector<std::string>& CommandPlaceholders();

// InvalidArgument naming the template and key for a malformed file.
absl::StatusOr<std::map<std::string, CommandTemplate>> ParseCommandTemplatesYaml(
    const std::string& yaml_text);
absl::StatusOr<std::map<std::string, CommandTemplate>> LoadCommandTemplatesFile(
    const std::string& path);

// Single-quotes `word` for /bin/sh.
std::string ShellQuote(const std::string& word);
// Each space-separated word of `words`, shell-quoted, joined with spaces.
std::string ShellQuoteWords(const std::string& words);

// Replaces every known {placeholder} with values.at(name) (already quoted by the caller).
// InvalidArgument for an unknown placeholder or one missing from `values`.
absl::StatusOr<std::string> ExpandCommand(const std::string& command,
                                          const std::map<std::string, std::string>& values);

}  // namespace remat::worker
