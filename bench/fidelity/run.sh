#!/usr/bin/env bash
# The fidelity bench on one GPU (bench/fidelity/README.md): builds remat-trial and the bench
# programs against the pip torch (bench/gpu/build_engine.sh), then runs every policy of four model
# families with the builtin engine and with Megatron Core (the megatron backend's driver code),
# and writes the comparison table. Everything, build included, within REMAT_FIDELITY_BUDGET_S
# (default 470 s): what does not fit is marked "not run" / "skipped".
#
#   bench/fidelity/run.sh [OUT_DIR]     # default $OUT, else build-gpu/fidelity-out
#   env: REMAT_MEGATRON_PATH (default .carry/megatron-lm: a folder holding megatron/core),
#        REMAT_FIDELITY_FAMILIES (default dense,mla,moe-seq,moe-grouped; also moe-seq-2l and
#        moe-seq-6l, the sequential MoE at 2 and 6 layers, mla-fused-2l and mla-fused-6l, and
#        the fused families dense-fused,moe-seq-fused,moe-grouped-fused,mla-fused: Megatron's
#        non-TE fusions and bf16 gradients on both sides, about 5 minutes with
#        REMAT_FIDELITY_BUDGET_S=330),
#        REMAT_FIDELITY_POLICIES (only these policies of each family, ';'-separated)
# Writes OUT_DIR/fidelity.md (the table; bench/fidelity/to_doc.py turns fidelity.json into
# docs/fidelity.md), fidelity.json, the specs, engine.jsonl/.log, megatron.jsonl/.log, build.log.
set -uo pipefail
START=$(date +%s)
BUDGET=${REMAT_FIDELITY_BUDGET_S:-470}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT_DIR=${1:-${OUT:-$ROOT/build-gpu/fidelity-out}}
mkdir -p "$OUT_DIR"
export NCCL_NVLS_ENABLE=0  # NVLink multicast can take a shared host's GPUs out of service
export PYTHONUNBUFFERED=1
MEGATRON=${REMAT_MEGATRON_PATH:-$ROOT/.carry/megatron-lm}
if [ ! -d "$MEGATRON/megatron/core" ]; then
  echo "error: REMAT_MEGATRON_PATH: no megatron/core in $MEGATRON" >&2; exit 2
fi
# CheckpointWithoutOutput's load_inline extension: built once per machine, kept with the build.
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$ROOT/build-gpu/torch_extensions}

echo "== build ($(date -u +%H:%M:%S))"
if ! bench/gpu/build_engine.sh build-gpu remat-bench-engine remat-bench-estimate \
    > "$OUT_DIR/build.log" 2>&1; then
  tail -30 "$OUT_DIR/build.log"; exit 1
fi
echo "built in $(( $(date +%s) - START )) s"
python3 -c 'import torch; print("pytorch=" + torch.__version__)' | tee "$OUT_DIR/versions.txt"
cat "$MEGATRON/REMAT_COMMIT" 2>/dev/null | sed 's/^/megatron_commit=/' | tee -a "$OUT_DIR/versions.txt"

rev=$(git rev-parse --short HEAD 2>/dev/null || echo '?')
export REMAT_FIDELITY_COMMAND="bench/fidelity/run.sh (remat $rev)"
python3 bench/fidelity/fidelity.py --build build-gpu --megatron "$MEGATRON" --out "$OUT_DIR" \
  --deadline $(( START + BUDGET - 10 )) \
  --families "${REMAT_FIDELITY_FAMILIES:-dense,mla,moe-seq,moe-grouped}" \
  --policies "${REMAT_FIDELITY_POLICIES:-}"
rc=$?
echo "== done in $(( $(date +%s) - START )) s; table: $OUT_DIR/fidelity.md"
# The tables' rows (and the fused families' controls against the unfused ones).
[ -f "$OUT_DIR/fidelity.md" ] && grep -E '^(## |Control |\| `|\| [a-z-]+-fused \|)' "$OUT_DIR/fidelity.md" | cut -c1-200
# A Megatron Core side that broke: its first traceback, so one run says why.
if grep -q '"status": "failed"' "$OUT_DIR/megatron.jsonl" 2>/dev/null; then
  echo "== Megatron Core failures: first traceback in megatron.log"
  grep -m1 -A25 Traceback "$OUT_DIR/megatron.log" | head -30
fi
exit $rc
