#!/usr/bin/env bash
# slurm-up.sh - start a throwaway single-host Slurm cluster for CI.
#
# Usage (as root):
#   eval "$(bash .ci/slurm-up.sh)"     # exports SLURM_CONF and SLURM_CI_DIR
#   sbatch --wait ...                  # use it
#   bash .ci/slurm-down.sh             # stop it (reads SLURM_CI_DIR)
#
# Installs what is missing from apt (slurmctld slurmd slurm-client munge
# libpmix-dev), writes every config, key, log, spool and state file under a
# fresh temp dir (/tmp/mpimesh-slurm.XXXXXX), starts munged, slurmctld and one
# slurmd per node on 127.0.0.1, and waits (bounded) until every node is idle.
# Daemon PIDs are recorded in $SLURM_CI_DIR/run/daemons for slurm-down.sh.
# stdout carries only the `export` lines; progress and errors go to stderr.
# If anything fails, whatever was started is stopped again and the exit
# status is non-zero. Measured here: ~1.5 s with the packages present.
#
# Environment (all optional):
#   SLURM_CI_NODES        fake nodes (default 1); >1 runs one slurmd per node
#                         on this host, named ci1..ciN and told apart by port
#   SLURM_CI_CPUS         CPUs each node advertises (default 8; more than the
#                         box has is fine, so 4-rank jobs fit on 2 cores)
#   SLURM_CI_CTLD_PORT    slurmctld port (default 16817)
#   SLURM_CI_SLURMD_PORT  first slurmd port (default 16818)
#   SLURM_CI_IDLE_TIMEOUT seconds to wait for idle nodes (default 30)
#
# Needs root and Debian 12 (Slurm 22.05). No systemd or cgroups are used.
# Recipe and measurements: /work/shared/reference/slurm-local.md.
set -euo pipefail

NODES=${SLURM_CI_NODES:-1}
CPUS=${SLURM_CI_CPUS:-8}
CTLD_PORT=${SLURM_CI_CTLD_PORT:-16817}
SLURMD_PORT=${SLURM_CI_SLURMD_PORT:-16818}
IDLE_TIMEOUT=${SLURM_CI_IDLE_TIMEOUT:-30}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
log() { printf '[slurm-up %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root (apt-get, munged, slurmd); rerun with sudo"
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "SLURM_CI_NODES must be a positive integer, got '$NODES'"
[[ "$CPUS" =~ ^[1-9][0-9]*$ ]] || die "SLURM_CI_CPUS must be a positive integer, got '$CPUS'"
port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$CTLD_PORT" $(seq "$SLURMD_PORT" $((SLURMD_PORT + NODES - 1))); do
  if port_busy "$port"; then
    die "port $port is in use (another cluster still up?); run 'bash .ci/slurm-down.sh DIR' or set SLURM_CI_CTLD_PORT/SLURM_CI_SLURMD_PORT"
  fi
done
T_ALL=$(now)

# ---------------------------------------------------------------- install
# libpmix-dev is required: Slurm's mpi/pmix plugin dlopen()s the unversioned
# .../pmix2/lib/libpmix.so, which only the -dev package ships.
PKGS=(slurmctld slurmd slurm-client munge libpmix-dev)
MISSING=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || MISSING+=("$p")
done
if [ ${#MISSING[@]} -gt 0 ]; then
  T=$(now)
  log "apt-get install ${MISSING[*]}"
  # Keep the packages' init scripts from starting system daemons (there is no
  # /etc/slurm/slurm.conf); add a deny-all policy only if none exists.
  ADDED_POLICY=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    ADDED_POLICY=1
  fi
  APT_LOG=$(mktemp /tmp/mpimesh-slurm-apt.XXXXXX)
  APT_RC=0
  { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update -q \
      && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q \
           --no-install-recommends "${MISSING[@]}"; } > "$APT_LOG" 2>&1 < /dev/null || APT_RC=$?
  [ "$ADDED_POLICY" = 1 ] && rm -f /usr/sbin/policy-rc.d
  if [ "$APT_RC" != 0 ]; then
    tail -n 20 "$APT_LOG" >&2
    die "apt-get failed (rc=$APT_RC); full log in $APT_LOG"
  fi
  rm -f "$APT_LOG"
  log "install: $(since "$T") s"
fi

# --------------------------------------------------------------- temp dir
D=$(mktemp -d /tmp/mpimesh-slurm.XXXXXX)
chmod 755 "$D"
mkdir -p "$D"/{etc,munge,ctld,spool,log,run,tmp}
chmod 700 "$D/etc"
chmod 755 "$D/munge"
chmod 1777 "$D/tmp"
: > "$D/run/daemons"
STARTED=0

on_exit() {
  local rc=$?
  if [ "$rc" != 0 ] || [ "$STARTED" != 1 ]; then
    log "start failed (rc=$rc); log tails:"
    for f in "$D"/log/*; do
      [ -f "$f" ] && { echo "== $f"; tail -n 20 "$f"; }
    done >&2
    SLURM_CI_KEEP=${SLURM_CI_KEEP:-0} bash "$HERE/slurm-down.sh" "$D" >&2 || true
    [ "$rc" = 0 ] && rc=1
  fi
  exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT TERM

# -------------------------------------------------------------- configure
HOST=$(hostname -s)
MEM=$(slurmd -C 2>/dev/null | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
MEM=${MEM:-1000}
NODE_NAMES=()
if [ "$NODES" = 1 ]; then
  NODE_NAMES=("$HOST")
else
  for k in $(seq 1 "$NODES"); do NODE_NAMES+=("ci$k"); done
fi
NODE_LINES=
for k in "${!NODE_NAMES[@]}"; do
  n=${NODE_NAMES[$k]}
  mkdir -p "$D/spool/slurmd-$n" "$D/tmp/$n"
  chmod 1777 "$D/tmp/$n"
  if [ "$NODES" = 1 ]; then
    NODE_LINES+="NodeName=$n NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"$'\n'
  else
    NODE_LINES+="NodeName=$n NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((SLURMD_PORT + k)) CPUs=$CPUS RealMemory=$MEM State=UNKNOWN"$'\n'
  fi
done
PART_NODES=$(IFS=,; echo "${NODE_NAMES[*]}")
export SLURM_CONF=$D/etc/slurm.conf
cat > "$SLURM_CONF" <<EOF
ClusterName=mpimeshci
SlurmctldHost=${HOST}(127.0.0.1)
SlurmctldPort=${CTLD_PORT}
SlurmdPort=${SLURMD_PORT}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$D/munge/munge.socket
StateSaveLocation=$D/ctld
SlurmdSpoolDir=$D/spool/slurmd-%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# Slurm's PMIx plugin puts spmix_appdir_* here; per node so fake nodes don't collide
TmpFS=$D/tmp/%n
# no cgroups: works in containers and VMs without a delegated cgroup tree
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
# as on many clusters: job scripts must say --mpi=pmix / pmi2 themselves
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
# start batch jobs at once (default batch_sched_delay=3 s)
SchedulerParameters=batch_sched_delay=0
# MinJobAge=5 keeps 'sbatch --wait' polling every 2 s (otherwise 2, 8, 32 s ...)
MinJobAge=5
KillOnBadExit=1
ReturnToService=2
# nodes may advertise more CPUs than the box has
SlurmdParameters=config_overrides
MailProg=/bin/true
${NODE_LINES}PartitionName=debug Nodes=${PART_NODES} Default=YES MaxTime=60 State=UP
EOF
cat > "$D/env.sh" <<EOF
export SLURM_CONF=$D/etc/slurm.conf
export SLURM_CI_DIR=$D
EOF

# ------------------------------------------------------------------ start
T=$(now)
record() { echo "$1 $2" >> "$D/run/daemons"; }
mungekey --create --keyfile="$D/etc/munge.key" --force > /dev/null 2>&1 \
  || { dd if=/dev/urandom of="$D/etc/munge.key" bs=1 count=1024 2> /dev/null; chmod 600 "$D/etc/munge.key"; }
munged --foreground --force --socket="$D/munge/munge.socket" --key-file="$D/etc/munge.key" \
  --pid-file="$D/run/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/run/munged.seed" \
  > "$D/log/munged.stderr" 2>&1 < /dev/null &
record munged $!
for _ in $(seq 1 100); do [ -S "$D/munge/munge.socket" ] && break; sleep 0.05; done
munge -S "$D/munge/munge.socket" -n | unmunge -S "$D/munge/munge.socket" > /dev/null \
  || die "munge self-test failed"
slurmctld -D > "$D/log/slurmctld.stderr" 2>&1 < /dev/null &
record slurmctld $!
for n in "${NODE_NAMES[@]}"; do
  slurmd -D -N "$n" > "$D/log/slurmd-$n.stderr" 2>&1 < /dev/null &
  record slurmd $!
done
STATE=
DEADLINE=$(( $(date +%s) + IDLE_TIMEOUT ))
while :; do
  STATE=$(sinfo -h -N -o %t 2> /dev/null | sort | uniq -c | xargs || true)
  [ "$STATE" = "$NODES idle" ] && break
  while read -r name pid; do
    kill -0 "$pid" 2> /dev/null || die "$name (pid $pid) exited early"
  done < "$D/run/daemons"
  [ "$(date +%s)" -lt "$DEADLINE" ] || die "nodes not idle after $IDLE_TIMEOUT s (states: '$STATE')"
  sleep 0.1
done
STARTED=1
log "$NODES node(s) idle in $(since "$T") s (total $(since "$T_ALL") s); dir $D"
cat "$D/env.sh"
