#include "engine/memory_tracker.h"

#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>

#ifdef REMAT_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace remat::engine {
namespace {

// Counts every CPU allocation LibTorch makes and refuses those past the budget. It allocates
// itself (64-byte aligned, a header before each block holding its size), so that the DataPtr's
// context is the data pointer and raw_allocate/raw_deleter work as with LibTorch's default.
class CountingCpuAllocator final : public c10::Allocator {
 public:
  static constexpr size_t kHeader = 64;  // keeps the data 64-byte aligned, as c10's gAlignment

  // LibTorch 1.x declares allocate() const, 2.3 and later non-const: define both (no override
  // keyword), and whichever the base declares is overridden.
  c10::DataPtr allocate(size_t n) const { return Allocate(n); }
  c10::DataPtr allocate(size_t n) { return Allocate(n); }

  c10::DataPtr Allocate(size_t n) const {
    const uint64_t before = current_.fetch_add(n);
    const uint64_t now = before + n;
    if (now > budget_.load()) {
      current_.fetch_sub(n);
      uint64_t expected = 0;
      failed_request_.compare_exchange_strong(expected, n);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory (remat budget): tried to allocate ",
                       n, " bytes with ", before, " bytes in use and a budget of ", budget_.load(),
                       " bytes");
    }
    uint64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    void* base = nullptr;
    if (::posix_memalign(&base, kHeader, n + kHeader) != 0 || base == nullptr) {
      current_.fetch_sub(n);
      TORCH_CHECK_WITH(OutOfMemoryError, false, "CPU out of memory: the system refused ", n,
                       " bytes");
    }
    *static_cast<uint64_t*>(base) = n;
    void* data = static_cast<char*>(base) + kHeader;
    return c10::DataPtr(data, data, &Release, c10::Device(c10::DeviceType::CPU));
  }

  c10::DeleterFnPtr raw_deleter() const override { return &Release; }

  // LibTorch 2.x declares this pure virtual; 1.13 has no such member (then it is a plain method).
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  void Start(uint64_t budget) {
    budget_.store(budget);
    peak_.store(current_.load());
    failed_request_.store(0);
  }
  void Stop() { budget_.store(std::numeric_limits<uint64_t>::max()); }
  uint64_t current() const { return current_.load(); }
  uint64_t peak() const { return peak_.load(); }
  uint64_t failed_request() const { return failed_request_.load(); }

 private:
  static void Release(void* data) {
    if (data == nullptr) return;
    void* base = static_cast<char*>(data) - kHeader;
    current_.fetch_sub(*static_cast<uint64_t*>(base));
    std::free(base);
  }

  // One allocator per process: the counters are static so the deleter needs no context.
  static inline std::atomic<uint64_t> current_{0};
  static inline std::atomic<uint64_t> peak_{0};
  static inline std::atomic<uint64_t> failed_request_{0};
  static inline std::atomic<uint64_t> budget_{std::numeric_limits<uint64_t>::max()};
};

class CpuTracker final : public MemoryTracker {
 public:
  CpuTracker() {
    // A priority above the default's so LibTorch hands every CPU tensor to the counting wrapper.
    c10::SetCPUAllocator(&allocator_, /*priority=*/100);
  }
  void Start(uint64_t budget_bytes) override { allocator_.Start(budget_bytes); }
  void Stop() override { allocator_.Stop(); }
  MemoryStats Stats() const override {
    MemoryStats s;
    s.current_allocated_bytes = allocator_.current();
    s.peak_allocated_bytes = allocator_.peak();
    s.peak_reserved_bytes = s.peak_allocated_bytes;
    return s;
  }
  uint64_t FailedRequestBytes() const override { return allocator_.failed_request(); }

 private:
  CountingCpuAllocator allocator_;
};

#ifdef REMAT_WITH_CUDA
// The caching allocator reports an out-of-memory to observers with the size it tried to get.
std::atomic<uint64_t> g_cuda_failed_request{0};
std::once_flag g_cuda_observer_once;

class CudaTracker final : public MemoryTracker {
 public:
  explicit CudaTracker(int device) : device_(static_cast<c10::DeviceIndex>(device)) {
    std::call_once(g_cuda_observer_once, [] {
      c10::cuda::CUDACachingAllocator::attachOutOfMemoryObserver(
          [](auto /*device*/, auto requested, auto /*total*/, auto /*free*/) {
            uint64_t expected = 0;
            g_cuda_failed_request.compare_exchange_strong(expected,
                                                          static_cast<uint64_t>(requested));
          });
    });
  }

  void Start(uint64_t budget_bytes) override {
    namespace alloc = c10::cuda::CUDACachingAllocator;
    alloc::emptyCache();
    size_t free_bytes = 0, total_bytes = 0;
    cudaSetDevice(device_);
    cudaMemGetInfo(&free_bytes, &total_bytes);
    const double fraction =
        std::min(1.0, static_cast<double>(budget_bytes) / static_cast<double>(total_bytes));
    alloc::setMemoryFraction(fraction, device_);
    alloc::resetPeakStats(device_);
    alloc::resetAccumulatedStats(device_);
    g_cuda_failed_request.store(0);
  }
  void Stop() override { c10::cuda::CUDACachingAllocator::setMemoryFraction(1.0, device_); }
  MemoryStats Stats() const override {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device_);
    MemoryStats s;
    s.current_allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes[0].current);  // AGGREGATE
    s.peak_allocated_bytes = static_cast<uint64_t>(stats.allocated_bytes[0].peak);
    s.peak_reserved_bytes = static_cast<uint64_t>(stats.reserved_bytes[0].peak);
    s.alloc_retries = static_cast<uint64_t>(stats.num_alloc_retries);
    return s;
  }
  uint64_t FailedRequestBytes() const override { return g_cuda_failed_request.load(); }

 private:
  c10::DeviceIndex device_;
};
#endif

}  // namespace

MemoryTracker* CpuMemoryTracker() {
  static CpuTracker* tracker = new CpuTracker();  // lives as long as the process: tensors outlive trials
  return tracker;
}

#ifdef REMAT_WITH_CUDA
std::unique_ptr<MemoryTracker> NewCudaMemoryTracker(int device) {
  return std::make_unique<CudaTracker>(device);
}
#endif

}  // namespace remat::engine
