#!/bin/bash
# Every backend through the Slurm launcher (worker/slurm_launcher.h) against a real Slurm on
# this machine (slurm_cluster.sh): the executor contract's Slurm variants
# (tests/worker/executor_contract_test.cc, REMAT_TEST_SLURM=1), i.e. the builtin backend (a fake
# remat-trial), the megatron backend (its driver faked by the driver's own mapping and metrics
# writer, tests/worker/fake_megatron_driver.py) and the command backend (a template's job), each
# trial a Slurm job of two tasks (per-rank backends) or one batch step (command): ok, a failing
# rank, a timeout (scancel), a cancel (scancel), proxy depths (one job per depth).
#
#   slurm_backends_test.sh BUILD_DIR SOURCE_DIR
#
# Exit 77 (ctest: skipped) without Slurm/munge or root.
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/slurm/slurm_cluster.sh"
slurm_cluster_require
contract="$build/bin/worker_contract_test"
[ -x "$contract" ] || { echo "FAIL: no $contract"; exit 1; }

T=$(mktemp -d /tmp/remat-slurm-backends.XXXXXX)
failed=0
cleanup() {
  slurm_cluster_stop
  if [ "$failed" -eq 0 ]; then rm -rf "$T"; else echo "files kept in $T"; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  failed=1
  echo "--- jobs"; scontrol show job -o 2>/dev/null | cut -c1-300
  exit 1
}
start=$(date +%s)

slurm_cluster_start "$T/slurm" || fail "Slurm did not start"
echo "ok: slurmctld + slurmd up, node idle, $(nproc) CPUs"

REMAT_TEST_SLURM=1 "$contract" --gtest_filter='*Slurm*' > "$T/contract.log" 2>&1
rc=$?
grep -E '^\[ +(OK|FAILED|SKIPPED) +\]' "$T/contract.log"
[ $rc -eq 0 ] || { tail -n 60 "$T/contract.log"; fail "the executor contract's Slurm variants"; }
# Only the builtin proxy case may skip (remat-trial runs the depths itself).
skipped=$(grep '^\[  SKIPPED \]' "$T/contract.log" | grep -v 'ProxyDepths.*/BuiltinSlurm' | grep -v 'listed below')
[ -z "$skipped" ] || fail "skipped: $skipped"

# Each backend's trials were Slurm jobs: names remat-t-<case>.1, per-rank ones of two tasks.
scontrol show job -o | python3 -c '
import re, sys
jobs = [dict(re.findall(r"(\w+)=(\S*)", l)) for l in sys.stdin]
jobs = [j for j in jobs if j.get("JobName", "").startswith("remat-t-")]
tasks = sorted({j["NumTasks"] for j in jobs})
print(len(jobs), " ".join(tasks))
' > "$T/jobs" || fail "cannot list the jobs"
read -r njobs tasks < "$T/jobs"
# 3 backends x (ok, fail, hang x 2) + 2 backends x 2 proxy depths = 16 jobs
[ "$njobs" -ge 16 ] || fail "$njobs Slurm jobs for the contract's trials (expected 16)"
echo "ok: $njobs Slurm jobs (task counts: $tasks)"
[ -z "$(squeue -h -o %A)" ] || fail "jobs left in Slurm: $(squeue -h)"
echo "PASS ($(($(date +%s) - start)) s)"
