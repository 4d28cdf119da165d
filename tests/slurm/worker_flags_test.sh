#!/bin/bash
# remat-worker's Slurm flags are refused with one line naming the flag and exit 2, before the
# worker contacts anything (no Slurm needed).
#
#   worker_flags_test.sh BUILD_DIR
set -u
w="$1/bin/remat-worker"
status=0
expect() {  # expect "STDERR PREFIX" ARGS...
  local want=$1 err rc
  shift
  err=$("$w" --coordinator 127.0.0.1:1 "$@" 2>&1 >/dev/null)
  rc=$?
  if [ $rc -ne 2 ] || [ "${err#"$want"}" = "$err" ]; then
    echo "FAIL: remat-worker $*: exit $rc, stderr: $err (expected exit 2, '$want...')"
    status=1
  else
    echo "ok: remat-worker $*: $err"
  fi
}
expect "error: --slurm-*: only with --executor slurm" --slurm-qos high
expect "error: --gpus: not with --executor slurm" --executor slurm --gpus 0
expect "error: --executor: " --executor pbs
expect "error: --trial-binary: /nonexistent is not an executable file" --executor slurm \
  --trial-binary /nonexistent
expect "error: --slurm-gpus-per-node: " --executor slurm --slurm-gpus-per-node -1
exit $status
