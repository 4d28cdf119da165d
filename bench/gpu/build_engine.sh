#!/usr/bin/env bash
# Builds remat-trial (and the engine tests) on a GPU node against the pip LibTorch (CUDA) and the
# NCCL that torch loads. Needs neither gRPC nor abseil.
# Usage: [REMAT_BUILD_TYPE=RelWithDebInfo] bench/gpu/build_engine.sh [BUILD_DIR [TARGETS...]]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build-gpu}
export NCCL_NVLS_ENABLE=0
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${REMAT_BUILD_TYPE:-Release} -DCMAKE_PREFIX_PATH="$torch_prefix" \
  -DREMAT_BUILD_SERVICE=OFF -DREMAT_WITH_CUDA=ON >"$build.configure.log" 2>&1 ||
  { tail -30 "$build.configure.log"; exit 1; }
ninja -C "$build" remat-trial "${@:2}"
