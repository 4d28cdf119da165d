#include "search/context_parallel_memory.h"

namespace remat::search {

double ContextParallelAttentionExtraWidth(const SearchSpec& spec, double q, double k, double v,
                                          double out, double given) {
  if (spec.parallel.context_parallel_size <= 1) return 0;
  switch (spec.parallel.cp_comm_type) {
    case CpCommType::kP2p:
      return q + k + v - given;
    case CpCommType::kA2a:
    case CpCommType::kA2aP2p:
      return q + k + v + out - given;
    case CpCommType::kAllGather:
      return 0;
  }
  return 0;
}

}  // namespace remat::search
