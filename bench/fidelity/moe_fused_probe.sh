#!/usr/bin/env bash
# Why the MoE families miss with Megatron's fusions on (docs/fidelity.md, "Why the MoE families
# miss"): on one GPU, Megatron Core's allocated peak split by phase (peak_phases.py) for the
# sequential MoE family fused and unfused under the control (with what is live at its peak,
# from the allocator's history), core_attn and moe, the loss alone
# (native fused against unfused cross-entropy, with Inductor's generated code), and what one
# forward keeps (census.py, 2 layers) fused against unfused. All processes run at once (one
# policy per process; memory is read per process). About 1-2 minutes on one H200; nothing is
# built (Megatron Core's side only).
#
#   bench/fidelity/moe_fused_probe.sh [OUT_DIR]   # default $OUT; writes OUT_DIR/moefused-probe.tar.gz
#   env: REMAT_MEGATRON_PATH (default .carry/megatron-lm), REMAT_PROBE_TIMEOUT_S (default 200)
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT_DIR=${1:-${OUT:-$ROOT/build-gpu/moefused-probe-out}}
# The files are written outside OUT_DIR and only their tarball goes there (the GPU machine
# returns few files from OUT).
WORK=$(mktemp -d)
DIR="$WORK/moefused-probe"
mkdir -p "$DIR" "$OUT_DIR"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$ROOT/build-gpu/torch_extensions}
export TORCHINDUCTOR_COMPILE_THREADS=${TORCHINDUCTOR_COMPILE_THREADS:-2}
MEGATRON=${REMAT_MEGATRON_PATH:-$ROOT/.carry/megatron-lm}
if [ ! -d "$MEGATRON/megatron/core" ]; then
  echo "error: REMAT_MEGATRON_PATH: no megatron/core in $MEGATRON" >&2; exit 2
fi
T=${REMAT_PROBE_TIMEOUT_S:-200}
START=$(date +%s)
python3 -c 'import torch; print("pytorch=" + torch.__version__)' > "$DIR/versions.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$DIR/versions.txt" 2>&1

pids=()
# The loss alone, fused native against unfused, with Inductor's generated code (its buffers).
TORCH_LOGS=output_code timeout "$T" python3 bench/fidelity/peak_phases.py --megatron "$MEGATRON" \
  --family moe-seq-fused --cross-entropy > "$DIR/cross-entropy.txt" 2> "$DIR/cross-entropy.log" &
pids+=($!)
for fam in moe-seq-fused moe-seq; do
  for pol in 'selective:[]' 'selective:[core_attn]' 'selective:[moe]'; do
    tag="phases-$fam-$(echo "$pol" | tr -c 'a-z_\n' '_')"
    live=""
    [ "$pol" = 'selective:[]' ] && live=--live-at-peak  # the controls: what is live at the peak
    timeout "$T" python3 bench/fidelity/peak_phases.py --megatron "$MEGATRON" --family "$fam" \
      --policy "$pol" --steps 3 $live > "$DIR/$tag.txt" 2> "$DIR/$tag.log" &
    pids+=($!)
  done
  timeout "$T" python3 bench/fidelity/census.py --megatron "$MEGATRON" --family "$fam" \
    --layers 2 --policies 'selective:[];selective:[moe]' \
    > "$DIR/census-$fam.txt" 2> "$DIR/census-$fam.log" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
echo "== done in $(( $(date +%s) - START )) s (rc $rc)"
echo "-- cross-entropy.txt"; grep '^#' "$DIR/cross-entropy.txt" || tail -5 "$DIR/cross-entropy.log"
for f in "$DIR"/phases-*.txt; do
  echo "-- $(basename "$f")"; grep '^#' "$f" || tail -5 "${f%.txt}.log"
done
for f in "$DIR"/census-*.txt; do
  echo "-- $(basename "$f") (the groups: in the tarball)"; head -2 "$f"
done
tar -czf "$OUT_DIR/moefused-probe.tar.gz" -C "$WORK" moefused-probe
echo "== $OUT_DIR/moefused-probe.tar.gz ($(du -h "$OUT_DIR/moefused-probe.tar.gz" | cut -f1))"
exit $rc
