#!/usr/bin/env bash
# DeepSeek-V3's published H100 recipe (examples/recipes/deepseek-v3-h100-bf16.yaml, imported as
# docs/recipes.md says) measured on ONE H200: its peak stages run alone with stand-in collectives,
# as a layout proxy runs its roles (docs/layout-proxies.md): stage 2 (eight MoE layers, the most
# micro-batches in flight of its kind) and stage 7 (six MoE layers, the MTP layer and both
# losses), each under selective:[] (remat's plan) and selective:[mla_up_proj,mlp] (NVIDIA's), at
# full size (TP 2 + SP, PP 8 x VPP 4, EP 64 of DP 64, seq 4096, MLA, 256 experts, MTP 1, TE's
# cross-entropy), on the proxy's micro-batch count (bench/gpu/deepseek-v3-stages.yaml says
# how it was cut). Prints measured allocated and reserved peaks against the plan's, per stage, and
# writes OUT/deepseek-v3-stages.json.
#   [REMAT_STAGE_TIMEOUT_S=120] bench/gpu/deepseek_v3_stages.sh OUT_DIR   (the cap per trial)
set -u; W=${1:?OUT_DIR}; mkdir -p "$W"; export NCCL_NVLS_ENABLE=0; S=$(date +%s)
cd "$(dirname "$0")/../.." || exit 1
SPEC=bench/gpu/deepseek-v3-stages.yaml
PLAN=docs/results/deepseek-v3/plan-stages.json  # `remat plan --json` per policy (CPU side)
bench/gpu/build_engine.sh build-gpu > "$W/build.log" 2>&1 || { tail -20 "$W/build.log"; exit 1; }
echo "built at $(( $(date +%s) - S )) s"
TP=2; DP=64  # rank = tp + TP * (dp + DP * pp): tp = dp = 0 of the stage
for stage in 2 7; do
  for policy in 'selective:[]' 'selective:[mla_up_proj,mlp]'; do
    tag="s${stage}-$(echo "$policy" | tr -dc 'a-z_')"
    timeout "${REMAT_STAGE_TIMEOUT_S:-120}" build-gpu/bin/remat-trial --spec "$SPEC" --policy "$policy" --stand-in \
      --rank $(( stage * TP * DP )) --world-size 1024 --json 2> "$W/$tag.err" | tail -1 > "$W/$tag.json"
    echo "stage $stage $policy rc=$? at $(( $(date +%s) - S )) s"
  done
done
python3 - "$W" "$PLAN" <<'PY'
import json, sys, glob, os
out, plan_file = sys.argv[1], sys.argv[2]
plan = json.load(open(plan_file)) if os.path.exists(plan_file) else {}
gib = 2.0 ** 30
rows = []
print(f"{'stage':>5} {'policy':<30} {'status':<8} {'alloc GiB':>9} {'reserved GiB':>12} {'plan GiB':>9} {'plan/alloc':>10} {'step s':>7}")
for stage in (2, 7):
    for policy in ("selective:[]", "selective:[mla_up_proj,mlp]"):
        tag = f"s{stage}-" + "".join(c for c in policy if c.isalpha() or c == "_")
        try:
            r = json.load(open(f"{out}/{tag}.json"))
        except Exception as e:  # a crash or a timeout: say so
            r = {"status": "no result", "message": str(e)}
        rank = (r.get("ranks") or [{}])[0]
        alloc = rank.get("peak_allocated_bytes", 0) / gib
        reserved = rank.get("peak_reserved_bytes", 0) / gib
        p = plan.get(policy, {}).get(str(stage))
        row = {"stage": stage, "policy": policy, "status": r.get("status"),
               "message": r.get("message", ""), "peak_allocated_gib": alloc,
               "peak_reserved_gib": reserved, "static_gib": rank.get("static_bytes", 0) / gib,
               "plan_peak_gib": p, "step_time_s": r.get("step_time_s")}
        rows.append(row)
        ratio = f"{p / alloc:10.3f}" if p and alloc else f"{'-':>10}"
        print(f"{stage:>5} {policy:<30} {str(r.get('status')):<8} {alloc:9.2f} {reserved:12.2f} "
              f"{(p or 0):9.2f} {ratio} {r.get('step_time_s') or 0:7.2f}")
json.dump(rows, open(f"{out}/deepseek-v3-stages.json", "w"), indent=1)
PY
echo "done at $(( $(date +%s) - S )) s"
