// Slots: what a worker offers the coordinator. A slot is one GPU (a trial rank runs on it with
// CUDA_VISIBLE_DEVICES set to its index) or a plain slot (a CPU rank) on machines without GPUs.
//
// Thread-safety: pure functions, except DiscoverGpus, which runs nvidia-smi (safe from any thread).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace remat::worker {

struct Slot {
  int index = 0;              // GPU index as nvidia-smi numbers it, or the plain slot's number
  std::string name;           // "NVIDIA H200", or "cpu-slot" for a plain slot
  uint64_t memory_bytes = 0;  // 0 for a plain slot
  bool gpu = false;
};

// Parses `nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader,nounits` output
// (memory in MiB). Returns InvalidArgument naming the bad line.
absl::StatusOr<std::vector<Slot>> ParseNvidiaSmiCsv(const std::string& text);

// The GPUs this machine has, from nvidia-smi; empty when nvidia-smi is absent or fails (a
// machine without GPUs is not an error).
std::vector<Slot> DiscoverGpus();

// Which slots to offer, given the GPUs found and the --gpus list ("" = default). With GPUs the
// list picks GPU indices (InvalidArgument "--gpus: ..." for an index not found); without GPUs
// it names plain slots (not checked). Default: every GPU, or one plain slot without GPUs.
absl::StatusOr<std::vector<Slot>> SelectSlots(const std::vector<Slot>& gpus,
                                              const std::string& gpus_flag);

// `count` plain slots numbered 0..count-1.
std::vector<Slot> PlainSlots(int count);

}  // namespace remat::worker
