#!/usr/bin/env bash
# Steady-state measurement, on one H200: the grouped-MoE example
# (examples/gpu/moe.yaml) run by remat-trial with the steady-state warm-up (at least 1 step, then
# until the last 3 agree within 5%, at most 8) and with the old fixed warm-up of 1 step, each
# followed by 3 measured steps. Prints, per policy, the warm-up the rule took, the warm-up step
# times, the steady median against the old median, and each trial's loss against the control's
# (the numerical sanity check, bf16 tolerance 1e-3). Builds remat-trial with build_engine.sh.
#
#   bench/gpu/steady_state.sh OUT_DIR [POLICIES...]
# Writes OUT_DIR/build.log, steady.jsonl, fixed.jsonl, trajectory.jsonl (12 steps, no warm-up,
# for the whole step-time curve) and steady_state.txt (the table printed last).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
OUT=${1:?OUT_DIR}
shift
POLICIES=("$@")
[ ${#POLICIES[@]} -gt 0 ] || POLICIES=('selective:[]' 'selective:[moe_act]' 'selective:[core_attn]'
                                       'selective:[moe]' 'full:uniform:1')
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
bench/gpu/build_engine.sh build-gpu > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
TRIAL=build-gpu/bin/remat-trial
"$TRIAL" --version | tee "$OUT/versions.txt"

# The example's search section with the warm-up and measure settings replaced.
spec() {  # NAME WARMUP_LINES
  sed -e '/^  warmup_steps:/d' -e '/^  measure_steps:/d' examples/gpu/moe.yaml > "$OUT/$1.yaml"
  printf '%b' "$2" >> "$OUT/$1.yaml"
}
spec steady '  warmup_steps: 1\n  warmup_max_steps: 8\n  steady_window: 3\n  steady_tolerance: 0.05\n  measure_steps: 3\n'
spec fixed '  warmup_steps: 1\n  warmup_max_steps: 1\n  steady_window: 1\n  measure_steps: 3\n'
spec trajectory '  warmup_steps: 0\n  warmup_max_steps: 0\n  measure_steps: 12\n'

: > "$OUT/steady.jsonl"; : > "$OUT/fixed.jsonl"; : > "$OUT/trajectory.jsonl"
for p in "${POLICIES[@]}"; do
  for kind in steady fixed trajectory; do
    "$TRIAL" --spec "$OUT/$kind.yaml" --policy "$p" --json >> "$OUT/$kind.jsonl" 2>> "$OUT/trial.stderr.log" ||
      echo "{\"policy\": \"$p\", \"status\": \"exit $?\"}" >> "$OUT/$kind.jsonl"
  done
done

python3 - "$OUT" <<'PY' | tee "$OUT/steady_state.txt"
import json, sys, statistics
out = sys.argv[1]
load = lambda k: {r["policy"]: r for r in map(json.loads, open(f"{out}/{k}.jsonl"))}
steady, fixed, traj = load("steady"), load("fixed"), load("trajectory")
control = steady.get("selective:[]")
print("grouped MoE (examples/gpu/moe.yaml), one H200; steady: warm-up >= 1, until the last 3 steps")
print("agree within 5%, <= 8; fixed: the old 1 warm-up step; both then 3 measured steps\n")
print(f"{'policy':24} {'warm-up':>8} {'settled':>8} {'steady s':>9} {'spread':>7} {'fixed s':>8} "
      f"{'fixed/steady':>12} {'loss vs control':>16}  warm-up step times (s)")
for p, s in steady.items():
    f = fixed.get(p, {})
    if s.get("status") != "ok":
        print(f"{p:24} {s.get('status')}: {s.get('message', '')[:80]}")
        continue
    rel = s["step_time_spread_s"] / s["step_time_s"]
    ratio = f"{f['step_time_s'] / s['step_time_s']:12.3f}" if f.get("status") == "ok" else f"{'-':>12}"
    fs = f"{f['step_time_s']:8.3f}" if f.get("status") == "ok" else f"{'-':>8}"
    loss = "-"
    if control and control.get("status") == "ok" and control["loss"]:
        loss = f"{abs(s['loss'] - control['loss']) / abs(control['loss']):.1e}"
    warm = " ".join(f"{t:.3f}" for t in s["ranks"][0].get("warmup_step_times_s", []))
    print(f"{p:24} {s['warmup_steps_taken']:8d} {str(s['warmup_settled']):>8} {s['step_time_s']:9.3f} "
          f"{rel:7.1%} {fs} {ratio} {loss:>16}  {warm}")
print("\nstep-time trajectory (12 steps, no warm-up), s:")
for p, t in traj.items():
    if t.get("status") == "ok":
        print(f"  {p:24} " + " ".join(f"{x:.3f}" for x in t["ranks"][0]["step_times_s"]))
print("\nversions:", json.dumps((control or {}).get("versions", {})))
PY
