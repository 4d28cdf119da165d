#!/usr/bin/env bash
# On one H200: rematd, remat-worker and remat-trial on the GPU node, searches submitted
# with the remat CLI. For each example model (examples/gpu/{dense,moe,mla}.yaml): the guided
# search, then the exhaustive one (trials the guided search measured come from the results
# cache), and remat-compare on the pair. Then the depth proxy against a directly measured deeper
# model, and one long trial for the trial overhead. Writes everything to OUT_DIR.
#
#   bench/gpu/pack_service.sh build .carry       # where gRPC exists (this repo's dev machine)
#   bench/gpu/e2e.sh OUT_DIR [.carry] [MODELS]   # on the GPU node; MODELS default "dense moe mla"
# REMAT_E2E_EXTRAS=0 skips the depth proxy and the overhead trial; REMAT_E2E_EXHAUSTIVE=0 runs
# the guided searches only and, where docs/results/h200-MODEL-exhaustive.json (an earlier
# exhaustive run on an H200) exists, compares the guided search against that.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${1:?OUT_DIR}; CARRY=${2:-$ROOT/.carry}; MODELS=${3:-dense moe mla}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
bench/gpu/build_engine.sh build-gpu remat-compare > "$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
cp build-gpu/bin/remat-trial "$CARRY/bin/"
svc() { local b=$1; shift; LD_LIBRARY_PATH="$CARRY/lib" "$CARRY/bin/$b" "$@"; }
ADDR=127.0.0.1:50051
svc rematd --listen $ADDR --db "$OUT/remat.db" --metrics-listen 127.0.0.1:9464 \
  > "$OUT/rematd.log" 2>&1 &
svc remat-worker --coordinator $ADDR --trial-binary "$CARRY/bin/remat-trial" \
  --work-dir /tmp/remat-work --log-level info > "$OUT/worker.log" 2>&1 &
sleep 2

run_search() {  # NAME SPEC
  local name=$1 spec=$2 id
  id=$(svc remat submit "$spec" --coordinator $ADDR | tail -1) || return 1
  svc remat watch "$id" --coordinator $ADDR > "$OUT/$name.watch.txt" 2>&1
  svc remat get "$id" --coordinator $ADDR --json > "$OUT/$name.json"
  svc remat get "$id" --coordinator $ADDR --svg "$OUT/$name.svg" > "$OUT/$name.txt"
  echo "== $name ($id)"; sed -n '/^frontier/,$p' "$OUT/$name.txt"
}

if [ "${REMAT_E2E_EXTRAS:-1}" = 1 ]; then
echo "== depth proxy: 8 layers predicted from 2 and 4, against 8 measured"
for p in 'selective:[]' 'selective:[core_attn]' 'selective:[mlp]' 'full:uniform:1' 'full:block:1'; do
  build-gpu/bin/remat-trial --spec examples/gpu/proxy.yaml --policy "$p" --json >> "$OUT/proxy.jsonl"
  build-gpu/bin/remat-trial --spec examples/gpu/proxy-direct.yaml --policy "$p" --json >> "$OUT/direct.jsonl"
done
python3 - "$OUT/proxy.jsonl" "$OUT/direct.jsonl" <<'PY' | tee "$OUT/proxy.txt"
import json, sys
pred = [json.loads(l) for l in open(sys.argv[1])]
meas = [json.loads(l) for l in open(sys.argv[2])]
print(f"{'policy':24} {'pred alloc GiB':>14} {'meas alloc GiB':>14} {'ratio':>7} {'pred resv':>10} {'meas resv':>10} {'ratio':>7} {'pred s':>7} {'meas s':>7}")
for p, m in zip(pred, meas):
    g = 2**30
    print(f"{p['policy']:24} {p['peak_allocated_bytes']/g:14.2f} {m['peak_allocated_bytes']/g:14.2f} "
          f"{p['peak_allocated_bytes']/m['peak_allocated_bytes']:7.3f} {p['peak_reserved_bytes']/g:10.2f} "
          f"{m['peak_reserved_bytes']/g:10.2f} {p['peak_reserved_bytes']/m['peak_reserved_bytes']:7.3f} "
          f"{p['step_time_s']:7.3f} {m['step_time_s']:7.3f}")
PY

echo "== trial overhead"
run_search overhead examples/gpu/overhead.yaml > /dev/null
python3 - "$OUT/overhead.json" <<'PY' | tee "$OUT/overhead-summary.txt"
import json, sys
t = json.load(open(sys.argv[1]))["trials"][0]
steps = 1 + 40
busy = steps * t["step_time_s"]
print(f"{t['policy']}: lease-to-result {t['wall_s']:.2f} s, set-up {t['setup_s']:.2f} s, "
      f"{steps} steps x {t['step_time_s']:.3f} s = {busy:.2f} s, ratio {t['wall_s']/busy:.3f} (goal <= 1.25)")
PY
fi

for m in $MODELS; do
  run_search "$m-guided" "examples/gpu/$m.yaml"
  if [ "${REMAT_E2E_EXHAUSTIVE:-1}" != 1 ]; then
    ref=docs/results/h200-$m-exhaustive.json
    [ -f "$ref" ] || continue
    echo "== $m: guided vs the stored exhaustive run ($ref)"
    build-gpu/bin/remat-compare "$OUT/$m-guided.json" "$ref" | tee "$OUT/$m-compare.txt"
    continue
  fi
  sed 's/strategy: guided/strategy: exhaustive/' "examples/gpu/$m.yaml" > "/tmp/$m-exhaustive.yaml"
  run_search "$m-exhaustive" "/tmp/$m-exhaustive.yaml" > /dev/null
  echo "== $m: guided vs exhaustive"
  build-gpu/bin/remat-compare "$OUT/$m-guided.json" "$OUT/$m-exhaustive.json" | tee "$OUT/$m-compare.txt"
done
curl -s 127.0.0.1:9464/metrics > "$OUT/metrics.txt" 2>/dev/null || true
