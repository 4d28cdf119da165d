#!/usr/bin/env bash
# On one GPU: guided searches with `search.backend: megatron` (Megatron Core's own model
# and step) through rematd + remat-worker + the remat CLI, for one dense and one MoE model
# (examples/gpu/megatron-dense.yaml, megatron-moe.yaml). Writes each search's text, JSON and SVG
# and the daemons' logs to OUT_DIR.
#
#   bench/gpu/pack_service.sh build .carry/svc               # here, where gRPC exists
#   bench/gpu/megatron_search.sh OUT_DIR [SVC_DIR] [MEGATRON_DIR] [MODELS]   # on the GPU node
# SVC_DIR defaults to .carry/svc, MEGATRON_DIR to .carry/megatron-lm (a folder holding
# megatron/core), MODELS to "dense moe". Nothing is installed on the GPU node.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 1
OUT=${1:?OUT_DIR}; SVC=${2:-$ROOT/.carry/svc}; MEGATRON=${3:-$ROOT/.carry/megatron-lm}
MODELS=${4:-dense moe}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$ROOT/build-gpu/torch_extensions}
svc() { local b=$1; shift; LD_LIBRARY_PATH="$SVC/lib" "$SVC/bin/$b" "$@"; }
ADDR=127.0.0.1:50061
svc rematd --listen $ADDR --db "$OUT/remat.db" > "$OUT/rematd.log" 2>&1 &
RD=$!
svc remat-worker --coordinator $ADDR --megatron-path "$MEGATRON" --python "$(command -v python3)" \
  --work-dir /tmp/remat-megatron-work --keep-trial-dirs --log-level info > "$OUT/worker.log" 2>&1 &
WK=$!
trap 'kill $WK $RD 2>/dev/null; wait 2>/dev/null' EXIT
sleep 2
for m in $MODELS; do
  spec=examples/gpu/megatron-$m.yaml
  id=$(svc remat submit "$spec" --coordinator $ADDR | tail -1) || { echo "submit $m failed"; continue; }
  svc remat watch "$id" --coordinator $ADDR > "$OUT/$m.watch.txt" 2>&1
  svc remat get "$id" --coordinator $ADDR --json > "$OUT/$m.json"
  svc remat get "$id" --coordinator $ADDR --svg "$OUT/$m.svg" > "$OUT/$m.txt"
  echo "== megatron-$m ($id)"; cat "$OUT/$m.txt"
done
# Each trial's driver logs (the shims it used, Megatron's warnings), for the record.
tar -czf "$OUT/trial-logs.tgz" -C /tmp remat-megatron-work/trials 2>/dev/null || true
