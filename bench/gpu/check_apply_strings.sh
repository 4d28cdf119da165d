#!/usr/bin/env bash
# On the GPU machine: every valid policy's apply strings (as remat prints them),
# applied over recipes that already set recompute, must give a Megatron Core TransformerConfig
# that accepts them and says exactly the policy (bench/gpu/check_apply_strings.py says how).
#
#   bench/gpu/check_apply_strings.sh [OUT_DIR]    # default $OUT, else build-gpu/apply-check
#   env: REMAT_MEGATRON_PATH (default .carry/megatron-lm: a folder holding megatron/core),
#        REMAT_APPLY_FAMILIES (default dense,mla,moe-seq,moe-grouped)
# Builds remat-bench-estimate (bench/gpu/build_engine.sh: the pip LibTorch, no gRPC), then checks;
# writes OUT_DIR/apply-check.md (printed last), apply-check.jsonl, the specs, build.log. Needs
# torch and Megatron Core on the machine; no GPU time beyond the build (about a minute in all).
# Exit 0 only when every row is as expected.
set -uo pipefail
START=$(date +%s)
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT_DIR=${1:-${OUT:-$ROOT/build-gpu/apply-check}}
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE=0  # NVLink multicast can take a shared host's GPUs out of service
MEGATRON=${REMAT_MEGATRON_PATH:-$ROOT/.carry/megatron-lm}
if [ ! -d "$MEGATRON/megatron/core" ]; then
  echo "error: REMAT_MEGATRON_PATH: no megatron/core in $MEGATRON" >&2; exit 2
fi
if ! bench/gpu/build_engine.sh build-gpu remat-bench-estimate > "$OUT_DIR/build.log" 2>&1; then
  tail -30 "$OUT_DIR/build.log"; exit 1
fi
echo "built in $(( $(date +%s) - START )) s"
python3 -c 'import torch; print("pytorch=" + torch.__version__)' | tee "$OUT_DIR/versions.txt"
python3 bench/gpu/check_apply_strings.py --estimate build-gpu/bin/remat-bench-estimate \
  --megatron-path "$MEGATRON" --out "$OUT_DIR" \
  --families "${REMAT_APPLY_FAMILIES:-dense,mla,moe-seq,moe-grouped}" 2>&1 | tee "$OUT_DIR/check.log"
rc=${PIPESTATUS[0]}
echo "== done in $(( $(date +%s) - START )) s (exit $rc)"
exit "$rc"
