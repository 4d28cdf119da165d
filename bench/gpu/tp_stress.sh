#!/usr/bin/env bash
# Runs one multi-rank trial many times as separate remat-trial processes (as the worker does) and
# counts how each run ended, with the stack of every crash symbolised. For intermittent failures
# on the GPU node (docs/results.md: the TP 2 + SP crash). Writes OUT_DIR/summary.txt,
# OUT_DIR/crashes.txt and OUT_DIR/runs.tgz (every rank's stdout and stderr).
#
#   bench/gpu/tp_stress.sh OUT_DIR SPEC POLICY [RUNS] [WORLD]
# REMAT_TRACE_COLLECTIVES=1 in the environment makes every rank print its NCCL calls;
# REMAT_TRIAL=PATH uses that remat-trial instead of building one (e.g. a CPU build, CPU ranks).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${1:?OUT_DIR}; SPEC=${2:?SPEC}; POLICY=${3:?POLICY}; RUNS=${4:-10}; WORLD=${5:-2}
mkdir -p "$OUT/runs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T=${REMAT_TRIAL:-}
if [ -z "$T" ]; then
  REMAT_BUILD_TYPE=${REMAT_BUILD_TYPE:-RelWithDebInfo} bench/gpu/build_engine.sh build-stress \
    > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  T=$ROOT/build-stress/bin/remat-trial
fi
C10=$(python3 -c 'import torch, os; print(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so"))' 2>/dev/null)
for i in $(seq 1 "$RUNS"); do
  rv=$(mktemp -d); start=$SECONDS
  for r in $(seq 0 $((WORLD - 1))); do
    timeout -k 5 120 "$T" --spec "$SPEC" --policy "$POLICY" --rank "$r" --world-size "$WORLD" \
      --rendezvous "$rv" --collective-timeout 60 --json \
      > "$OUT/runs/$i.r$r.out" 2> "$OUT/runs/$i.r$r.err" &
  done
  wait
  statuses=$(for r in $(seq 0 $((WORLD - 1))); do
    grep -o '"status":"[a-z]*"' "$OUT/runs/$i.r$r.out" | head -1 | cut -d'"' -f4 || true
  done | sort | uniq -c | tr -s ' ' | tr '\n' ' ')
  crashed=$(grep -l 'fatal signal' "$OUT"/runs/$i.r*.err 2>/dev/null | wc -l)
  echo "run $i: ${statuses:-no result} crashed ranks $crashed, $((SECONDS - start)) s" | tee -a "$OUT/summary.txt"
  for f in $(grep -l 'fatal signal' "$OUT"/runs/$i.r*.err 2>/dev/null); do
    { echo "== $f"; grep 'fatal signal' "$f"
      grep -o 'remat-trial(+0x[0-9a-f]*)' "$f" | grep -o '0x[0-9a-f]*' | xargs -r addr2line -f -C -i -e "$T" | paste - -
      [ -z "$C10" ] || grep -o 'libc10_cuda.so(+0x[0-9a-f]*)' "$f" | grep -o '0x[0-9a-f]*' |
        xargs -r addr2line -f -C -e "$C10" | paste - -
    } >> "$OUT/crashes.txt"
  done
  rm -rf "$rv"
done
tar czf "$OUT/runs.tgz" -C "$OUT" runs && rm -rf "$OUT/runs"
echo "== $POLICY, $RUNS runs of $WORLD ranks:"; cut -d: -f2 "$OUT/summary.txt" | sed 's/, [0-9]* s$//' | sort | uniq -c
