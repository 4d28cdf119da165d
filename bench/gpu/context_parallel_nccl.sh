#!/usr/bin/env bash
# The engine's context parallelism over NCCL, on a node with 2 GPUs: CP 2 for each cp_comm_type
# (p2p ring, a2a, allgather) against CP 1 of the same spec (fp32: loss and grad norm should agree
# within 1e-5 relative; CP 1 runs PyTorch's SDPA, CP 2 the engine's context-parallel attention),
# then CP 2 in bf16 with each rank's measured peak against the memory model's
# (search::EstimateMemory). Builds remat-trial and remat-bench-estimate against pip's torch
# (bench/gpu/build_engine.sh). Writes OUT_DIR/context_parallel.md and OUT_DIR/build.log.
#
#   bench/gpu/context_parallel_nccl.sh OUT_DIR
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${1:?OUT_DIR}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
bench/gpu/build_engine.sh build-gpu remat-bench-estimate > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
B=$ROOT/build-gpu/bin
SPEC=bench/engine/specs/pipeline-cpu.yaml
POLICIES=("selective:[]" "selective:[core_attn]" "full:uniform:1")
# One stage, 4 layers, 2 micro-batches; 4 heads in 4 groups so that a2a can split them.
BASE=(--set search.device=cuda --set parallel.pipeline_model_parallel_size=1
      --set model.num_layers=4 --set train.global_batch_size=2 --set model.num_query_groups=4
      --set model.attention_backend=flash)
{
  echo "# remat engine context parallelism over NCCL, $(date -u +%F) ($("$B/remat-trial" --version | tr '\n' ' '))"
  echo
  echo "## fp32, CP 1 (the reference)"
  python3 bench/engine/pipeline_peaks.py "$B" "$SPEC" "${POLICIES[@]}" "${BASE[@]}" \
    --set train.precision=fp32
  for type in p2p a2a allgather; do
    echo
    echo "## fp32, CP 2, $type: loss and grad norm as CP 1"
    python3 bench/engine/pipeline_peaks.py "$B" "$SPEC" "${POLICIES[@]}" "${BASE[@]}" \
      --set train.precision=fp32 --set parallel.context_parallel_size=2 \
      --set parallel.cp_comm_type=$type
    echo
    echo "## bf16, CP 2, $type: peaks against the memory model"
    python3 bench/engine/pipeline_peaks.py "$B" "$SPEC" "${POLICIES[@]}" "${BASE[@]}" \
      --set parallel.context_parallel_size=2 --set parallel.cp_comm_type=$type
  done
} 2>&1 | tee "$OUT/context_parallel.md"
