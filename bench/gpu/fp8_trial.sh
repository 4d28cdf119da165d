#!/usr/bin/env bash
# FP8 against bf16 on one H200: the Llama-3-8B-shaped example (examples/gpu/dense.yaml, 8 layers,
# seq 4096) as Transformer Engine's layer (transformer_impl transformer_engine, flash attention,
# fused SwiGLU and RoPE) run by remat-trial in bf16, FP8 hybrid tensorwise and FP8 hybrid delayed
# (engine/fp8_linear.h), no recompute. Prints per run peak allocated and reserved memory, static
# bytes (with the FP8 weight workspaces), median step time and loss, and their ratios to bf16.
# Builds remat-trial with build_engine.sh.
#
#   bench/gpu/fp8_trial.sh OUT_DIR [POLICY]
# Writes OUT_DIR/build.log, trials.jsonl, trial.stderr.log, fp8_trial.json and fp8_trial.md.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${1:?OUT_DIR}
POLICY=${2:-selective:[]}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
bench/gpu/build_engine.sh build-gpu > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
TRIAL=build-gpu/bin/remat-trial
"$TRIAL" --version > "$OUT/versions.txt" 2>&1

# The example as TE's layer, with FP8 lines (or none) added to its model section.
spec() {  # NAME FP8_LINES
  sed -e 's/^  attention_backend: unfused/  attention_backend: flash/' \
      -e 's/^  memory_budget_gib: .*/  memory_budget_gib: 130/' \
      -e 's/^  warmup_steps: .*/  warmup_steps: 2/' -e 's/^  measure_steps: .*/  measure_steps: 5/' \
      -e "s/^model:/model:\n  transformer_impl: transformer_engine\n  bias_activation_fusion: true\n  apply_rope_fusion: true\n  bias_dropout_fusion: true$2/" \
      -e 's/^  device: .*/  device: cuda/' examples/gpu/dense.yaml > "$OUT/$1.yaml"
}
spec bf16 ''
spec fp8-tensorwise '\n  fp8: hybrid\n  fp8_recipe: tensorwise'
spec fp8-delayed '\n  fp8: hybrid\n  fp8_recipe: delayed'

: > "$OUT/trials.jsonl"
for kind in bf16 fp8-tensorwise fp8-delayed; do
  if ! "$TRIAL" --spec "$OUT/$kind.yaml" --policy "$POLICY" --json > "$OUT/$kind.json" 2>> "$OUT/trial.stderr.log"; then
    echo "{\"status\": \"exit $?\"}" > "$OUT/$kind.json"
  fi
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["kind"]=sys.argv[2]; print(json.dumps(r))' \
    "$OUT/$kind.json" "$kind" >> "$OUT/trials.jsonl"
done

python3 - "$OUT" "$POLICY" <<'PY'
import json, math, sys
out, policy = sys.argv[1], sys.argv[2]
runs = {r["kind"]: r for r in map(json.loads, open(f"{out}/trials.jsonl"))}
base = runs.get("bf16", {})
GiB = 2**30
lines = [f"# FP8 against bf16: examples/gpu/dense.yaml (Llama-3-8B layer shape, 8 layers, seq 4096, "
         f"micro-batch 1) as the TE layer, policy {policy}, one H200", "",
         "| run | status | peak allocated GiB | peak reserved GiB | static GiB | step s | loss "
         "| allocated / bf16 | reserved / bf16 | step / bf16 | loss - bf16 |",
         "|---|---|---|---|---|---|---|---|---|---|---|"]
summary = {}
for kind, r in runs.items():
    if r.get("status") != "ok":
        lines.append(f"| {kind} | {r.get('status')}: {r.get('message', '')[:120]} |" + " |" * 9)
        continue
    row = {"peak_allocated_gib": r["peak_allocated_bytes"] / GiB,
           "peak_reserved_gib": r["peak_reserved_bytes"] / GiB,
           "static_gib": r["static_bytes"] / GiB, "step_time_s": r["step_time_s"],
           "loss": r["loss"], "loss_finite": math.isfinite(r["loss"])}
    if base.get("status") == "ok":
        row["allocated_ratio"] = r["peak_allocated_bytes"] / base["peak_allocated_bytes"]
        row["reserved_ratio"] = r["peak_reserved_bytes"] / base["peak_reserved_bytes"]
        row["step_time_ratio"] = r["step_time_s"] / base["step_time_s"]
        row["loss_diff"] = r["loss"] - base["loss"]
        row["loss_rel_diff"] = row["loss_diff"] / base["loss"]
    summary[kind] = row
    ratio = lambda k, f="{:.3f}": f.format(row[k]) if k in row else "-"
    lines.append(f"| {kind} | ok | {row['peak_allocated_gib']:.2f} | {row['peak_reserved_gib']:.2f} | "
                 f"{row['static_gib']:.2f} | {row['step_time_s']:.4f} | {row['loss']:.5f} | "
                 f"{ratio('allocated_ratio')} | {ratio('reserved_ratio')} | {ratio('step_time_ratio')} | "
                 f"{ratio('loss_diff', '{:+.5f}')} |")
json.dump({"policy": policy, "runs": summary}, open(f"{out}/fp8_trial.json", "w"), indent=1)
open(f"{out}/fp8_trial.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
PY
