#!/bin/bash
# Slurm prolog: before a training job starts, submit a remat search for it, so the best
# activation-recompute policy is measured (or reused from the results cache) for its exact model
# and layout. A job asks for it in its comment (the rest of the comment is kept):
#
#   sbatch --comment="remat:spec=/path/to/spec.yaml" train.sbatch
#   sbatch --comment="nightly run remat:spec=specs/llama.yaml" train.sbatch   # relative: --chdir
#
# Why the comment: Slurm hands prologs job metadata (SLURM_JOB_*), never the job's environment,
# so `--export=REMAT_SPEC=...` cannot reach a prolog. SLURM_JOB_COMMENT can, to PrologSlurmctld
# and to the node Prolog, with no plugin to build and install on every submit host (a SPANK
# option would need one); Slurm 22.05 has no `sbatch --extra`.
#
# Install as PrologSlurmctld (slurm.conf: PrologSlurmctld=/usr/libexec/remat/prolog-remat-submit.sh):
# it runs once per job start on the controller. As a node Prolog it acts on the job's first node
# only. Once per job, requeues included: after submitting, the prolog appends
# "remat:search=ID" to the job's AdminComment and records the job in its state folder; a
# requeued job carries the marker and is not submitted again. AdminComment, not Comment: users
# can edit their job's Comment (scontrol update) but only operators (and this prolog, as
# SlurmUser) can set AdminComment, so a user can neither forge the marker nor remove it to have
# a search submitted again. The user's request (remat:spec=) stays in the Comment they wrote.
#
# Slurm starts prologs with an environment of its SLURM_* variables only, no PATH: the prolog
# sets its own (REMAT_PROLOG_PATH, for a Slurm installed under /opt, say) before anything runs.
#
# The search belongs to the job's user: `remat submit` runs as that user (setpriv; the prolog
# runs as root), in the job's working directory. Its identity, one of:
#   - MUNGE (REMAT_MUNGE_SOCKET; recommended): `remat submit --munge` makes a credential as the
#     user through munged, which every Slurm node runs already; rematd (--munge-socket, on a
#     host sharing the cluster's munge key) decodes it to the user. No secret of any user is
#     stored on the controller.
#   - tokens (REMAT_USER_TOKENS): the user's token from a copy of rematd's user-token file,
#     readable by SlurmUser: the controller then holds every user's secret.
# So the spec is read with the user's rights, never root's, and `remat get ID` works for the
# user. The search id is in the job's AdminComment:
#   scontrol show job $SLURM_JOB_ID | grep -o 'remat:search=[^ ]*'      (in AdminComment)
#
# It never fails or delays the job beyond REMAT_PROLOG_TIMEOUT: every outcome is logged with its
# reason (syslog tag remat-prolog, and REMAT_PROLOG_LOG when set) and the prolog exits 0.
#
# Settings (in /etc/default/remat-prolog, or the environment):
#   REMAT_COORDINATOR      host:port of rematd                                     (required)
#   REMAT_MUNGE_SOCKET     submit with a MUNGE credential of the job's user, made through this
#                          munged socket (e.g. /run/munge/munge.socket.2); rematd needs
#                          --munge-socket. Takes precedence over REMAT_USER_TOKENS.
#   REMAT_USER_TOKENS      rematd's --user-tokens file ("TOKEN USER" lines); neither set: submit
#                          without a token (a coordinator without user auth)
#   REMAT_BIN              the remat CLI                     (default: /usr/bin/remat)
#   REMAT_SUBMIT_ARGS      extra flags for remat submit, e.g. --tls-ca /etc/remat/ca.crt
#   REMAT_PROLOG_STATE_DIR jobs already handled              (default: /var/lib/remat-prolog)
#   REMAT_PROLOG_TIMEOUT   seconds for the submission        (default: 30)
#   REMAT_PROLOG_LOG       also append log lines to this file (default: syslog only)
#   REMAT_PROLOG_PATH      the PATH the prolog runs with (scontrol, setpriv, awk, logger, timeout)
#                          (default: /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
set -u
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
[ -r /etc/default/remat-prolog ] && . /etc/default/remat-prolog
if [ -n "${REMAT_PROLOG_PATH:-}" ]; then
  PATH=$REMAT_PROLOG_PATH
fi

log() {
  local line="job ${SLURM_JOB_ID:-?}: $*"
  command -v logger >/dev/null 2>&1 && logger -t remat-prolog -- "$line" 2>/dev/null
  [ -n "${REMAT_PROLOG_LOG:-}" ] &&
    printf '%s remat-prolog %s\n' "$(date +%Y-%m-%dT%H:%M:%S%z)" "$line" >> "$REMAT_PROLOG_LOG" 2>/dev/null
  return 0
}

# The value of the first "KEY=VALUE" word of text $2 (default: the job's comment) whose key is
# $1 ("" when none).
comment_value() {
  local word
  local -a words=()
  read -r -a words <<< "${2-${SLURM_JOB_COMMENT:-}}"  # split on blanks, no glob expansion
  for word in "${words[@]}"; do
    case "$word" in "$1="*) printf '%s' "${word#"$1="}"; return 0 ;; esac
  done
  return 0
}

# The job's AdminComment as the controller has it ("" when none or when it cannot be asked).
# scontrol's multi-line form prints it on a line of its own (its value may hold blanks).
admin_comment() {
  timeout 10 scontrol show job "$SLURM_JOB_ID" 2>/dev/null |
    sed -n 's/^ *AdminComment=//p' | sed 's/[[:space:]]*$//' | head -n 1
}

main() {
  local spec
  spec=$(comment_value remat:spec)
  [ -z "$spec" ] && return 0  # not a remat job: nothing to log for every job of the cluster
  if [ -z "${SLURM_JOB_ID:-}" ]; then
    log "no SLURM_JOB_ID: not run by Slurm; not submitting"
    return 0
  fi

  # A node Prolog runs on every node of the job: act on the first only.
  if [ "${SLURM_SCRIPT_CONTEXT:-}" = prolog_slurmd ]; then
    local first
    first=$(timeout 10 scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null | head -n 1)
    if [ -n "$first" ] && [ "$first" != "${SLURMD_NODENAME:-$(hostname -s)}" ]; then
      return 0
    fi
  fi

  # Once per job: the AdminComment marker survives requeues (and a move to other nodes); the
  # state folder guards against two prologs of one start racing (mkdir is atomic).
  local admin done_id
  admin=$(admin_comment)
  done_id=$(comment_value remat:search "$admin")
  if [ -n "$done_id" ]; then
    log "search $done_id was submitted for this job already (restart ${SLURM_JOB_RESTART_COUNT:-?}); not submitting again"
    return 0
  fi
  local state="${REMAT_PROLOG_STATE_DIR:-/var/lib/remat-prolog}"
  if ! mkdir -p "$state" 2>/dev/null; then
    log "cannot create state folder $state; not submitting"
    return 0
  fi
  find "$state" -maxdepth 1 -name 'job-*' -mtime +30 -exec rm -rf {} + 2>/dev/null
  local mark="$state/job-$SLURM_JOB_ID"
  if ! mkdir "$mark" 2>/dev/null; then
    log "job already handled ($mark exists: $(cat "$mark/search" 2>/dev/null || echo 'in progress')); not submitting again"
    return 0
  fi

  if [ -z "${REMAT_COORDINATOR:-}" ]; then
    log "REMAT_COORDINATOR is not set; not submitting $spec"
    rmdir "$mark"
    return 0
  fi
  local user="${SLURM_JOB_USER:-}"
  local token=""
  if [ -n "${REMAT_MUNGE_SOCKET:-}" ]; then
    :  # the user's identity comes from munged (below), no token
  elif [ -n "${REMAT_USER_TOKENS:-}" ]; then
    if [ ! -r "$REMAT_USER_TOKENS" ]; then
      log "cannot read REMAT_USER_TOKENS=$REMAT_USER_TOKENS; not submitting $spec"
      rmdir "$mark"
      return 0
    fi
    token=$(awk -v u="$user" '$1 !~ /^#/ && NF >= 2 && $2 == u { print $1; exit }' "$REMAT_USER_TOKENS")
    if [ -z "$token" ]; then
      log "user '$user' has no token in $REMAT_USER_TOKENS; not submitting $spec"
      rmdir "$mark"
      return 0
    fi
  fi

  # Run the CLI as the job's user, in the job's folder: the spec (and any file it names) is read
  # with the user's rights, and relative paths mean what they mean to the job.
  local -a as_user=()
  if [ "$(id -u)" -eq 0 ] && [ -n "${SLURM_JOB_UID:-}" ] && [ "${SLURM_JOB_UID}" != 0 ]; then
    as_user=(setpriv "--reuid=$SLURM_JOB_UID" "--regid=${SLURM_JOB_GID:-$SLURM_JOB_UID}" --init-groups)
  fi
  local bin="${REMAT_BIN:-/usr/bin/remat}"
  local -a args=(submit --coordinator "$REMAT_COORDINATOR" --timeout 10)
  [ -n "${REMAT_MUNGE_SOCKET:-}" ] && args+=(--munge --munge-socket "$REMAT_MUNGE_SOCKET")
  # shellcheck disable=SC2206
  [ -n "${REMAT_SUBMIT_ARGS:-}" ] && args+=(${REMAT_SUBMIT_ARGS})
  args+=(-- "$spec")  # the user's word is the spec, never a flag
  local out rc
  out=$(cd "${SLURM_JOB_WORK_DIR:-/}" 2>/dev/null &&
        REMAT_TOKEN="$token" timeout -k 5 "${REMAT_PROLOG_TIMEOUT:-30}" \
          "${as_user[@]}" "$bin" "${args[@]}" 2>&1 </dev/null)
  rc=$?
  if [ $rc -ne 0 ]; then
    [ $rc -eq 124 ] && out="no answer within ${REMAT_PROLOG_TIMEOUT:-30} s"
    log "remat submit $spec as '$user' failed (exit $rc): $(printf '%s' "$out" | tail -n 1)"
    rmdir "$mark" 2>/dev/null  # not submitted: a requeue may try again
    return 0
  fi
  local id
  id=$(printf '%s\n' "$out" | tail -n 1)
  printf '%s\n' "$id" > "$mark/search"
  log "submitted remat search $id for $spec as '$user'"
  if ! timeout 10 scontrol update JobId="$SLURM_JOB_ID" AdminComment="${admin:+$admin }remat:search=$id" >/dev/null 2>&1; then
    log "could not add remat:search=$id to the job's AdminComment (the state folder still guards requeues on this host)"
  fi
  return 0
}

main "$@"
exit 0
