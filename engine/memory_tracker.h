// Memory measurement and the memory budget of one trial.
//
// CPU: a counting allocator wraps LibTorch's CPU allocator (installed once per process, on first
// use). It tracks current and peak bytes and fails any allocation that would take the total past
// the budget, with c10::OutOfMemoryError, remembering the failing request's size. There is no
// caching allocator on CPU: reserved = allocated.
// CUDA (REMAT_WITH_CUDA): reads the caching allocator's statistics and caps the allocator's share
// of the device at the budget (setMemoryFraction), so one large GPU can stand in for a smaller one.
//
// Thread-safety: Stats() and FailedRequestBytes() may be called from any thread; Start() and
// Stop() from one thread, while no trial runs.
#pragma once

#include <cstdint>
#include <memory>

namespace remat::engine {

struct MemoryStats {
  uint64_t current_allocated_bytes = 0;
  uint64_t peak_allocated_bytes = 0;
  uint64_t peak_reserved_bytes = 0;
  uint64_t alloc_retries = 0;
};

class MemoryTracker {
 public:
  virtual ~MemoryTracker() = default;
  // Resets the peaks to the current use and enforces `budget_bytes` from now on.
  virtual void Start(uint64_t budget_bytes) = 0;
  // Lifts the budget (peaks are kept until the next Start).
  virtual void Stop() = 0;
  virtual MemoryStats Stats() const = 0;
  // Size of the first allocation refused since Start (0 if none).
  virtual uint64_t FailedRequestBytes() const = 0;
};

// The process's CPU tracker (installs the counting allocator on the first call).
MemoryTracker* CpuMemoryTracker();

#ifdef REMAT_WITH_CUDA
// A tracker of the caching allocator on CUDA device `device`.
std::unique_ptr<MemoryTracker> NewCudaMemoryTracker(int device);
#endif

}  // namespace remat::engine
