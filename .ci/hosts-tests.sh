#!/usr/bin/env bash
# hosts-tests.sh - the tests across simulated hosts (issue #13), as CI runs them.
#
# Usage (as root, from anywhere):
#   bash .ci/hosts-tests.sh
#   HOSTS_TESTS_ONLY=mesh bash .ci/hosts-tests.sh    # one step: mesh | trees | hosts
#
# Brings two simulated hosts up with multihost.sh (mh1, mh2; taken down again
# by an EXIT trap, whatever happens) and runs, each step bounded by `timeout`:
#   check   a 2-rank MPI job across the hosts (names, a 32 MiB Send)
#   mesh    the runtime test suite across 2 hosts (4 ranks on mh1, 2 on mh2):
#             mpiexec <flags> --host mh1:4,mh2:2 -n 6 python -m mpimesh \
#                 -m pytest --with-mpi -m mesh tests
#           (rank 0, the controller, and ranks 1-3 on mh1; ranks 4 and 5 on
#           mh2: this_host() meshes of up to 3 come from the pool, and the
#           one MPI_Comm_spawn Open MPI allows across hosts is left to the
#           tests of spawning, see mpitest.spawning)
#   trees   the same with every cast down a tree (MPIMESH_CAST_FANOUT=2,
#           MPIMESH_CAST_TREE_MIN=2: forwarders on both hosts; issue #16)
#   hosts   tests/hosts/ under plain pytest: subprocess tests that start their
#           own multi-host jobs (the fault matrix across hosts, a host lost),
#           with MPIMESH_TEST_HOSTS=mh1,mh2 and MPIMESH_TEST_HOSTS_REQUIRED=1
#           (a test that cannot reach the hosts fails instead of skipping)
# After each step no process may be left: none in the hosts' namespaces, and
# none carrying the step's MPIMESH_TEST_TAG (tests/mpitest.py's check).
#
# Not root, or namespaces refused (a container without CAP_SYS_ADMIN): prints
# "hosts-tests: SKIPPED: <why>" and exits 0: CI without root skips loudly,
# never silently. Exit status non-zero if any step failed. The last line is a
# summary. Measured here (2 cores): ~37 s in all (mesh ~10 s, hosts ~25 s).
#
# Environment (all optional):
#   HOSTS_TESTS_ONLY      steps to run, e.g. "mesh" (default: "mesh trees hosts")
#   HOSTS_TESTS_KEEP=1    leave the hosts up at the end
#   HOSTS_TESTS_TIMEOUT   seconds per step (default 900)
#   VENV                  the Open MPI virtualenv (default <repo>/.venv)
#   HOSTS_TESTS_JUNIT     path prefix: each pytest step writes PREFIX-<step>.xml (default: a
#                         temporary directory); a step that leaves no report failed
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
VENV=${VENV:-$REPO/.venv}
case "$VENV" in /*) ;; *) VENV=$REPO/$VENV ;; esac
export VENV
ONLY=${HOSTS_TESTS_ONLY:-mesh trees hosts}
STEP_TIMEOUT=${HOSTS_TESTS_TIMEOUT:-900}
PY=$VENV/bin/python
HOSTS=(mh1 mh2)

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[hosts-tests %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
T_ALL=$(now)
PASSED=()
FAILED=()
UP=0

finish() {
  local rc=$?
  trap - EXIT INT TERM
  [ -n "${JUNIT_DIR:-}" ] && rm -rf "$JUNIT_DIR"
  if [ "$UP" = 1 ] && [ "${HOSTS_TESTS_KEEP:-0}" != 1 ]; then
    timeout 60 bash "$HERE/multihost.sh" down || log "warning: multihost.sh down failed"
  fi
  if [ ${#FAILED[@]} -gt 0 ] || [ "$rc" != 0 ]; then
    echo "hosts-tests: FAILED: ${FAILED[*]:-setup (rc=$rc)}; passed: ${PASSED[*]:-none} in $(since "$T_ALL") s"
    [ "$rc" = 0 ] && rc=1
  else
    echo "hosts-tests: OK: ${PASSED[*]} across ${HOSTS[*]} in $(since "$T_ALL") s"
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------- setup
[ -x "$PY" ] || { log "error: no $PY; set VENV"; exit 1; }
# hosts that were up before (someone else's): left up at the end
BEFORE=$(timeout 30 bash "$HERE/multihost.sh" status 2> /dev/null | awk '{print $1}' | xargs)
FLAGS=$(timeout 60 bash "$HERE/multihost.sh" up 2)
RC=$?
if [ "$RC" = 3 ]; then
  trap - EXIT
  echo "hosts-tests: SKIPPED: simulated hosts are not possible here (multihost.sh's message above); needs root and namespaces"
  exit 0
fi
[ "$RC" = 0 ] || { log "error: multihost.sh up failed (rc=$RC)"; exit 1; }
if [ "$BEFORE" = "${HOSTS[*]}" ]; then
  log "the hosts were up already: leaving them up at the end"
else
  UP=1
fi
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cd "$REPO" || exit 1

# clean TAG: no process left in the hosts, none with TAG anywhere (5 s to go).
clean() {
  local tag=$1 left h
  for _ in $(seq 1 50); do
    left=$(for h in "${HOSTS[@]}"; do timeout 10 ip netns pids "$h"; done | xargs)
    left+=$(PYTHONPATH=$REPO/tests timeout 30 "$PY" -c '
import sys
from mpitest import leftovers
print(" ".join(line.split(":")[0] for line in leftovers(sys.argv[1])))' "$tag")
    [ -z "${left// /}" ] && return 0
    sleep 0.1
  done
  log "orphans after the step (killing them): $left"
  for h in "${HOSTS[@]}"; do timeout 10 ip netns pids "$h"; done | xargs -r kill -9 2> /dev/null
  PYTHONPATH=$REPO/tests timeout 30 "$PY" -c '
import os, signal, sys
from mpitest import leftovers
for line in leftovers(sys.argv[1]):
    os.kill(int(line.split(":")[0]), signal.SIGKILL)' "$tag"
  return 1
}

# Every pytest step writes a JUnit report and pytest's exit status beside it
# (REPORT.done, tests/conftest.py): status 0 there is the proof that the run
# went to its end (prterun exits 0 when PRRTE loses a host's daemon and kills
# the job mid-run, so the exit status alone can hide a cut-off run, and the
# interrupted pytest still writes a report of the tests done so far).
JUNIT=${HOSTS_TESTS_JUNIT:-}
if [ -z "$JUNIT" ]; then
  JUNIT_DIR=$(mktemp -d)  # removed by finish
  JUNIT=$JUNIT_DIR/hosts
fi
LOST_DAEMON="has lost communication with a remote daemon"

# [REPORT=path] step NAME COMMAND...: run bounded, with a tag; record the outcome.
# A run that ends with status 0 but without its report (or with pytest's status
# not 0) failed; when PRRTE said it lost a daemon (an infrastructure failure of
# the simulated hosts, seen about once in 20 CI runs here, twice in a row once,
# always in the first cross-host spawn of the mesh suite, not reproduced alone),
# the step runs again after 10 s, up to 3 times, and the log says so.
step() {
  local name=$1 T rc tag out attempt
  shift
  if [[ " $ONLY " != *" $name "* ]] && [ "$name" != check ]; then return 0; fi
  tag="mpimesh-test-hosts-$name-$$"
  for attempt in 1 2 3; do
    [ -n "${REPORT:-}" ] && rm -f "$REPORT" "$REPORT.done"
    log "$name: $*"
    T=$(now)
    out=$(mktemp)
    MPIMESH_TEST_TAG=$tag timeout -k 10 "$STEP_TIMEOUT" "$@" < /dev/null 2>&1 | tee "$out"
    rc=${PIPESTATUS[0]}
    [ "$rc" = 124 ] && log "$name: timed out after $STEP_TIMEOUT s"
    if ! clean "$tag"; then log "$name: left processes behind"; rc=${rc/#0/1}; fi
    if [ "$rc" = 0 ] && [ -n "${REPORT:-}" ] && { [ ! -s "$REPORT" ] || [ "$(cat "$REPORT.done" 2> /dev/null)" != 0 ]; }; then
      if [ "$attempt" -lt 3 ] && grep -q "$LOST_DAEMON" "$out"; then
        log "$name: PRRTE lost a host's daemon and ended the job with status 0 before pytest finished: once more in 10 s"
        rm -f "$out"
        sleep 10
        continue
      fi
      log "$name: no test report ($REPORT), or pytest's status is not 0 ($(cat "$REPORT.done" 2> /dev/null || echo none)): the job ended before pytest did"
      rc=1
    fi
    rm -f "$out"
    break
  done
  log "$name: rc=$rc in $(since "$T") s"
  if [ "$rc" = 0 ]; then PASSED+=("$name"); else FAILED+=("$name"); fi
}

# shellcheck disable=SC2086  # FLAGS are words
step check bash "$HERE/multihost.sh" check
# shellcheck disable=SC2086
REPORT=$JUNIT-mesh.xml step mesh "$VENV/bin/mpiexec" $FLAGS --host mh1:4,mh2:2 -n 6 "$PY" -m mpimesh \
  -m pytest --with-mpi -m mesh -q --color=no "--junitxml=$JUNIT-mesh.xml" tests
# the same with every cast down a tree (fan-out 2, from 2 actors), so trees span the hosts
# shellcheck disable=SC2086
REPORT=$JUNIT-trees.xml step trees env MPIMESH_CAST_FANOUT=2 MPIMESH_CAST_TREE_MIN=2 MPIMESH_CAST_NEAR_DIRECT=0 \
  "$VENV/bin/mpiexec" $FLAGS -x MPIMESH_CAST_FANOUT -x MPIMESH_CAST_TREE_MIN -x MPIMESH_CAST_NEAR_DIRECT \
  --host mh1:4,mh2:2 -n 6 "$PY" -m mpimesh -m pytest --with-mpi -m mesh -q --color=no "--junitxml=$JUNIT-trees.xml" tests
REPORT=$JUNIT-hosts.xml step hosts env MPIMESH_TEST_HOSTS=mh1,mh2 MPIMESH_TEST_HOSTS_REQUIRED=1 "$PY" -m pytest -q \
  --color=no "--junitxml=$JUNIT-hosts.xml" -m subprocess tests/hosts
