#!/bin/bash
# The Slurm launcher (remat-worker --executor slurm, worker/slurm_launcher.h) against a real
# Slurm on this machine (slurm_cluster.sh): rematd on loopback, one worker that submits every
# trial as a Slurm job, remat-trial (the CPU engine) as the ranks.
#
#   slurm_executor_test.sh BUILD_DIR SOURCE_DIR
#
# Checks: a guided search of examples/tiny-dense.yaml finishes with every trial run as its own
# Slurm job (one job per trial, each COMPLETED, trial statuses from the ranks' results), the
# worker following its jobs with one batched squeue per poll interval (no scontrol per job) and
# charging them to the search owner's account (--slurm-user-accounts); a TP 2
# search whose trials are jobs of two tasks (two CPU ranks over TCP) ends ok with both ranks'
# figures; a trial past search.trial_timeout_s is scancelled and reported timeout; a job Slurm
# requeues runs again and its trial ends ok; the job of a worker killed with SIGKILL is
# scancelled by the next worker on its work dir; no job is left behind. Exit 77 (ctest: skipped) without Slurm/munge or root.
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
. "$src/tests/slurm/slurm_cluster.sh"
slurm_cluster_require
[ -x "$build/bin/remat-trial" ] || { echo "SKIP: no remat-trial (engine not built)"; exit 77; }

T=$(mktemp -d /tmp/remat-slurm-exec.XXXXXX)
rematd_pid="" worker_pid=""
failed=0
cleanup() {
  [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
  slurm_cluster_stop
  [ -n "$rematd_pid" ] && kill "$rematd_pid" 2>/dev/null && wait "$rematd_pid" 2>/dev/null
  if [ "$failed" -eq 0 ]; then rm -rf "$T"; else echo "files kept in $T"; fi
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  failed=1
  echo "--- worker log (tail)"; tail -n 30 "$T/worker.err"
  echo "--- jobs"; scontrol show job -o 2>/dev/null | cut -c1-300
  exit 1
}
pass() { echo "ok: $* [$(($(date +%s) - start)) s]"; }
start=$(date +%s)

slurm_cluster_start "$T/slurm" || fail "Slurm did not start"
pass "slurmctld + slurmd up, node idle, $(nproc) CPUs"

# Searches belong to alice (a user token), whose trials the worker charges to her account.
echo "tok-alice alice" > "$T/users.tokens"
echo "tok-alice" > "$T/alice.token"
echo "alice ml-alice" > "$T/accounts"
"$build/bin/rematd" --listen 127.0.0.1:0 --db "$T/rematd.db" --log-level warn \
  --user-tokens "$T/users.tokens" > "$T/rematd.out" 2> "$T/rematd.err" &
rematd_pid=$!
for _ in $(seq 1 100); do
  addr=$(sed -n 's/^rematd listening on //p' "$T/rematd.out")
  [ -n "$addr" ] && break
  sleep 0.1
done
[ -n "$addr" ] || fail "rematd did not start: $(cat "$T/rematd.err")"
remat() { "$build/bin/remat" "$@" --coordinator "$addr" --token-file "$T/alice.token"; }

# The worker's Slurm commands go through shims that log each call (then run the real one), so
# the test counts how the worker asks Slurm about its jobs.
mkdir -p "$T/shim"
for tool in squeue scontrol sacct; do
  real=$(command -v $tool)
  printf '#!/bin/sh\necho "%s $*" >> %s/slurm-calls.log\nexec %s "$@"\n' "$tool" "$T" "$real" \
    > "$T/shim/$tool"
  chmod +x "$T/shim/$tool"
done

# The worker offers 2 slots: at most 2 ranks submitted to Slurm at once (the node's 2 CPUs).
start_worker() {
  PATH="$T/shim:$PATH" "$build/bin/remat-worker" --coordinator "$addr" --executor slurm \
    --plain-slots 2 --trial-binary "$build/bin/remat-trial" --work-dir "$T/work" \
    --slurm-partition debug --slurm-arg=--cpus-per-task=1 --slurm-account remat \
    --slurm-user-accounts "$T/accounts" --slurm-poll-interval 1 \
    > "$T/worker.out" 2>> "$T/worker.err" &
  worker_pid=$!
}
start_worker

# wait_search ID -> the search's JSON in $T/ID.json once it has ended
wait_search() {
  local state=""
  for _ in $(seq 1 240); do
    remat get "$1" --json > "$T/$1.json" 2>/dev/null &&
      state=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["state"])' "$T/$1.json")
    case "$state" in succeeded | failed | cancelled) return 0 ;; esac
    sleep 0.5
  done
  fail "search $1 still ${state:-unknown} after 120 s"
}
job_field() { scontrol show job -o "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
# jobs_table -> "JobId JobState NumTasks ExitCode JobName" per job the worker submitted
jobs_table() {
  scontrol show job -o | python3 -c '
import re, sys
for line in sys.stdin:
    f = dict(re.findall(r"(\w+)=(\S*)", line))
    if f.get("JobName", "").startswith("remat-"):
        print(f["JobId"], f["JobState"], f["NumTasks"], f["ExitCode"], f["JobName"])'
}

# 1. A guided search: every trial a Slurm job of one task.
cp "$src/examples/tiny-dense.yaml" "$T/tiny.yaml"
# A fixed 5-step window (noise_target 0): this test times Slurm, not the adaptive measurement,
# whose 5 to 20 steps per trial would make the search's length depend on the machine's load.
sed -i 's/^  device: auto/  device: cpu\n  noise_target: 0/' "$T/tiny.yaml"
id=$(remat submit "$T/tiny.yaml") || fail "submit refused"
wait_search "$id"
python3 - "$T/$id.json" > "$T/summary" <<'EOF' || fail "search $id: $(cat "$T/summary")"
import json, sys
s = json.load(open(sys.argv[1]))
run = [t for t in s["trials"] if not t["reused"]]
bad = [t for t in run if t["status"] not in ("ok", "oom")]
if s["state"] != "succeeded" or not run or bad:
    print(s["state"], [(t["policy"], t["status"], t["message"]) for t in bad]); sys.exit(1)
print(len(run), sum(t["status"] == "ok" for t in run), sum(t["status"] == "oom" for t in run))
EOF
read -r trials ok oom < "$T/summary"
jobs_table > "$T/jobs1"
[ "$(wc -l < "$T/jobs1")" -eq "$trials" ] || fail "$trials trials but $(wc -l < "$T/jobs1") Slurm jobs"
awk '$2 != "COMPLETED" || $3 != 1 { exit 1 }' "$T/jobs1" || fail "jobs: $(cat "$T/jobs1")"
pass "guided search $id succeeded: $trials trials ($ok ok, $oom oom), each a COMPLETED Slurm job of 1 task"

# The worker followed its jobs with one squeue per poll for all of them (never a per-job
# scontrol), some polls asking about two jobs at once; each job was charged to alice's account.
cp "$T/slurm-calls.log" "$T/calls1"
polls=$(grep -c '^squeue .*--jobs=' "$T/calls1")
batched=$(grep '^squeue .*--jobs=' "$T/calls1" | grep -c -- '--jobs=[0-9_]*,')
per_job=$(grep -c '^scontrol show job' "$T/calls1")
[ "$polls" -gt 0 ] && [ "$per_job" -eq 0 ] ||
  fail "polls: $polls squeue, $per_job scontrol show job: $(tail -n 5 "$T/calls1")"
[ "$batched" -gt 0 ] || fail "no poll asked about two jobs at once: $(grep -- --jobs= "$T/calls1" | tail -n 5)"
seconds=$(($(date +%s) - start))
[ "$polls" -le $((seconds * 2 + 5)) ] || fail "$polls polls in about $seconds s with a 1 s interval"
accounts=$(squeue -h -t all -o '%a %j' | awk '$2 ~ /^remat-/ {print $1}' | sort -u | tr '\n' ' ')
[ "$accounts" = "ml-alice " ] || fail "jobs charged to '$accounts', not alice's ml-alice"
pass "batched poll: $polls squeue calls for $trials jobs ($batched about two jobs at once), no scontrol per job; every job charged to ml-alice"

# 2. TP 2: each trial one job of two tasks, two CPU ranks meeting over TCP.
python3 - "$T/tiny.yaml" "$T/tp2.yaml" <<'EOF'
import sys
text = open(sys.argv[1]).read().replace("name: tiny-dense", "name: tiny-dense-tp2")
text = text.replace("  max_trials: 12", "  max_trials: 2")
text += "parallel:\n  tensor_model_parallel_size: 2\n"
open(sys.argv[2], "w").write(text)
EOF
id2=$(remat submit "$T/tp2.yaml") || fail "submit of the TP 2 spec refused"
wait_search "$id2"
python3 - "$T/$id2.json" > "$T/summary2" <<'EOF' || fail "TP 2 search $id2: $(cat "$T/summary2")"
import json, sys
s = json.load(open(sys.argv[1]))
run = [t for t in s["trials"] if not t["reused"]]
good = [t for t in run if t["status"] == "ok" and sorted(r["rank"] for r in t["ranks"]) == [0, 1]]
if s["state"] != "succeeded" or not good:
    print(s["state"], [(t["policy"], t["status"], len(t["ranks"]), t["message"]) for t in run]); sys.exit(1)
t = good[0]
print(len(run), t["policy"], t["step_time_s"], t["tokens_per_s"])
EOF
read -r trials2 policy2 step2 tps2 < "$T/summary2"
awk '{ print $1 }' "$T/jobs1" > "$T/ids1"
jobs_table | awk 'NR == FNR { seen[$1] = 1; next } !($1 in seen)' "$T/ids1" - > "$T/jobs2"
[ "$(wc -l < "$T/jobs2")" -eq "$trials2" ] || fail "$trials2 TP 2 trials but jobs: $(cat "$T/jobs2")"
awk '$2 != "COMPLETED" || $3 != 2 { exit 1 }' "$T/jobs2" || fail "TP 2 jobs: $(cat "$T/jobs2")"
pass "TP 2 search $id2 succeeded: $trials2 trials, each a COMPLETED job of 2 tasks ($policy2: step $step2 s, $tps2 tokens/s, ranks 0 and 1)"

# 3. A trial past its timeout: the worker scancels the job and reports timeout.
python3 - "$T/tiny.yaml" "$T/slow.yaml" <<'EOF'
import sys
text = open(sys.argv[1]).read().replace("name: tiny-dense", "name: tiny-dense-slow")
text = text.replace("  max_trials: 12", "  max_trials: 1").replace("  measure_steps: 5", "  measure_steps: 100000")
text = text.replace("  memory_budget_gib: 0.0068", "  memory_budget_gib: 1")  # the first trial fits
text += "  trial_timeout_s: 3\n"
open(sys.argv[2], "w").write(text)
EOF
id3=$(remat submit "$T/slow.yaml") || fail "submit of the slow spec refused"
wait_search "$id3"
python3 - "$T/$id3.json" > "$T/summary3" <<'EOF' || fail "slow search $id3: $(cat "$T/summary3")"
import json, sys
s = json.load(open(sys.argv[1]))
t = [t for t in s["trials"] if not t["reused"]]
if len(t) != 1 or t[0]["status"] != "timeout" or "scancelled" not in t[0]["message"]:
    print([(x["status"], x["message"]) for x in t]); sys.exit(1)
print(t[0]["message"])
EOF
jobs_table | awk 'NR == FNR { seen[$1] = 1; next } !($1 in seen)' \
  <(cat "$T/jobs1" "$T/jobs2" | awk '{print $1}') - > "$T/jobs3"
awk '$2 != "CANCELLED" { exit 1 }' "$T/jobs3" && [ -s "$T/jobs3" ] || fail "slow job: $(cat "$T/jobs3")"
pass "timeout: trial reported timeout ($(cat "$T/summary3")); its job $(awk '{print $1, $2}' "$T/jobs3")"

# 4. Slurm requeues a trial's running job (as after a node failure or a preemption): the job
# runs again from a clean folder and the trial ends ok, from the second run's ranks.
sed 's/^  trial_timeout_s: 3$/  trial_timeout_s: 120/; s/^  measure_steps: 100000$/  measure_steps: 150/; s/name: tiny-dense-slow/name: tiny-dense-requeue/' \
  "$T/slow.yaml" > "$T/requeue.yaml"
id5=$(remat submit "$T/requeue.yaml") || fail "submit of the requeue spec refused"
requeued=""
for _ in $(seq 1 60); do
  requeued=$(squeue -h -t RUNNING -o %A | head -n 1)
  [ -n "$requeued" ] && break
  sleep 0.5
done
[ -n "$requeued" ] || fail "the trial's job never ran"
sleep 1
scontrol requeue "$requeued" || fail "scontrol requeue $requeued failed"
# Slurm holds a requeued job back two minutes (its BeginTime); once it is pending again,
# release it now.
for _ in $(seq 1 60); do
  [ "$(job_field "$requeued" JobState)" = PENDING ] && break
  sleep 0.5
done
scontrol update JobId="$requeued" StartTime=now || fail "cannot release the requeued job $requeued"
wait_search "$id5"
python3 - "$T/$id5.json" > "$T/summary5" <<'EOF' || fail "requeue search $id5: $(cat "$T/summary5")"
import json, sys
s = json.load(open(sys.argv[1]))
t = [t for t in s["trials"] if not t["reused"]]
if len(t) != 1 or t[0]["status"] != "ok" or t[0]["attempts"] != 1:
    print([(x["status"], x["attempts"], x["message"]) for x in t]); sys.exit(1)
print(t[0]["policy"], t[0]["step_time_s"])
EOF
[ "$(job_field "$requeued" JobState)" = COMPLETED ] && [ "$(job_field "$requeued" Restarts)" = 1 ] ||
  fail "job $requeued: $(job_field "$requeued" JobState), restarts $(job_field "$requeued" Restarts)"
pass "requeued job $requeued ran again (restarts 1); its trial ended ok in one attempt ($(cat "$T/summary5"))"

# 5. A worker killed outright leaves its job in Slurm; the next worker on its work dir ends it.
sed 's/^  trial_timeout_s: 3$/  trial_timeout_s: 600/; s/name: tiny-dense-slow/name: tiny-dense-orphan/' \
  "$T/slow.yaml" > "$T/orphan.yaml"
id4=$(remat submit "$T/orphan.yaml") || fail "submit of the orphan spec refused"
orphan=""
for _ in $(seq 1 60); do
  orphan=$(squeue -h -t RUNNING -o %A | head -n 1)
  [ -n "$orphan" ] && break
  sleep 0.5
done
[ -n "$orphan" ] || fail "the trial's job never ran"
{ kill -9 "$worker_pid"; wait "$worker_pid"; } 2>/dev/null
sleep 2
[ "$(squeue -h -j "$orphan" -o %T)" = RUNNING ] || fail "job $orphan did not outlive its worker"
start_worker
for _ in $(seq 1 40); do
  [ "$(job_field "$orphan" JobState)" = CANCELLED ] && break
  sleep 0.5
done
[ "$(job_field "$orphan" JobState)" = CANCELLED ] || fail "job $orphan left running by the new worker"
grep -q "cancelled 1 Slurm job(s) a previous worker on this work dir left: $orphan" "$T/worker.err" ||
  fail "no log line for the orphaned job"
pass "worker killed (SIGKILL): its job $orphan kept running; the next worker on the work dir scancelled it"
remat cancel "$id4" > /dev/null || fail "cancel of $id4 refused"
for _ in $(seq 1 60); do
  [ -z "$(squeue -h -o %A)" ] && break
  sleep 0.5
done

[ -z "$(squeue -h -o %A)" ] || fail "jobs left in Slurm: $(squeue -h)"
pass "no job left in Slurm"
echo "--- Slurm jobs"
jobs_table
echo "PASS ($(($(date +%s) - start)) s)"
