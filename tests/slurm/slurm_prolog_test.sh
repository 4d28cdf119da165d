#!/bin/bash
# The Slurm trigger (deploy/slurm/prolog-remat-submit.sh) against a real Slurm on this machine:
# munged + slurmctld + slurmd on loopback (slurm_cluster.sh), rematd with user tokens, the
# project's prolog as PrologSlurmctld. Jobs are submitted as the user "nobody".
#
#   slurm_prolog_test.sh BUILD_DIR SOURCE_DIR
#
# Checks: the prolog runs with the environment Slurm gives it (SLURM_* only, no PATH); a job
# asking for a search runs, and the search exists, owned by the job's user (who can `remat get`
# it; another user cannot), with the user's comment kept and the marker in AdminComment, which
# the user cannot set (a marker in the user's own comment is ignored); a requeue submits nothing
# new; a spec the user cannot read is not submitted (the CLI runs as the user); with the
# coordinator down the job still runs and the node is not drained; as the node Prolog (a second
# cluster) it submits once, from the job's first node. Exit 77 (ctest: skipped) when
# Slurm or munge is not installed or the test does not run as root.
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/slurm/slurm_cluster.sh"
slurm_cluster_require setpriv

T=$(mktemp -d /tmp/remat-slurm-prolog.XXXXXX)
chmod 0755 "$T"
rematd_pid=""
rematd_args=()
cleanup() {
  slurm_cluster_stop
  [ -n "$rematd_pid" ] && kill "$rematd_pid" 2>/dev/null && wait "$rematd_pid" 2>/dev/null
  if [ "${failed:-0}" -eq 0 ]; then rm -rf "$T"; else echo "files kept in $T"; fi
}
trap cleanup EXIT
failed=0
fail() {
  echo "FAIL: $*"
  failed=1
  echo "--- prolog log"; cat "$T/prolog.log" 2>/dev/null
  echo "--- slurmctld log (tail)"; tail -n 20 "$T/slurm/log/slurmctld.log" 2>/dev/null
  exit 1
}
pass() { echo "ok: $*"; }

# rematd with two users' tokens, plaintext on loopback.
printf 'tok-nobody nobody\ntok-alice alice\n' > "$T/users.tokens"
echo tok-nobody > "$T/nobody.token"
echo tok-alice > "$T/alice.token"
start_rematd() {  # a fresh database each time; its address in $addr and $T/coordinator
  # (the old output too: the new process truncates it only once it runs, after we may read it)
  rm -f "$T"/rematd.db* "$T/rematd.out"
  "$build/bin/rematd" --listen 127.0.0.1:0 --db "$T/rematd.db" --user-tokens "$T/users.tokens" \
    --log-level warn "${rematd_args[@]}" > "$T/rematd.out" 2> "$T/rematd.err" &
  rematd_pid=$!
  addr=""
  for _ in $(seq 1 100); do
    addr=$(sed -n 's/^rematd listening on //p' "$T/rematd.out")
    [ -n "$addr" ] && break
    sleep 0.1
  done
  [ -n "$addr" ] || fail "rematd did not start: $(cat "$T/rematd.err")"
  echo "$addr" > "$T/coordinator"
}
start_rematd
remat() { "$build/bin/remat" "$@" --coordinator "$addr"; }

# The prolog runs the CLI as the job's user, who may not reach the build folder (a checkout in
# /root, say): a copy where everyone can run it.
install -D -m 0755 "$build/bin/remat" "$T/bin/remat"

# Slurm gives prologs no environment of ours, and no PATH: the wrapper keeps only the SLURM_*
# variables slurmctld (or slurmd) passed, adds the prolog's settings (what
# /etc/default/remat-prolog holds on a real controller) and runs the project's prolog with
# nothing else: env -i, no PATH, no HOME. It records what the prolog was given.
cat > "$T/prolog.sh" <<EOF
#!/bin/bash
keep=()
while IFS= read -r -d '' v; do
  case "\$v" in SLURM_*) keep+=("\$v") ;; esac
done < /proc/self/environ
printf '%s\n' "\${keep[@]}" | cut -d= -f1 | sort > "$T/prolog-env.\$SLURM_JOB_ID"
exec /usr/bin/env -i "\${keep[@]}" SLURM_CONF="$T/slurm/slurm.conf" \\
  REMAT_COORDINATOR="\$(/bin/cat "$T/coordinator")" REMAT_USER_TOKENS="$T/users.tokens" \\
  REMAT_BIN="$T/bin/remat" REMAT_PROLOG_STATE_DIR="$T/prolog-state" \\
  REMAT_PROLOG_LOG="$T/prolog.log" REMAT_PROLOG_TIMEOUT=15 \\
  "$src/deploy/slurm/prolog-remat-submit.sh"
EOF
chmod 0755 "$T/prolog.sh"
touch "$T/prolog.log"

start=$(date +%s)
slurm_cluster_start "$T/slurm" "$T/prolog.sh" || fail "Slurm did not start"
pass "slurmctld + slurmd up, node idle ($(($(date +%s) - start)) s)"

mkdir -p "$T/jobs"
cp "$src/examples/tiny-dense.yaml" "$T/jobs/spec.yaml"
chown -R nobody: "$T/jobs"
as_nobody() { runuser -u nobody -- env SLURM_CONF="$SLURM_CONF" "$@"; }

# admin_comment ID -> the job's AdminComment (scontrol prints it on a line of its own)
admin_comment() { scontrol show job "$1" | sed -n 's/^ *AdminComment=//p' | sed 's/[[:space:]]*$//'; }
# job_state ID -> JobState (e.g. COMPLETED)
job_field() { scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
wait_job() {  # wait_job ID STATE [RESTARTS]
  local s r
  for _ in $(seq 1 120); do
    s=$(job_field "$1" JobState)
    r=$(job_field "$1" Restarts)
    [ "$s" = "$2" ] && [ "${3:-$r}" = "$r" ] && return 0
    sleep 0.5
  done
  fail "job $1 is $s (restarts $r), expected $2${3:+ after $3 restart(s)}"
}
search_ids() { remat list --token-file "$T/nobody.token" | awk 'NR > 1 && $1 ~ /^s-/ { print $1 }'; }

# 1. A job asks for a search in its comment; the search belongs to the job's user.
job=$(cd "$T/jobs" && as_nobody sbatch --parsable --chdir="$T/jobs" -o out-%j.log \
        --comment="nightly run remat:spec=spec.yaml" --wrap "echo training")
[ -n "$job" ] || fail "sbatch refused the job"
wait_job "$job" COMPLETED
[ "$(cat "$T/jobs/out-$job.log")" = training ] || fail "job $job did not run its script"
pass "job $job ran"
grep -q '^PATH$' "$T/prolog-env.$job" && fail "the prolog was given a PATH"
comment=$(scontrol show job "$job" | sed -n 's/^ *Comment=//p' | sed 's/[[:space:]]*$//')
[ "$comment" = "nightly run remat:spec=spec.yaml" ] || fail "comment is '$comment'"
admin=$(admin_comment "$job")
id=${admin##*remat:search=}
[ "$admin" = "remat:search=$id" ] && [ -n "$id" ] || fail "AdminComment is '$admin'"
pass "with no PATH ($(tr '\n' ' ' < "$T/prolog-env.$job")given): comment kept, AdminComment '$admin'"
# The user cannot touch the marker: AdminComment is the operators' field (a job of theirs that
# is still pending or running; they may edit its Comment but not its AdminComment).
held=$(as_nobody sbatch --parsable --chdir="$T/jobs" -o /dev/null --hold --wrap true)
as_nobody scontrol update JobId="$held" Comment="edited by its user" ||
  fail "the user cannot edit their job's comment"
if as_nobody scontrol update JobId="$held" AdminComment=remat:search=s-forged > "$T/forge.out" 2>&1; then
  fail "the job's user could set its AdminComment"
fi
scancel "$held"
pass "the job's user edits its Comment but cannot set its AdminComment ($(tail -n 1 "$T/forge.out"))"
owner=$(remat get "$id" --json --token-file "$T/nobody.token" | python3 -c 'import json,sys; print(json.load(sys.stdin)["owner"])') ||
  fail "the job's user cannot get search $id"
[ "$owner" = nobody ] || fail "search $id is owned by '$owner'"
pass "search $id owned by nobody, who can remat get it"
if remat get "$id" --token-file "$T/alice.token" > /dev/null 2>&1; then
  fail "another user sees search $id"
fi
pass "another user (alice) cannot see it"
grep -q "submitted remat search $id for spec.yaml as 'nobody'" "$T/prolog.log" || fail "no log line for the submission"

# 2. Requeue: the job runs again, no second search.
scontrol requeue "$job" || fail "scontrol requeue $job failed"
# Slurm holds a requeued job back two minutes (its BeginTime); release it now.
scontrol update JobId="$job" StartTime=now || fail "cannot release the requeued job $job"
wait_job "$job" COMPLETED 1
[ "$(search_ids | wc -l)" -eq 1 ] || fail "after the requeue: searches $(search_ids | tr '\n' ' ')"
grep -q "search $id was submitted for this job already (restart 1)" "$T/prolog.log" ||
  fail "no log line for the requeue"
pass "requeued job $job ran again (restarts 1), still one search"

# 3. A spec the job's user cannot read is not submitted: the CLI runs as the user, not as root.
install -m 0600 -o root "$src/examples/tiny-dense.yaml" "$T/root-only.yaml"
job=$(as_nobody sbatch --parsable --chdir="$T/jobs" -o /dev/null \
        --comment="remat:spec=$T/root-only.yaml" --wrap true)
wait_job "$job" COMPLETED
[ "$(search_ids | wc -l)" -eq 1 ] || fail "a search was submitted from a spec nobody cannot read"
grep "job $job: remat submit" "$T/prolog.log" | grep -q "as 'nobody' failed (exit" ||
  fail "no log line for the unreadable spec"
pass "job $job: spec unreadable by its user, not submitted ($(grep "job $job:" "$T/prolog.log" | sed 's/.*failed/failed/'))"

# 3b. A marker in the user's own Comment means nothing: only AdminComment counts.
job=$(as_nobody sbatch --parsable --chdir="$T/jobs" -o /dev/null \
        --comment="remat:spec=spec.yaml remat:search=s-forged" --wrap true)
wait_job "$job" COMPLETED
[ "$(search_ids | wc -l)" -eq 2 ] || fail "a forged comment marker stopped the submission"
admin=$(admin_comment "$job")
[ "${admin#remat:search=s-}" != "$admin" ] && [ "$admin" != "remat:search=s-forged" ] ||
  fail "AdminComment of job $job is '$admin'"
pass "job $job: a remat:search= in the user's comment is ignored; submitted, AdminComment '$admin'"

# 4. Coordinator down: the job runs anyway, the node is not drained.
kill "$rematd_pid"
wait "$rematd_pid" 2>/dev/null
rematd_pid=""
job=$(as_nobody sbatch --parsable --chdir="$T/jobs" -o out-%j.log \
        --comment="remat:spec=spec.yaml" --wrap "echo still")
wait_job "$job" COMPLETED
[ "$(cat "$T/jobs/out-$job.log")" = still ] || fail "job $job did not run with the coordinator down"
node_state=$(sinfo -h -N -o '%t' | head -n 1)
case "$node_state" in idle | mix | alloc) ;; *) fail "node is $node_state" ;; esac
grep "job $job:" "$T/prolog.log" | grep -q "failed (exit" || fail "no log line for the failed submit"
[ "$(scontrol show job "$job" | sed -n 's/^ *Comment=//p' | sed 's/[[:space:]]*$//')" = "remat:spec=spec.yaml" ] ||
  fail "comment of job $job changed"
pass "coordinator down: job $job ran, node $node_state, logged: $(grep "job $job:" "$T/prolog.log" | sed 's/.*remat-prolog //')"
# 5. The same prolog as the node Prolog (it runs on every node of a job, as root), and with the
# user's identity from MUNGE instead of a token file: a fresh cluster, rematd taking the
# cluster's munge credentials (--munge-socket), the prolog given no token file at all; the
# job's first node submits, once, as the job's user.
slurm_cluster_stop
rm -rf "$T/slurm" "$T/prolog-state"
sed -i "s#REMAT_USER_TOKENS=\"$T/users.tokens\"#REMAT_MUNGE_SOCKET=\"$T/slurm/munge/munge.socket\"#" "$T/prolog.sh"
grep -q REMAT_USER_TOKENS "$T/prolog.sh" && fail "the prolog still gets the token file"
slurm_cluster_start "$T/slurm" "" "Prolog=$T/prolog.sh" || fail "Slurm did not start with a node Prolog"
rematd_args=(--munge-socket "$MUNGE_SOCKET")
start_rematd
job=$(as_nobody sbatch --parsable --chdir="$T/jobs" -o /dev/null \
        --comment="node prolog remat:spec=spec.yaml" --wrap true)
wait_job "$job" COMPLETED
[ "$(search_ids | wc -l)" -eq 1 ] || fail "node Prolog: searches $(search_ids | tr '\n' ' ')"
id=$(search_ids)
[ "$(admin_comment "$job")" = "remat:search=$id" ] || fail "AdminComment is '$(admin_comment "$job")'"
pass "node Prolog with MUNGE: job $job ran, search $id submitted once for nobody (no token file on the controller), AdminComment 'remat:search=$id'"
# A MUNGE credential counts once: the same credential sent again is refused (munged detects
# the replay), so a credential seen on the wire cannot be used by someone else.
cred=$(runuser -u nobody -- munge -n -S "$MUNGE_SOCKET") || fail "munge -n as nobody failed"
/usr/bin/python3 "$src/tests/slurm/munge_replay.py" "$addr" "$cred" "$build/clients/python" \
  > "$T/replay.out" 2>&1 || fail "MUNGE replay: $(cat "$T/replay.out")"
pass "a replayed MUNGE credential is refused: $(tail -n 1 "$T/replay.out")"

echo "--- prolog log"
cat "$T/prolog.log"
echo "PASS ($(($(date +%s) - start)) s)"
