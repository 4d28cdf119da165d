#!/usr/bin/env bash
# An exhaustive table measured directly with remat-trial on one GPU, one process per policy:
# every policy listed in POLICIES_FILE (one per line) of SPEC, each as its own trial, appended as
# one JSON line to OUT_DIR/table.jsonl (a trial that cannot start or is killed leaves a line with
# its exit status). Stops starting trials once REMAT_TABLE_SECONDS (default 540) have passed, so a
# time-limited call still brings back what it measured; a later call given the earlier
# table.jsonl as DONE_JSONL skips the policies it holds (matched as remat-trial prints them:
# list POLICIES_FILE in that canonical form, labels in Megatron's order). bench/gpu/to_replay.py --jsonl turns the
# lines into a replay table. Builds remat-trial with build_engine.sh.
#
#   bench/gpu/exhaustive_table.sh OUT_DIR SPEC POLICIES_FILE [DONE_JSONL]
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${1:?OUT_DIR}; SPEC=${2:?SPEC}; POLICIES=${3:?POLICIES_FILE}; DONE=${4:-}
LIMIT=${REMAT_TABLE_SECONDS:-540}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
start=$SECONDS
bench/gpu/build_engine.sh build-gpu > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
TRIAL=build-gpu/bin/remat-trial
"$TRIAL" --version > "$OUT/versions.txt"
echo "build: $((SECONDS - start)) s"
: > "$OUT/table.jsonl"
n=0
while IFS= read -r p; do
  case "$p" in ""|\#*) continue ;; esac
  if [ -n "$DONE" ] && grep -qF "\"policy\":\"$p\"" "$DONE" 2>/dev/null; then continue; fi
  if [ $((SECONDS - start)) -ge "$LIMIT" ]; then echo "time limit: stopped before $p"; break; fi
  t0=$SECONDS
  timeout 300 "$TRIAL" --spec "$SPEC" --policy "$p" --json >> "$OUT/table.jsonl" 2>> "$OUT/trial.stderr.log"
  rc=$?
  [ $rc -eq 0 ] || printf '{"policy":"%s","status":"failed","message":"remat-trial exit %d"}\n' "$p" $rc >> "$OUT/table.jsonl"
  n=$((n + 1))
  echo "$p: rc $rc, $((SECONDS - t0)) s"
done < "$POLICIES"
echo "measured $n policies in $((SECONDS - start)) s"
