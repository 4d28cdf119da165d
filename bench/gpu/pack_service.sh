#!/usr/bin/env bash
# Packs rematd, remat-worker and remat (built here, where gRPC exists) with the shared libraries
# they need into DIR/bin and DIR/lib, for a GPU node that has no gRPC:
# everything ldd lists except glibc's own libraries, libstdc++ and libgcc_s.
# Usage: bench/gpu/pack_service.sh BUILD_DIR DIR
set -euo pipefail
build=${1:?BUILD_DIR}; dir=${2:?DIR}
rm -rf "$dir"; mkdir -p "$dir/bin" "$dir/lib"
for b in remat rematd remat-worker; do
  strip -o "$dir/bin/$b" "$build/bin/$b"
  ldd "$build/bin/$b" | awk '/=> \//{print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
      *) cp -L "$lib" "$dir/lib/" ;;
    esac
  done
done
# remat-worker's megatron backend finds its driver beside it (worker/README.md, "megatron").
if [ -d "$build/bin/megatron_driver" ]; then
  cp -r "$build/bin/megatron_driver" "$dir/bin/" && rm -rf "$dir/bin/megatron_driver/__pycache__"
fi
du -sh "$dir"
