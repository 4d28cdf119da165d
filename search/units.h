// Units: bytes per MiB and GiB, and the one conversion between gibibytes (the spec's unit for
// memory budgets) and bytes (every measurement's unit). Thread-safety: constants and pure
// functions.
#pragma once

#include <cstdint>

namespace remat::search {

inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// Whole bytes of `gib` gibibytes (truncated).
inline uint64_t GibToBytes(double gib) {
  return static_cast<uint64_t>(gib * static_cast<double>(kGiB));
}
inline double BytesToGib(double bytes) { return bytes / static_cast<double>(kGiB); }
inline double BytesToMib(double bytes) { return bytes / static_cast<double>(kMiB); }

}  // namespace remat::search
