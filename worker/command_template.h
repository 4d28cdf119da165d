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
//   {global_batch_size} {seq_length}
// The run's memory budget, which the job enforces on each device (the Megatron Bridge callback
// does, worker/megatron_bridge/); 0 / 1 when the run has no cap (a depth-proxy run, below):
//   {memory_budget_bytes}  search.memory_budget_gib in bytes (also $REMAT_MEMORY_BUDGET_BYTES)
//   {memory_budget_gib}    the same as the spec writes it (shortest decimal, e.g. 70.5)
//   {memory_fraction}      the budget over the smallest GPU of the trial's slots, at most 1, for
//                          torch.cuda.set_per_process_memory_fraction; 1 on plain slots
// The run's layer count (with search.proxy_layers each trial runs the template once per proxy
// depth, in depth-<N>/, and predicts the full depth: search/depth_proxy.h):
//   {num_layers}            the layer count of this run (also $REMAT_NUM_LAYERS)
//   {num_layers_overrides}  Megatron Bridge overrides: model.num_layers=N, and with an explicit
//                           MoE layer pattern model.moe_layer_freq=[...] cut to N entries
//   {num_layers_flags}      the Megatron-LM flags: --num-layers N [--moe-layer-freq [...]]
// `${VAR}` is left to the shell. An unknown `{name}` is refused when the file is loaded.
// Thread-safety: pure functions.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "search/spec.h"
#include "worker/assignment.h"
#include "worker/slots.h"

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

// One run of a command trial's template: the whole trial, or one of its depth proxies.
struct CommandRun {
  const Assignment* assignment = nullptr;
  // The spec this run trains: the assignment's, or a proxy depth's (search::DepthRunSpec, which
  // has no memory cap: its budget placeholders are 0 and its fraction 1, search::MemoryCapped).
  const search::SearchSpec* spec = nullptr;
  std::vector<Slot> slots;  // the trial's, rank r on slots[r]
  std::string metrics_path;
};

// The value of every placeholder for `run`, each already quoted for the shell.
std::map<std::string, std::string> CommandValues(const CommandRun& run);

// Shortest decimal that reads back as `v` (70.5 -> "70.5", 80 -> "80").
std::string ShortestDecimal(double v);

}  // namespace remat::worker
