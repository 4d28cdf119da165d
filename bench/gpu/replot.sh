#!/usr/bin/env bash
# Redraws docs/results' exhaustive plots from the measured H200 tables, with today's renderer: each
# table is replayed (backend replay, strategy exhaustive), so every trial of the GPU search is drawn
# with the figures it measured. No GPU needed.  Usage: bench/gpu/replot.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for model in dense moe mla; do
  for round in "" "-r2"; do
    table="$PWD/docs/results/h200-$model-exhaustive-table$round.json"
    [ -f "$table" ] || continue
    sed -e 's/strategy: guided/strategy: exhaustive/' \
        -e "s#replay_table: .*#replay_table: $table#" \
        -e 's/max_trials: .*/max_trials: 1000/' \
        "examples/replay/h200-$model.yaml" > "$tmp/spec.yaml"
    "$build/bin/remat" search "$tmp/spec.yaml" --svg "docs/results/h200-$model-exhaustive$round.svg" \
      > /dev/null
    echo "redrew docs/results/h200-$model-exhaustive$round.svg"
  done
done
