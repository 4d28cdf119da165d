#!/usr/bin/env bash
# An exhaustive table and a second run of every policy in it, on one machine, over as many calls
# as the machine's per-call limit needs: each call resumes from STATE_DIR (kept on the machine
# between calls) and stops starting trials after CALL_SECONDS (default 560). The second runs are
# what a replayed search's re-measures are served (bench/search/redraws.py turns them into
# replay tables); measured on the machine that measured the table, they carry its run-to-run
# noise and not the shift between machine starts (2-3% on the H200s, docs/results.md).
#
#   bench/gpu/table_and_redraws.sh STATE_DIR SPEC POLICIES_FILE
#
# STATE_DIR/table.jsonl and STATE_DIR/redraws.jsonl hold every remat-trial line so far; the call
# prints how many of each it holds.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
STATE=${1:?STATE_DIR}; SPEC=${2:?SPEC}; POLICIES=${3:?POLICIES_FILE}
LIMIT=${CALL_SECONDS:-560}
mkdir -p "$STATE"
touch "$STATE/table.jsonl" "$STATE/redraws.jsonl"
wanted=$(grep -cv '^\s*\(#\|$\)' "$POLICIES")
call="$STATE/call-$(date +%s)"
for pass in table redraws; do
  have=$(grep -c . "$STATE/$pass.jsonl")
  [ "$have" -ge "$wanted" ] && continue
  left=$((LIMIT - SECONDS))
  [ "$left" -gt 20 ] || break
  REMAT_TABLE_SECONDS=$left "$ROOT/bench/gpu/exhaustive_table.sh" "$call/$pass" "$SPEC" \
    "$POLICIES" "$STATE/$pass.jsonl"
  cat "$call/$pass/table.jsonl" >> "$STATE/$pass.jsonl"
  cp "$call/$pass/versions.txt" "$STATE/versions.txt" 2>/dev/null
  # The second runs start only once the table is whole.
  [ "$(grep -c . "$STATE/$pass.jsonl")" -ge "$wanted" ] || break
done
echo "table: $(grep -c . "$STATE/table.jsonl") of $wanted; redraws:" \
  "$(grep -c . "$STATE/redraws.jsonl") of $wanted"
