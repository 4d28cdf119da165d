#!/usr/bin/env bash
# NVIDIA's published recipes (examples/recipes/) searched in their published layouts with the
# builtin engine's layout proxies on ONE GPU (docs/layout-proxies.md), beside the plan and
# NVIDIA's published recompute (docs/recipes.md, "How to reproduce the searches").
#   bench/gpu/pack_service.sh build .carry/svc                  # here, where gRPC exists
#   bench/gpu/recipe_search.sh OUT [RECIPE...]                   # on the GPU node
# RECIPE: a name in examples/recipes/ without .yaml (default: all five). Per recipe, OUT/<recipe>/
# holds spec.yaml (the import), plan.json (`remat plan --json`), search.json and search.txt
# (`remat search`), or refused.txt / import.txt; OUT/recipes.json and OUT/recipes.md are the
# table (bench/gpu/recipe_table.py, which also merges the OUT folders of several calls).
#
# Each recipe is imported as docs/recipes.md does (data_parallel_size per recipe, budget 79 GiB,
# DeepSeek-V3's overlap_param_gather override) plus the cap below; a recipe the builtin engine
# refuses (plan.json's builtin_backend_problem) is a row with the refusal, no device time spent.
# The cap per recipe, so that all five stay near 15 GPU-minutes with the build:
#   search.max_trials = REMAT_RECIPE_TRIALS (default 4; the guided search's first trials are the
#     plan's candidates, so each has a prediction beside it);
#   one warm-up and one measured step per trial (warmup_steps = warmup_max_steps = steady_window =
#     measure_steps = 1, noise_target 0): peaks are what a proxy measures, its step time is a model;
#   a wall budget: `remat search` gets SIGINT after REMAT_RECIPE_CAP_S seconds (default 140, cut
#     to what is left before REMAT_DEADLINE, an epoch second, when set); it then cancels the
#     running trial and still writes the JSON of the trials that finished; search.trial_timeout_s
#     is the same figure, so no single trial outlives it.
# Environment: REMAT_DEVICE (cuda; cpu runs CPU ranks: the plumbing test), REMAT_BIN (remat;
# default .carry/svc/bin/remat with its lib/, else build/bin/remat), REMAT_TRIAL (remat-trial;
# default build-gpu/bin/remat-trial, built by build_engine.sh when missing; cpu: build/bin/
# remat-trial), REMAT_RECIPE_SET (extra KEY=VALUE import overrides for every recipe, e.g. a
# shrunken model for the CPU).
set -u
OUT=${1:?OUT}; shift; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.." || exit 1
S=$(date +%s); export NCCL_NVLS_ENABLE=0
RECIPES=("$@")
if [ ${#RECIPES[@]} -eq 0 ]; then
  RECIPES=(llama3-70b-h100-bf16 llama31-405b-h100-bf16 mixtral-8x22b-h100-bf16
           llama3-70b-h100-fp8 deepseek-v3-h100-bf16)
fi
DEVICE=${REMAT_DEVICE:-cuda}; CAP=${REMAT_RECIPE_CAP_S:-140}; TRIALS=${REMAT_RECIPE_TRIALS:-4}
if [ -n "${REMAT_BIN:-}" ]; then REMAT=$REMAT_BIN
elif [ -x .carry/svc/bin/remat ]; then REMAT=$PWD/.carry/svc/bin/remat
  export LD_LIBRARY_PATH="$PWD/.carry/svc/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else REMAT=$PWD/build/bin/remat; fi
if [ -n "${REMAT_TRIAL:-}" ]; then TRIAL=$REMAT_TRIAL
elif [ "$DEVICE" = cpu ]; then TRIAL=$PWD/build/bin/remat-trial
else
  TRIAL=$PWD/build-gpu/bin/remat-trial
  bench/gpu/build_engine.sh build-gpu > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; exit 1; }
  echo "engine built at $(( $(date +%s) - S )) s"
fi
[ -x "$REMAT" ] && [ -x "$TRIAL" ] || { echo "error: need $REMAT and $TRIAL" >&2; exit 1; }

# The data-parallel size is not in a Bridge config (docs/recipes.md): from the published GPU count.
dp_of() { case $1 in llama3-70b-*) echo 2;; deepseek-v3-*) echo 64;; *) echo 8;; esac; }

for r in "${RECIPES[@]}"; do
  D=$OUT/$r; mkdir -p "$D"; f=examples/recipes/$r.yaml
  [ -f "$f" ] || { echo "no such recipe: $f" > "$D/import.txt"; echo "$r: no such recipe"; continue; }
  cap=$CAP
  if [ -n "${REMAT_DEADLINE:-}" ]; then
    left=$(( REMAT_DEADLINE - $(date +%s) - 15 )); [ "$left" -lt "$cap" ] && cap=$left
  fi
  extra=(); [ "${r#deepseek-v3}" != "$r" ] && extra=(parallel.overlap_param_gather=false)
  # shellcheck disable=SC2206
  set_args=(${REMAT_RECIPE_SET:-})
  if ! "$REMAT" import bridge "$f" parallel.data_parallel_size="$(dp_of "$r")" \
      search.memory_budget_gib=79 "${extra[@]}" search.layout_proxy=true search.device="$DEVICE" \
      search.max_trials="$TRIALS" search.warmup_steps=1 search.warmup_max_steps=1 \
      search.steady_window=1 search.measure_steps=1 search.noise_target=0 \
      search.trial_timeout_s="$(( cap > 30 ? cap : 30 ))" "${set_args[@]}" \
      > "$D/spec.yaml" 2> "$D/import.txt"; then
    echo "$r: import failed: $(head -1 "$D/import.txt")"; continue
  fi
  "$REMAT" plan "$D/spec.yaml" --json > "$D/plan.json" 2> "$D/plan.err"
  problem=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("builtin_backend_problem",""))' \
    "$D/plan.json" 2>/dev/null)
  if [ -n "$problem" ]; then
    echo "$problem" > "$D/refused.txt"; echo "$r: refused: $problem"; continue
  fi
  if [ "$cap" -lt 20 ]; then echo "no time left before REMAT_DEADLINE" > "$D/skipped.txt"; continue; fi
  t0=$(date +%s)
  timeout -s INT -k 30 "$cap" "$REMAT" search "$D/spec.yaml" --trial-binary "$TRIAL" \
    --json "$D/search.json" --work-dir "$D/work" > "$D/search.txt" 2>&1
  rc=$?; echo "$rc $(( $(date +%s) - t0 ))" > "$D/search.rc"
  # A bad spec is refused at submit with exit 2 and one line naming the field: that is the row.
  if [ $rc -eq 2 ] && [ ! -s "$D/search.json" ]; then grep -m1 '^error' "$D/search.txt" > "$D/refused.txt"; fi
  # A trial still running past the kill (its worker gone) must not hold the GPU for the next
  # recipe: end the remat-trial processes of this recipe's own work folder, by id.
  for pid in $(pgrep -f -- "--request $D/work/" || true); do kill -KILL "$pid" 2>/dev/null; done
  rm -rf "$D/work"
  echo "$r: search rc $rc in $(( $(date +%s) - t0 )) s (cap $cap s)"
done
python3 bench/gpu/recipe_table.py "$OUT" --json "$OUT/recipes.json" | tee "$OUT/recipes.md"
echo "done at $(( $(date +%s) - S )) s"
