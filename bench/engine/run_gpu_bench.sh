#!/usr/bin/env bash
# On a GPU machine: builds remat-trial and the bench programs against the
# pip torch's LibTorch and NCCL, then runs every policy of the three example models with the C++
# engine and with its eager-PyTorch twin (bench/engine/bench.py) and prints the comparison tables.
# Logs, raw JSON lines and bench.json go to OUT_DIR (default: $OUT, else build-gpu/bench-out).
#
#   bench/engine/run_gpu_bench.sh [OUT_DIR] [bench.py options, e.g. --models dense --quick]
#
# About 7 minutes on one H200 (build ~2, trials ~5).
set -euo pipefail
export NCCL_NVLS_ENABLE=0  # NVLink multicast can take a shared host's GPUs out of service

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${REMAT_BENCH_BUILD:-$ROOT/build-gpu}
OUT_DIR=${OUT:-$BUILD/bench-out}
if [[ $# -gt 0 && $1 != --* ]]; then OUT_DIR=$1; shift; fi
mkdir -p "$OUT_DIR"

TORCH_PREFIX=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
echo "configure (LibTorch from $TORCH_PREFIX)"
if ! cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DREMAT_BUILD_SERVICE=OFF -DREMAT_BUILD_TESTS=OFF -DREMAT_WITH_CUDA=ON \
      -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" > "$OUT_DIR/cmake.log" 2>&1; then
  tail -40 "$OUT_DIR/cmake.log"; exit 1
fi
echo "build"
if ! cmake --build "$BUILD" --target remat-trial remat-bench-engine remat-bench-estimate \
      -j"$(nproc)" > "$OUT_DIR/build.log" 2>&1; then
  grep -E "error|Error" "$OUT_DIR/build.log" | head -40; exit 1
fi
"$BUILD/bin/remat-trial" --version | tee "$OUT_DIR/versions.txt"
python3 -c 'import torch; print("pytorch=" + torch.__version__)' | tee -a "$OUT_DIR/versions.txt"

python3 "$ROOT/bench/engine/bench.py" --build "$BUILD" --out "$OUT_DIR" "$@" | tee "$OUT_DIR/bench.txt"
