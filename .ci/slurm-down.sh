#!/usr/bin/env bash
# slurm-down.sh - stop a cluster started by slurm-up.sh and remove its files.
#
# Usage (as root):
#   bash .ci/slurm-down.sh [DIR]      # DIR defaults to $SLURM_CI_DIR
#
# Cancels any jobs left, then stops slurmd(s), slurmctld and munged by the
# PIDs slurm-up.sh recorded in DIR/run/daemons, in reverse start order:
# SIGTERM, a bounded wait, then SIGKILL. A PID is signalled only while its
# command line still names the daemon (guards against PID reuse). Removes DIR
# unless SLURM_CI_KEEP=1. Safe to call twice. Exit status is non-zero only if
# a daemon survived SIGKILL. Measured here: ~0.2 s.
#
# Environment (all optional):
#   SLURM_CI_DIR   the cluster's dir, if not given as an argument
#   SLURM_CI_KEEP  1 keeps DIR (configs, logs) for inspection
set -uo pipefail

D=${1:-${SLURM_CI_DIR:-}}
log() { printf '[slurm-down %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

if [ -z "$D" ]; then
  log "error: no cluster dir; pass it as an argument or set SLURM_CI_DIR (printed by slurm-up.sh)"
  exit 2
fi
if [ ! -f "$D/run/daemons" ]; then
  log "nothing to stop: $D/run/daemons does not exist"
  exit 0
fi
T=$(now)
export SLURM_CONF=$D/etc/slurm.conf

# alive PID NAME: the process exists, is not a zombie, and is still NAME.
alive() {
  local stat
  stat=$(cat "/proc/$1/stat" 2> /dev/null) || return 1
  stat=${stat##*) }                 # fields after "(comm) "
  [ "${stat%% *}" != Z ] || return 1
  tr '\0' ' ' < "/proc/$1/cmdline" 2> /dev/null | grep -q -- "$2"
}

# ------------------------------------------------------- cancel jobs first
mapfile -t ENTRIES < "$D/run/daemons"
if [ ${#ENTRIES[@]} -ge 3 ] && [ -f "$SLURM_CONF" ]; then
  JOBS=$(timeout 10 squeue -h -o %i 2> /dev/null || true)
  if [ -n "$JOBS" ]; then
    log "cancelling jobs: $(echo "$JOBS" | xargs)"
    # shellcheck disable=SC2086  # one job id per word
    timeout 10 scancel $JOBS 2> /dev/null || true
    for _ in $(seq 1 100); do
      [ -z "$(timeout 5 squeue -h -o %i 2> /dev/null)" ] && break
      sleep 0.1
    done
  fi
fi

# --------------------------------------------- stop daemons, reverse order
RC=0
for (( i = ${#ENTRIES[@]} - 1; i >= 0; i-- )); do
  read -r name pid <<< "${ENTRIES[$i]}"
  alive "$pid" "$name" || continue
  kill -TERM "$pid" 2> /dev/null
  for _ in $(seq 1 150); do alive "$pid" "$name" || break; sleep 0.1; done
  if alive "$pid" "$name"; then
    log "$name ($pid) ignored SIGTERM for 15 s; SIGKILL"
    kill -KILL "$pid" 2> /dev/null
    for _ in $(seq 1 50); do alive "$pid" "$name" || break; sleep 0.1; done
    if alive "$pid" "$name"; then log "error: $name ($pid) survived SIGKILL"; RC=1; fi
  fi
  wait "$pid" 2> /dev/null   # reaps it if it is our child (slurm-jobs.sh)
done
: > "$D/run/daemons"
log "stopped in $(since "$T") s"
if [ "${SLURM_CI_KEEP:-0}" = 1 ]; then
  log "kept $D"
else
  rm -rf "$D"
fi
exit "$RC"
