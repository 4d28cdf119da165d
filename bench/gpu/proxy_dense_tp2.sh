#!/usr/bin/env bash
# The GPU check of layout proxies on ONE GPU: each rank of examples/gpu/dense-tp2.yaml
# (TP 2 + SP) run alone with stand-in collectives (remat-trial --stand-in), for the policies of
# docs/results.md's two-GPU table, so the per-rank peaks can be set against the real ones there
# (Done-means: allocated within 3%, reserved within 8%). Then the same through the product path:
# RunTrial with search.layout_proxy: true (both roles in one process, one worker slot).
# Writes OUT_DIR/standin.jsonl (one JSON result per rank and policy), OUT_DIR/proxy.jsonl (the
# combined trial per policy), OUT_DIR/table.md and the build log.
#
#   bench/gpu/proxy_dense_tp2.sh OUT_DIR [POLICY ...]
# REMAT_TRIAL=PATH uses that remat-trial instead of building one.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${1:?OUT_DIR}; shift
mkdir -p "$OUT"
POLICIES=("$@")
[ ${#POLICIES[@]} -gt 0 ] || POLICIES=("selective:[]" "selective:[core_attn]" "selective:[mlp]"
  "selective:[layernorm]" "full:block:1" "full:uniform:1" "selective:[core_attn,layernorm]"
  "selective:[core_attn,mlp]")
T=${REMAT_TRIAL:-}
if [ -z "$T" ]; then
  bench/gpu/build_engine.sh build-proxy > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
  T=$ROOT/build-proxy/bin/remat-trial
fi
SPEC=examples/gpu/dense-tp2.yaml
PROXY_SPEC=$OUT/dense-tp2-proxy.yaml
sed 's/^search:$/search:\n  layout_proxy: true/' "$SPEC" > "$PROXY_SPEC"
: > "$OUT/standin.jsonl"; : > "$OUT/proxy.jsonl"
{
  echo "| policy | rank | status | allocated GiB | reserved GiB | setup s | wall s |"
  echo "| --- | ---: | --- | ---: | ---: | ---: | ---: |"
} > "$OUT/table.md"
for p in "${POLICIES[@]}"; do
  for r in 0 1; do
    line=$(timeout -k 5 300 "$T" --spec "$SPEC" --policy "$p" --stand-in --rank "$r" \
             --world-size 2 --json 2> "$OUT/standin.err" | tail -1)
    echo "$line" >> "$OUT/standin.jsonl"
    python3 - "$p" "$r" "$line" >> "$OUT/table.md" <<'EOF'
import json, sys
p, r, line = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    d = json.loads(line)
except ValueError:
    print("| `%s` | %s | no result | | | | |" % (p, r)); sys.exit()
k = d["ranks"][0] if d.get("ranks") else {}
g = 2 ** 30
print("| `%s` | %s | %s | %.2f | %.2f | %.2f | %.2f |" % (
    p, r, d["status"], k.get("peak_allocated_bytes", 0) / g, k.get("peak_reserved_bytes", 0) / g,
    d.get("setup_s", 0), d.get("wall_s", 0)))
EOF
  done
  timeout -k 5 600 "$T" --spec "$PROXY_SPEC" --policy "$p" --world-size 1 --json \
    2> "$OUT/proxy.err" | tail -1 >> "$OUT/proxy.jsonl"
done
cat "$OUT/table.md"
