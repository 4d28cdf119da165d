#!/usr/bin/env bash
# The engine's pipeline parallelism over NCCL, on a node with 2 GPUs: PP 2 under
# 1F1B against PP 1 of the same spec and global batch (fp32: loss and grad norm should agree
# within 1e-5 relative), then PP 2 in bf16 with every stage's measured peak against the memory
# model's (search::EstimateMemory). Builds remat-trial and remat-bench-estimate against pip's
# torch (bench/gpu/build_engine.sh). Writes OUT_DIR/pipeline.md (the tables) and OUT_DIR/build.log.
#
#   bench/gpu/pipeline_nccl.sh OUT_DIR
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
{
  echo "# remat engine pipeline over NCCL, $(date -u +%F) ($("$B/remat-trial" --version | tr '\n' ' '))"
  echo
  echo "## fp32, PP 1 (the reference)"
  python3 bench/engine/pipeline_peaks.py "$B" "$SPEC" "${POLICIES[@]}" --set search.device=cuda \
    --set train.precision=fp32 --set parallel.pipeline_model_parallel_size=1
  echo
  echo "## fp32, PP 2 (1F1B): loss and grad norm as PP 1"
  python3 bench/engine/pipeline_peaks.py "$B" "$SPEC" "${POLICIES[@]}" --set search.device=cuda \
    --set train.precision=fp32 --set parallel.pipeline_model_parallel_size=2
  echo
  echo "## bf16, PP 2 (1F1B), tied embeddings: stage peaks against the memory model"
  python3 bench/engine/pipeline_peaks.py "$B" "$SPEC" "${POLICIES[@]}" --set search.device=cuda \
    --set parallel.pipeline_model_parallel_size=2 --set model.share_embeddings_and_output_weights=true
} 2>&1 | tee "$OUT/pipeline.md"
