#!/usr/bin/env bash
# A guided search of a big layout with layout proxies on ONE GPU, through rematd + remat-worker +
# the remat CLI: default examples/large/llama3-70b-proxy-search.yaml.
#   bench/gpu/pack_service.sh build .carry/svc          # here, where gRPC exists
#   bench/gpu/layout_proxy_search.sh OUT_DIR [SPEC] [SVC_DIR]   # on the GPU node
# The watch ends after REMAT_WATCH_TIMEOUT_S seconds or at REMAT_DEADLINE (an epoch second: keep
# the whole run inside one device call); OUT_DIR/remat.db keeps every finished trial either way.
set -u; W=${1:?OUT_DIR}; mkdir -p "$W"; export NCCL_NVLS_ENABLE=0; S=$(date +%s)
cd "$(dirname "$0")/../.." || exit 1
SPEC=${2:-examples/large/llama3-70b-proxy-search.yaml}; SVC=${3:-$PWD/.carry/svc}
bench/gpu/build_engine.sh build-gpu > "$W/build.log" 2>&1 || tail -20 "$W/build.log"
echo "built at $(( $(date +%s) - S )) s"
svc() { local b=$1; shift; LD_LIBRARY_PATH="$SVC/lib" "$SVC/bin/$b" "$@"; }
ADDR=127.0.0.1:50071
svc rematd --listen $ADDR --db "$W/remat.db" > "$W/rematd.log" 2>&1 &
RD=$!
svc remat-worker --coordinator $ADDR --trial-binary "$PWD/build-gpu/bin/remat-trial" \
  --work-dir /tmp/remat-proxy-work --log-level info > "$W/worker.log" 2>&1 &
WK=$!
trap 'kill $WK $RD 2>/dev/null; wait 2>/dev/null' EXIT
sleep 2
id=$(svc remat submit "$SPEC" --coordinator $ADDR | tail -1); echo "$id" > "$W/search.id"
T=${REMAT_WATCH_TIMEOUT_S:-380}  # or until REMAT_DEADLINE (seconds since the epoch)
if [ -n "${REMAT_DEADLINE:-}" ]; then T=$(( REMAT_DEADLINE - $(date +%s) )); fi
timeout $T env LD_LIBRARY_PATH="$SVC/lib" "$SVC/bin/remat" watch "$id" --coordinator $ADDR \
  > "$W/watch.txt" 2>&1
svc remat get "$id" --coordinator $ADDR --json > "$W/search.json"
svc remat get "$id" --coordinator $ADDR --svg "$W/search.svg" > "$W/search.txt"
echo "search done at $(( $(date +%s) - S )) s"; cat "$W/search.txt"
