# shellcheck shell=bash
# A one-node Slurm cluster for tests, on this machine: munged, slurmctld and slurmd on loopback,
# every file (config, keys, state, spool, logs, sockets) in one private folder. Sourced by the
# Slurm tests; it installs nothing (run.sh installs slurmctld, slurmd, slurm-client and munge).
#
#   . tests/slurm/slurm_cluster.sh
#   slurm_cluster_require [TOOLS...]           # exit 77 (skipped) without Slurm, munge or root
#   slurm_cluster_start DIR PROLOG_SLURMCTLD   # returns once sinfo shows the node idle
#   sbatch ...; squeue ...                     # SLURM_CONF is exported
#   slurm_cluster_stop                         # also on EXIT: the caller traps it
#
# Why these settings: proctrack/linuxproc and task/none need no cgroup delegation (CI runs in a
# container); select/cons_tres with CR_CPU lets jobs share the node CPU by CPU; SlurmUser=root
# because the test runs as root and must not depend on a "slurm" account; munged gets its own
# key and socket so a munged of the host (if any) is neither used nor disturbed.

# slurm_cluster_require [MORE_TOOLS...]: exits 77 (ctest: skipped, with the reason) when a tool
# the cluster needs is missing or this does not run as root.
slurm_cluster_require() {
  local tool
  for tool in slurmctld slurmd munged sbatch scontrol sinfo "$@"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
      echo "SKIP: $tool is not installed (run.sh installs slurmctld, slurmd, slurm-client, munge)"
      exit 77
    fi
  done
  if [ "$(id -u)" -ne 0 ]; then
    echo "SKIP: starting slurmctld/slurmd needs root"
    exit 77
  fi
}

slurm_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# slurm_cluster_start DIR [PROLOG_SLURMCTLD] [EXTRA_CONF_LINES]
slurm_cluster_start() {
  SLURM_TEST_DIR=$1
  local prolog=${2:-}
  local extra=${3:-}
  mkdir -p "$SLURM_TEST_DIR"/{state,spool,log,munge,munge-key}
  # Jobs of other users (the prolog test submits as nobody) must reach the socket; the key stays
  # private.
  chmod 0755 "$SLURM_TEST_DIR" "$SLURM_TEST_DIR/munge"
  chmod 0700 "$SLURM_TEST_DIR/munge-key"
  local host
  host=$(hostname -s)

  # munge: a fresh key, a private socket.
  dd if=/dev/urandom of="$SLURM_TEST_DIR/munge-key/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$SLURM_TEST_DIR/munge-key/munge.key"
  MUNGE_SOCKET=$SLURM_TEST_DIR/munge/munge.socket
  munged --force --key-file="$SLURM_TEST_DIR/munge-key/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$SLURM_TEST_DIR/munge/munged.pid" --log-file="$SLURM_TEST_DIR/log/munged.log" \
    --seed-file="$SLURM_TEST_DIR/munge-key/munged.seed" || { echo "munged did not start" >&2; return 1; }

  local ctld_port slurmd_port
  ctld_port=$(slurm_free_port)
  slurmd_port=$(slurm_free_port)
  export SLURM_CONF=$SLURM_TEST_DIR/slurm.conf
  cat > "$SLURM_CONF" <<CONF
ClusterName=remattest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$SLURM_TEST_DIR/state
SlurmdSpoolDir=$SLURM_TEST_DIR/spool
SlurmctldPidFile=$SLURM_TEST_DIR/slurmctld.pid
SlurmdPidFile=$SLURM_TEST_DIR/slurmd.pid
SlurmctldLogFile=$SLURM_TEST_DIR/log/slurmctld.log
SlurmdLogFile=$SLURM_TEST_DIR/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=3
MinJobAge=600
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
JobRequeue=1
${prolog:+PrologSlurmctld=$prolog}
$extra
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF

  slurmctld -i -f "$SLURM_CONF" || { echo "slurmctld did not start" >&2; return 1; }
  slurmd -f "$SLURM_CONF" || { echo "slurmd did not start" >&2; return 1; }
  local state
  for _ in $(seq 1 60); do
    state=$(sinfo -h -N -o '%t' 2>/dev/null | head -n 1)
    [ "$state" = idle ] && return 0
    sleep 1
  done
  echo "node not idle after 60 s (state: ${state:-none})" >&2
  tail -n 20 "$SLURM_TEST_DIR/log/slurmctld.log" "$SLURM_TEST_DIR/log/slurmd.log" >&2
  return 1
}

slurm_stop_pidfile() {
  local f=$1 pid
  [ -r "$f" ] || return 0
  pid=$(cat "$f" 2>/dev/null)
  [ -n "$pid" ] || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -9 "$pid" 2>/dev/null || true
}

slurm_cluster_stop() {
  [ -n "${SLURM_TEST_DIR:-}" ] || return 0
  # slurmd leaves running steps (slurmstepd) behind when it stops: end the jobs first.
  local ids
  ids=$(squeue -h -o %A 2>/dev/null)
  if [ -n "$ids" ]; then
    # shellcheck disable=SC2086
    scancel $ids 2>/dev/null
    for _ in $(seq 1 100); do
      [ -z "$(squeue -h -o %A 2>/dev/null)" ] && break
      sleep 0.1
    done
  fi
  slurm_stop_pidfile "$SLURM_TEST_DIR/slurmd.pid"
  slurm_stop_pidfile "$SLURM_TEST_DIR/slurmctld.pid"
  slurm_stop_pidfile "$SLURM_TEST_DIR/munge/munged.pid"
}
