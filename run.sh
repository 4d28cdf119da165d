#!/usr/bin/env bash
# remat's one-stop entry point for a fresh Debian 12 machine: installs the build dependencies
# (apt-get, as root or through sudo), builds into ./build, then runs what you asked for.
#
#   ./run.sh search examples/tiny-dense.yaml   the main job: a whole search on this machine
#   ./run.sh test                             the test suite (ctest; GPU-only tests excluded),
#                                             then again under ASan + UBSan (all but the LibTorch
#                                             engine's; REMAT_SANITIZE=0 skips it), then the
#                                             fuzzers (REMAT_FUZZ_SECONDS each, default 60; 0
#                                             skips them)
#   ./run.sh build                            just install and build
#   ./run.sh remat ARGS... | rematd ARGS... | remat-worker ARGS... | remat-trial ARGS...
set -euo pipefail
cd "$(dirname "$0")"

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libspdlog-dev prometheus-cpp-dev libsqlite3-dev libyaml-cpp-dev libcli11-dev
  nlohmann-json3-dev libgtest-dev libgmock-dev libtorch-dev prometheus procps openssl python3
  python3-yaml python3-grpcio python3-protobuf dpkg-dev systemd slurmctld slurmd slurm-client munge
  clang
)
BUILD_DIR=${REMAT_BUILD_DIR:-build}

install_deps() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "run.sh: installing ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
}

build() {
  install_deps
  if [ ! -f "$BUILD_DIR/build.ninja" ]; then
    cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
  fi
  cmake --build "$BUILD_DIR" -j "$(nproc)"
}

# libFuzzer targets (fuzz/CMakeLists.txt): a clang build of the readers with AddressSanitizer and
# UndefinedBehaviorSanitizer, each target run for REMAT_FUZZ_SECONDS from the seed corpus.
fuzz() {
  local seconds=${REMAT_FUZZ_SECONDS:-60}
  [ "$seconds" -gt 0 ] || return 0
  local dir=${REMAT_FUZZ_BUILD_DIR:-build-fuzz}
  if [ ! -f "$dir/build.ninja" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DREMAT_FUZZ=ON -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=all"
  fi
  cmake -S . -B "$dir" -DREMAT_FUZZ_SECONDS="$seconds" >/dev/null
  cmake --build "$dir" -j "$(nproc)"
  ctest --test-dir "$dir" --output-on-failure -L fuzz -j "$(nproc)"
}

# The test suite again, built by clang with AddressSanitizer and UndefinedBehaviorSanitizer:
# every test but the LibTorch engine's (LibTorch is not instrumented, and the engine tests alone
# would take most of CI's time under ASan on 2 cores), and not the GPU or Slurm ones.
sanitize() {
  [ "${REMAT_SANITIZE:-1}" != 0 ] || return 0
  local dir=${REMAT_SANITIZE_BUILD_DIR:-build-asan}
  local flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
  if [ ! -f "$dir/build.ninja" ]; then
    CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DREMAT_BUILD_ENGINE=OFF -DREMAT_BUILD_BENCH=OFF -DCMAKE_C_FLAGS="$flags" \
      -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined"
  fi
  cmake --build "$dir" -j "$(nproc)"
  # ASan's defaults (leak and ODR checks on) plus two stricter checks; Debian's uninstrumented
  # gRPC, protobuf and abseil raised no false report (2026-12-02), so nothing is switched off.
  ASAN_OPTIONS=${ASAN_OPTIONS:-strict_string_checks=1:detect_stack_use_after_return=1} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1} \
    ctest --test-dir "$dir" --output-on-failure -LE 'gpu|slurm' -j "$(nproc)"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  build) build ;;
  test)
    build
    ctest --test-dir "$BUILD_DIR" --output-on-failure -LE gpu -j "$(nproc)" "$@"
    sanitize
    fuzz
    ;;
  search) build; exec "$BUILD_DIR/bin/remat" search "$@" ;;
  remat|rematd|remat-worker|remat-trial) build; exec "$BUILD_DIR/bin/$cmd" "$@" ;;
  *)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
