#!/usr/bin/env bash
# slurm-hosts.sh - a multi-node Slurm on simulated hosts, for the host-loss tests (issue #27).
#
# Usage (as root):
#   bash .ci/slurm-hosts.sh up [N]       # hosts sl1..slN (default 3), a slurmd in each; prints `export` lines
#   eval "$(bash .ci/slurm-hosts.sh env)" # SLURM_CONF and the Open MPI settings for jobs on these hosts
#   bash .ci/slurm-hosts.sh status       # the nodes' states and the daemons
#   bash .ci/slurm-hosts.sh revive slN   # after a "host loss": clear the host, restart its slurmd, resume it
#   bash .ci/slurm-hosts.sh down         # cancel jobs, stop every daemon, remove the hosts and the files
#
# The hosts are .ci/multihost.sh's (network + UTS namespaces), with a prefix
# and a subnet of their own (sl, 10.79.0.0/24) so that they never meet the mh
# hosts of .ci/hosts-tests.sh. munged and slurmctld run in the root namespace
# (a "login node" at 10.79.0.1 on the hosts' bridge); each host runs its own
# `slurmd -D -N slI` *inside* its namespaces (nsenter --net --uts: `ip netns
# exec` would remount /sys and hide /sys/fs/cgroup, and slurmd 22.05 then
# fails "Unable to initialize cgroup plugin" even with proctrack/linuxproc),
# so each node has its own address, hostname and port space: every slurmd
# listens on the same port. A host is "lost" by killing everything in it:
#   ip netns pids sl3 | xargs -r kill -9
# and `revive sl3` brings its slurmd back and resumes the node.
#
# Slurm settings that matter for host loss: KillOnBadExit=0 (a dead task does
# not end the step), SlurmdTimeout (SLURM_HOSTS_SLURMD_TIMEOUT, default 6 s:
# how long a silent node has before slurmctld sets it DOWN and srun hears
# "node failure"; srun of a step that lost a node ends only then), and
# MessageTimeout=5. Research and measurements:
# /work/shared/reference/hostloss/REPORT.md (this is its slurm_sim.sh, made
# CI-safe).
#
# Installs what is missing from apt (slurmctld slurmd slurm-client munge
# libpmix-dev: Slurm's PMIx plugin dlopen()s the unversioned libpmix.so of
# the -dev package) with the packages' init scripts kept from starting. Every
# wait is bounded. stdout carries only `export` lines (up, env) or status
# lines; progress and errors go to stderr. Exit status: 0 ok, 1 failure,
# 2 usage, 3 not permitted (not root, namespaces refused: callers skip with
# the message). `down` leaves no daemon, no process in the hosts and no
# namespace behind, and is safe to call twice. Measured here: up ~2 s with
# the packages present, down ~0.5 s.
#
# Environment (all optional):
#   SLURM_HOSTS_PREFIX          host name prefix (default sl)
#   SLURM_HOSTS_NET             the hosts' /24, three octets (default 10.79.0)
#   SLURM_HOSTS_DIR             configs, logs, spool (default /tmp/mpimesh-slurm-hosts-<prefix>)
#   SLURM_HOSTS_CTLD_PORT       slurmctld's port (default 17917)
#   SLURM_HOSTS_SLURMD_PORT     every slurmd's port (default 17918)
#   SLURM_HOSTS_SLURMD_TIMEOUT  seconds before a silent node is DOWN (default 6)
#   SLURM_HOSTS_CPUS            CPUs each node advertises (default 4)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PREFIX=${SLURM_HOSTS_PREFIX:-sl}
NET=${SLURM_HOSTS_NET:-10.79.0}
D=${SLURM_HOSTS_DIR:-/tmp/mpimesh-slurm-hosts-$PREFIX}
CTLD_PORT=${SLURM_HOSTS_CTLD_PORT:-17917}
SLURMD_PORT=${SLURM_HOSTS_SLURMD_PORT:-17918}
SLURMD_TIMEOUT=${SLURM_HOSTS_SLURMD_TIMEOUT:-6}
CPUS=${SLURM_HOSTS_CPUS:-4}
UTS=/run/mpimesh-hosts-$PREFIX   # multihost.sh's UTS namespace files
T=10                             # seconds any one system command may take

log() { printf '[slurm-hosts %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
refuse() { log "not permitted: $*"; exit 3; }
usage() { echo "usage: $0 up [N] | env | status | revive HOST | down" >&2; exit 2; }
multihost() { MPIMESH_HOSTS_PREFIX=$PREFIX MPIMESH_HOSTS_NET=$NET timeout 60 bash "$HERE/multihost.sh" "$@"; }
hosts() { timeout "$T" ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^$PREFIX[0-9]+$" | sort -V || true; }
export SLURM_CONF=$D/etc/slurm.conf

# alive PID NAME: the process exists, is no zombie, and still runs NAME (guards against PID reuse).
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
  stat=${stat##*) }
  [ "${stat%% *}" != Z ] || return 1
  tr '\0' ' ' < "/proc/$1/cmdline" 2> /dev/null | grep -q -- "$2"
}

install_packages() {
  local p missing=() added=0 rc=0 apt_log
  for p in slurmctld slurmd slurm-client munge libpmix-dev; do
    dpkg-query -W -f='${Status}' "$p" 2> /dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  [ ${#missing[@]} = 0 ] && return 0
  command -v apt-get > /dev/null || refuse "missing ${missing[*]} and no apt-get to install them"
  log "apt-get install ${missing[*]}"
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    added=1
  fi
  apt_log=$(mktemp /tmp/mpimesh-slurm-hosts-apt.XXXXXX)
  { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update -q \
      && DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}"; } \
    > "$apt_log" 2>&1 < /dev/null || rc=$?
  [ "$added" = 1 ] && rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || { tail -n 20 "$apt_log" >&2; die "apt-get failed (rc=$rc); log in $apt_log"; }
  rm -f "$apt_log"
}

# start_slurmd HOST: a slurmd inside HOST's namespaces; exec, so that $! is slurmd itself.
start_slurmd() {
  local h=$1
  ( exec nsenter --net=/run/netns/"$h" --uts="$UTS/$h" -- env TMPDIR="$D/tmp/$h" slurmd -D -N "$h" ) \
    >> "$D/log/slurmd-$h.stderr" 2>&1 < /dev/null &
  echo "slurmd $h $!" >> "$D/run/daemons"
}

# wait_state WANT SECONDS [HOST]: until sinfo shows every node (or HOST) in WANT.
wait_state() {
  local want=$1 deadline=$(( $(date +%s) + $2 )) host=${3:-} st
  while :; do
    if [ -n "$host" ]; then st=$(timeout "$T" sinfo -h -N -n "$host" -o %t 2> /dev/null | xargs || true)
    else st=$(timeout "$T" sinfo -h -N -o %t 2> /dev/null | sort | uniq -c | xargs || true); fi
    [ "$st" = "$want" ] && return 0
    [ "$(date +%s)" -lt "$deadline" ] || { log "nodes are '$st', not '$want', after $2 s"; return 1; }
    sleep 0.2
  done
}

env_lines() {
  [ -f "$SLURM_CONF" ] || die "no cluster in $D; run: bash $0 up"
  # Direct launch has no mpiexec to pass these: the jobs' ranks read them from
  # the environment srun passes on. TCP on the hosts' network only, no libfabric.
  echo "export SLURM_CONF=$SLURM_CONF"
  echo "export OMPI_MCA_btl=self,sm,tcp OMPI_MCA_mtl=^ofi OMPI_MCA_btl_tcp_if_include=$NET.0/24"
}

up() {
  local n=${1:-3} i h nodes="" rc=0
  [[ "$n" =~ ^[1-9]$ ]] || die "expecting a host count 1-9, got '$n'"
  [ "$(id -u)" = 0 ] || refuse "a Slurm on simulated hosts needs root (namespaces, daemons, apt); rerun with sudo"
  [ -e "$D/run/daemons" ] && die "$D already holds a cluster; run: bash $0 down"
  install_packages
  multihost up "$n" > /dev/null || rc=$?
  [ "$rc" = 0 ] || exit "$rc"
  mkdir -p "$D"/{etc,munge,ctld,spool,log,run,tmp}
  chmod 755 "$D" "$D/munge"; chmod 700 "$D/etc"; chmod 1777 "$D/tmp"
  : > "$D/run/daemons"
  trap 'rc=$?; [ "$rc" = 0 ] || { for f in "$D"/log/*; do [ -f "$f" ] && { echo "== $f"; tail -n 15 "$f"; }; done >&2; down; }; exit "$rc"' EXIT
  for i in $(seq 1 "$n"); do
    h=$PREFIX$i
    mkdir -p "$D/spool/slurmd-$h" "$D/tmp/$h"; chmod 1777 "$D/tmp/$h"
    nodes+="NodeName=$h NodeAddr=$NET.$((10 + i)) CPUs=$CPUS RealMemory=1000 State=UNKNOWN"$'\n'
  done
  cat > "$SLURM_CONF" <<EOF
ClusterName=mpimeshhosts
SlurmctldHost=$(hostname -s)($NET.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
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
# Slurm's PMIx plugin puts its per-job directories here: one per host, as on real nodes
TmpFS=$D/tmp/%n
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
SchedulerParameters=batch_sched_delay=0
MinJobAge=5
# a dead task must not end the step (srun --kill-on-bad-exit=0 says it too)
KillOnBadExit=0
ReturnToService=2
SlurmdParameters=config_overrides
# slurmctld pings every SlurmdTimeout/3 s and sets a silent node DOWN after SlurmdTimeout s
SlurmdTimeout=$SLURMD_TIMEOUT
MessageTimeout=5
MailProg=/bin/true
${nodes}PartitionName=debug Nodes=${PREFIX}[1-$n] Default=YES MaxTime=30 State=UP
EOF
  mungekey --create --keyfile="$D/etc/munge.key" --force > /dev/null 2>&1 \
    || { dd if=/dev/urandom of="$D/etc/munge.key" bs=1 count=1024 2> /dev/null; chmod 600 "$D/etc/munge.key"; }
  munged --foreground --force --socket="$D/munge/munge.socket" --key-file="$D/etc/munge.key" \
    --pid-file="$D/run/munged.pid" --log-file="$D/log/munged.log" --seed-file="$D/run/munged.seed" \
    > "$D/log/munged.stderr" 2>&1 < /dev/null &
  echo "munged root $!" >> "$D/run/daemons"
  for _ in $(seq 1 100); do [ -S "$D/munge/munge.socket" ] && break; sleep 0.05; done
  [ -S "$D/munge/munge.socket" ] || die "munged did not start"
  slurmctld -D > "$D/log/slurmctld.stderr" 2>&1 < /dev/null &
  echo "slurmctld root $!" >> "$D/run/daemons"
  for i in $(seq 1 "$n"); do start_slurmd "$PREFIX$i"; done
  wait_state "$n idle" 30 || die "the nodes did not come up"
  trap - EXIT
  log "up: $n nodes idle ($(hosts | xargs)); SLURM_CONF=$SLURM_CONF"
  env_lines
}

# stop_daemons [HOST]: SIGTERM (bounded), then SIGKILL, every recorded daemon (or HOST's slurmds).
stop_daemons() {
  local only=${1:-} name where pid left
  [ -f "$D/run/daemons" ] || return 0
  while read -r name where pid; do
    [ -z "$only" ] || [ "$where" = "$only" ] || continue
    alive "$pid" "$name" && kill -TERM "$pid" 2> /dev/null
  done < <(tac "$D/run/daemons")
  for _ in $(seq 1 50); do
    left=0
    while read -r name where pid; do
      [ -z "$only" ] || [ "$where" = "$only" ] || continue
      alive "$pid" "$name" && left=1
    done < "$D/run/daemons"
    [ "$left" = 0 ] && return 0
    sleep 0.1
  done
  while read -r name where pid; do
    [ -z "$only" ] || [ "$where" = "$only" ] || continue
    alive "$pid" "$name" && { log "SIGKILL $name ($where) $pid"; kill -KILL "$pid" 2> /dev/null || true; }
  done < "$D/run/daemons"
}

# clear_host HOST: kill (SIGKILL, then SIGCONT for a frozen one) whatever still runs in it.
clear_host() {
  local h=$1 pids
  for _ in $(seq 1 50); do
    pids=$(timeout "$T" ip netns pids "$h" 2> /dev/null | xargs)
    [ -z "$pids" ] && return 0
    # shellcheck disable=SC2086  # one pid per word
    { kill -KILL $pids; kill -CONT $pids; } 2> /dev/null || true
    sleep 0.1
  done
  log "warning: processes left in $h: $pids"
  return 1
}

revive() {
  local h=$1
  [ -f "$SLURM_CONF" ] || die "no cluster in $D"
  [ -e "/run/netns/$h" ] || die "no host $h (up: $(hosts | xargs))"
  clear_host "$h"
  stop_daemons "$h"
  start_slurmd "$h"
  # A node that slurmctld set DOWN comes back by itself (ReturnToService=2); one
  # it has not noticed yet is told to resume (a no-op if it is idle already).
  for _ in $(seq 1 50); do
    timeout "$T" scontrol update nodename="$h" state=resume > /dev/null 2>&1 || true
    wait_state idle 1 "$h" 2> /dev/null && { log "revived $h"; return 0; }
  done
  wait_state idle 30 "$h" || die "$h is not idle after revive"
  log "revived $h"
}

down() {
  local h rc=0
  [ "$(id -u)" = 0 ] || refuse "needs root"
  if [ -f "$D/run/daemons" ] && [ -f "$SLURM_CONF" ]; then
    timeout "$T" scancel --full --quiet --user=root > /dev/null 2>&1 || true
  fi
  for h in $(hosts); do clear_host "$h" || rc=1; done
  stop_daemons
  multihost down || rc=1
  rm -rf "$D"
  log "down"
  return "$rc"
}

status() {
  [ -f "$SLURM_CONF" ] || { log "no cluster in $D"; return 1; }
  timeout "$T" sinfo -N -o '%N %t %o %E'
  cat "$D/run/daemons"
}

case "${1:-}" in
  up) [ $# -le 2 ] || usage; up "${2:-3}" ;;
  env) [ $# = 1 ] || usage; env_lines ;;
  status) [ $# = 1 ] || usage; status ;;
  revive) [ $# = 2 ] || usage; revive "$2" ;;
  down) [ $# = 1 ] || usage; down ;;
  *) usage ;;
esac
