#!/usr/bin/env bash
# The layout-proxy checks on ONE GPU, in one call:
# 1. examples/gpu/dense-tp2.yaml's ranks run alone with stand-in collectives and as the product's
#    layout proxy, against the real two-GPU figures in docs/results/h200x2-dense-tp2-guided.json.
#    Those were measured before the SwiGLU fix, so this engine is built with the fix
#    reverted (PATCH: `git diff 4ad3820 8572c99 -- engine/model.cc`), then rebuilt with it.
# 2. examples/large/llama3-70b-proxy-search.yaml's stage proxies for three policies, to set
#    against `remat plan --json` of the same spec (docs/layout-proxies.md).
#   bench/gpu/layout_proxy_check.sh OUT_DIR PATCH
set -u; W=${1:?OUT_DIR}; PATCH=${2:?PATCH}; mkdir -p "$W"; export NCCL_NVLS_ENABLE=0; S=$(date +%s)
cd "$(dirname "$0")/../.." || exit 1
patch -R -p1 < "$PATCH" > /dev/null && bench/gpu/build_engine.sh build-gpu > "$W/build-prefix.log" 2>&1 ||
  tail -20 "$W/build-prefix.log"
cp build-gpu/bin/remat-trial /tmp/remat-trial-prefix
patch -p1 < "$PATCH" > /dev/null
echo "built pre-fix at $(( $(date +%s) - S )) s"
REMAT_TRIAL=/tmp/remat-trial-prefix timeout 200 bench/gpu/proxy_dense_tp2.sh "$W/tp2" \
  'selective:[core_attn]' 'full:uniform:1' 'full:block:1' 'selective:[core_attn,layernorm]' \
  > "$W/tp2.out" 2>&1
echo "tp2 rc=$? at $(( $(date +%s) - S )) s"; tail -12 "$W/tp2.out"
bench/gpu/build_engine.sh build-gpu > "$W/build.log" 2>&1 || tail -20 "$W/build.log"
echo "built at $(( $(date +%s) - S )) s"
for p in 'selective:[]' 'full:uniform:1' 'selective:[mlp]'; do
  timeout 150 build-gpu/bin/remat-trial --spec examples/large/llama3-70b-proxy-search.yaml \
    --policy "$p" --world-size 1 --json 2> "$W/70b-$(echo "$p" | tr -dc 'a-z0-9').err" |
    tail -1 >> "$W/70b.jsonl"
  echo "70b $p at $(( $(date +%s) - S )) s"
done
