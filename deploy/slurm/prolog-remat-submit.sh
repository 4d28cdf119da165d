#!/bin/bash
# Slurm prolog: before a training job starts, submit a remat search for it, so the best
# activation-recompute policy is measured (or reused from the results cache) for its exact
# model and layout. The job opts in with a spec file:
#
#   sbatch --export=ALL,REMAT_SPEC=/path/to/spec.yaml train.sbatch
#
# Install as the PrologSlurmctld (runs once per job on the controller, with the job's
# environment in SLURM_JOB_* variables) or as a per-node Prolog guarded to run on the first node.
# It never fails the job: any problem is logged and the prolog exits 0.
#
# Settings (e.g. in /etc/default/remat-prolog):
#   REMAT_COORDINATOR  host:port of rematd                      (required)
#   REMAT_TOKEN_FILE   a user token of the service account       (optional)
#   REMAT_BIN          the remat CLI                             (default: /usr/local/bin/remat)
#   REMAT_SUBMIT_ARGS  extra flags, e.g. --tls                   (optional)
set -u
[ -r /etc/default/remat-prolog ] && . /etc/default/remat-prolog

log() { logger -t remat-prolog "job ${SLURM_JOB_ID:-?}: $*"; }

# The spec comes from the job's environment (SPANK/--export); Slurm exposes it to
# PrologSlurmctld as SLURM_JOB_... only when exported, so check both spellings.
spec="${REMAT_SPEC:-${SLURM_REMAT_SPEC:-}}"
[ -z "$spec" ] && exit 0
if [ -z "${REMAT_COORDINATOR:-}" ]; then
  log "REMAT_COORDINATOR is not set; not submitting"
  exit 0
fi
if [ ! -r "$spec" ]; then
  log "spec $spec is not readable; not submitting"
  exit 0
fi

bin="${REMAT_BIN:-/usr/local/bin/remat}"
args=(submit "$spec" --coordinator "$REMAT_COORDINATOR" --timeout 20)
[ -n "${REMAT_TOKEN_FILE:-}" ] && args+=(--token-file "$REMAT_TOKEN_FILE")
# shellcheck disable=SC2206
[ -n "${REMAT_SUBMIT_ARGS:-}" ] && args+=(${REMAT_SUBMIT_ARGS})

if out=$(timeout 30 "$bin" "${args[@]}" 2>&1); then
  id=$(printf '%s\n' "$out" | tail -n 1)
  log "submitted remat search $id for $spec"
  # Leave the id where the job can find it: `remat get $id --json` in the job script.
  if [ -n "${SLURM_JOB_ID:-}" ] && command -v scontrol >/dev/null 2>&1; then
    scontrol update JobId="$SLURM_JOB_ID" Comment="remat-search=$id" >/dev/null 2>&1 || true
  fi
else
  log "remat submit failed: $(printf '%s' "$out" | tail -n 1)"
fi
exit 0
