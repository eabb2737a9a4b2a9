#!/usr/bin/env bash
# slurm-jobs.sh - submit every jobs/slurm template to a real, throwaway Slurm.
#
# Usage (as root, from anywhere):
#   bash .ci/slurm-jobs.sh
#   SLURM_JOBS_VENV=.venv-mpich bash .ci/slurm-jobs.sh      # the MPICH stack
#
# Starts a one-node cluster with slurm-up.sh and runs, each with
# `timeout sbatch --wait`:
#   cpu-srun        mpimesh.sbatch, 5 tasks (srun --mpi from `mpimesh info`)
#   cpu-mpirun      mpimesh-mpirun.sbatch, 5 processes (`mpimesh run`)
#   gpu             mpimesh-gpu.sbatch, 4 "GPUs" + controller (no GPU GRES
#                   here: checks the per-rank CUDA_VISIBLE_DEVICES choice)
#   wrong-mpi       mpimesh.sbatch with SRUN_MPI=none: must FAIL, with
#                   mpimesh's singleton message (the launch check works)
# then restarts it with three fake nodes and runs:
#   multi-srun      mpimesh-multinode.sbatch, 3 nodes x 2 tasks, srun
#   multi-mpirun    the same with LAUNCHER=mpirun
# Five ranks: examples/hello_mesh.py asks for 4 workers, which must come from
# the launch (srun cannot serve MPI_Comm_spawn).
# Each job's exit status AND output are checked (sbatch --wait alone can
# exit 0 for a job it lost track of). Every job's output is printed. The
# clusters are always stopped (EXIT trap), and the exit status is non-zero if
# any job did not behave as expected. The last line is a summary.
# Measured here: ~28 s with the packages present (each job 2-6 s, each
# cluster start ~1.2 s, stop 0.2-2.7 s).
#
# Environment (all optional):
#   SLURM_JOBS_VENV     virtualenv with mpimesh's dependencies and an MPI
#                       (default: <repo>/.venv)
#   SLURM_JOBS_EXAMPLE  the script every job runs (default:
#                       examples/hello_mesh.py); "standin" uses a built-in
#                       mpi4py script that prints "hello from rank 0 of N"
#   SLURM_JOBS_EXPECT   extended regexes, one per line, that must each match
#                       a line of a good job's output; {n} stands for the
#                       world size (default: "hello, mesh, from" and "^done$",
#                       what examples/hello_mesh.py prints)
#   SLURM_JOBS_TIMEOUT  seconds per `sbatch --wait` (default 120)
#   SLURM_JOBS_ONLY     run only these cases, e.g. "cpu-srun gpu"
#   SLURM_CI_KEEP=1     keep the cluster dirs and job outputs
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
VENV=${SLURM_JOBS_VENV:-$REPO/.venv}
case "$VENV" in /*) ;; *) VENV=$REPO/$VENV ;; esac
EXAMPLE=${SLURM_JOBS_EXAMPLE:-examples/hello_mesh.py}
EXPECT=${SLURM_JOBS_EXPECT:-$'hello, mesh, from\n^done$'}
mapfile -t EXPECTS <<< "$EXPECT"
JOB_TIMEOUT=${SLURM_JOBS_TIMEOUT:-120}
ONLY=${SLURM_JOBS_ONLY:-}

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
log() { printf '[slurm-jobs %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
T_ALL=$(now)
PASSED=()
FAILED=()

OUT=$(mktemp -d /tmp/mpimesh-slurm-jobs.XXXXXX)
chmod 755 "$OUT"
SLURM_CI_DIR=

cluster_down() {
  if [ -n "$SLURM_CI_DIR" ]; then
    bash "$HERE/slurm-down.sh" "$SLURM_CI_DIR"
    SLURM_CI_DIR=
  fi
}

finish() {
  local rc=$?
  trap - EXIT INT TERM
  cluster_down
  if [ "${SLURM_CI_KEEP:-0}" = 1 ]; then log "kept job outputs in $OUT"; else rm -rf "$OUT"; fi
  local total=$(( ${#PASSED[@]} + ${#FAILED[@]} ))
  if [ ${#FAILED[@]} -gt 0 ] || [ "$rc" != 0 ] || [ "$total" = 0 ]; then
    echo "slurm-jobs: FAILED: ${#FAILED[@]} of $total jobs not as expected (${FAILED[*]:-setup failed}) in $(since "$T_ALL") s"
    [ "$rc" = 0 ] && rc=1
  else
    echo "slurm-jobs: OK: $total of $total jobs as expected (${PASSED[*]}) in $(since "$T_ALL") s"
  fi
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

cluster_up() {  # cluster_up NODES
  local env_lines
  env_lines=$(SLURM_CI_NODES=$1 bash "$HERE/slurm-up.sh") || { log "error: slurm-up.sh failed"; exit 1; }
  eval "$env_lines"
  export SLURM_CONF SLURM_CI_DIR
  # MPI's session directories and Slurm's per-job files land in the cluster dir
  export TMPDIR=$SLURM_CI_DIR/tmp
}

# ------------------------------------------------------------------- setup
[ -x "$VENV/bin/python" ] || { log "error: no $VENV/bin/python; set SLURM_JOBS_VENV"; exit 1; }
if [ "$EXAMPLE" = standin ]; then
  EXAMPLE=$OUT/standin.py
  cat > "$EXAMPLE" <<'EOF'
"""Stand-in example: the controller (rank 0) prints the world it runs in."""
import socket
import sys

from mpi4py import MPI

world = MPI.COMM_WORLD
print(f"hello from rank {world.Get_rank()} of {world.Get_size()} on {socket.gethostname()} args={sys.argv[1:]}",
      flush=True)
EOF
fi
case "$EXAMPLE" in /*) ;; *) EXAMPLE=$REPO/$EXAMPLE ;; esac
[ -f "$EXAMPLE" ] || { log "error: example $EXAMPLE not found; set SLURM_JOBS_EXAMPLE (or 'standin')"; exit 1; }
# The templates read these; this checkout's mpimesh wins over an installed one.
export VENV
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
log "venv $VENV: $("$VENV/bin/python" -m mpimesh._launch.cli info --get mpi_library_version 2>&1 | tail -n 1)"
log "example $EXAMPLE, expecting: $(printf '/%s/ ' "${EXPECTS[@]}")"

# run_job NAME WORLD WANT_RC PATTERN... -- [VAR=value...] -- SBATCH_ARGS...
# WANT_RC is 0 (must succeed) or "fail"; every PATTERN (grep -E, {n} = WORLD)
# must match a line of the output.
run_job() {
  local name=$1 world=$2 want=$3 patterns=() env_args=() T rc out ok=1 p
  shift 3
  while [ "$1" != -- ]; do patterns+=("${1//\{n\}/$world}"); shift; done
  shift
  while [ "$1" != -- ]; do env_args+=("$1"); shift; done
  shift
  if [ -n "$ONLY" ] && [[ " $ONLY " != *" $name "* ]]; then return 0; fi
  out=$OUT/$name.out
  T=$(now)
  ( cd "$OUT" && env "${env_args[@]}" timeout "$JOB_TIMEOUT" \
      sbatch --wait --quiet --job-name="$name" --output="$out" "$@" "$EXAMPLE" )
  rc=$?
  log "$name: sbatch --wait rc=$rc in $(since "$T") s; output:"
  if [ -f "$out" ]; then sed 's/^/    | /' "$out" >&2; else log "$name: no output file"; ok=0; fi
  if [ "$rc" = 124 ]; then log "$name: timed out after $JOB_TIMEOUT s"; ok=0; fi
  if [ "$want" = 0 ] && [ "$rc" != 0 ]; then log "$name: expected exit 0"; ok=0; fi
  if [ "$want" = fail ] && [ "$rc" = 0 ]; then log "$name: expected a failure, got exit 0"; ok=0; fi
  for p in "${patterns[@]}"; do
    if [ -f "$out" ] && ! grep -Eq -- "$p" "$out"; then log "$name: no line matches /$p/"; ok=0; fi
  done
  if [ "$want" = 0 ] && [ -f "$out" ] && grep -Eq 'Traceback|initialized MPI as a singleton' "$out"; then
    log "$name: output has a traceback or a singleton report"
    ok=0
  fi
  if [ "$ok" = 1 ]; then PASSED+=("$name"); else FAILED+=("$name"); fi
}

SLURM=$REPO/jobs/slurm

# ------------------------------------------------------- one-node cluster
cluster_up 1
run_job cpu-srun 5 0 "${EXPECTS[@]}" "mpimesh.sbatch: job [0-9]+: {n} tasks" -- -- \
  --ntasks=5 "$SLURM/mpimesh.sbatch"
run_job cpu-mpirun 5 0 "${EXPECTS[@]}" "mpimesh-mpirun.sbatch: job [0-9]+: {n} processes" -- -- \
  --ntasks=5 "$SLURM/mpimesh-mpirun.sbatch"
run_job gpu 5 0 "${EXPECTS[@]}" \
  "mpimesh-gpu: rank 0 on .*: CUDA_VISIBLE_DEVICES=$" \
  "mpimesh-gpu: rank 1 on .*: CUDA_VISIBLE_DEVICES=0$" \
  "mpimesh-gpu: rank 4 on .*: CUDA_VISIBLE_DEVICES=3$" -- GPUS_PER_NODE=4 -- \
  --gpus-per-node=0 --ntasks-per-node=5 --cpus-per-task=1 "$SLURM/mpimesh-gpu.sbatch"
run_job wrong-mpi 2 fail \
  "srun started {n} tasks .* each task initialized MPI as a singleton" -- SRUN_MPI=none -- \
  --ntasks=2 "$SLURM/mpimesh.sbatch"
cluster_down

# ---------------------------------------------------- three fake nodes
# 2 tasks per node: PyPI Open MPI fails MPI_Init with 3+ srun tasks on one
# *fake* node (measured; see /work/shared/reference/slurm-local.md, sec. 6).
cluster_up 3
run_job multi-srun 6 0 "${EXPECTS[@]}" "mpimesh-multinode.sbatch: job [0-9]+: {n} tasks on 3 nodes" -- -- \
  --nodes=3 --ntasks-per-node=2 "$SLURM/mpimesh-multinode.sbatch"
run_job multi-mpirun 6 0 "${EXPECTS[@]}" "mpimesh-multinode.sbatch: job [0-9]+: {n} processes on 3 nodes" \
  -- LAUNCHER=mpirun -- --nodes=3 --ntasks-per-node=2 "$SLURM/mpimesh-multinode.sbatch"
cluster_down
