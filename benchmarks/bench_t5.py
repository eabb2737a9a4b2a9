"""T5: the brief's 1024 x 1024 ``dt @ dt.T`` on a 4 x 2 mesh from the controller, against the same DTensor program SPMD.

A driver (run it with a plain python, not under mpiexec)::

    .venv/bin/python benchmarks/bench_t5.py [--repeats 3] [--reps 10] [--pipelined 10]

Each repeat launches, in turn, ``mpiexec -n 9 python -m mpimesh _t5_mesh.py`` (the controller and a
``Mesh(shape=(4, 2))`` of pool ranks; the brief's program with ``mpimesh.distribute``) and ``mpiexec
-n 8 python _t5_spmd.py`` (torch's DTensor on gloo, ``distribute_tensor`` of the same matrix with the
same placements, launched SPMD).  Three figures each: ``matmul`` (``(dt @ dt.T).full_tensor()``,
the result whole where the program reads it: the controller, or every rank), ``pipelined`` (products
back to back, one ``full_tensor()``; per product) and ``program`` (distribute, product, full).
Prints one JSON line: medians over repeats and the speed ratios SPMD time / ours (target >= 0.9).
"""

from __future__ import annotations

import argparse
import os
import sys

from _common import emit, launch_env, median, r, run_bounded
from bench_t4 import last_json, mpiexec

HERE = os.path.dirname(os.path.abspath(__file__))
FIGURES = ("matmul_ms", "pipelined_ms", "program_ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--pipelined", type=int, default=10)
    args = ap.parse_args()
    env = launch_env({"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")})
    loop = [str(args.reps), str(args.pipelined)]
    ours: dict[str, list[float]] = {f: [] for f in FIGURES}
    spmd: dict[str, list[float]] = {f: [] for f in FIGURES}
    loads = []
    for _ in range(args.repeats):
        loads.append(round(os.getloadavg()[0], 2))
        done = run_bounded(mpiexec(9, sys.executable, "-m", "mpimesh", os.path.join(HERE, "_t5_mesh.py"), *loop),
                           env, 300)
        got = last_json(done.stdout + done.stderr)
        for f in FIGURES:
            ours[f].append(got[f])
        done = run_bounded(mpiexec(8, sys.executable, os.path.join(HERE, "_t5_spmd.py"), *loop), env, 300)
        got = last_json(done.stdout + done.stderr)
        for f in FIGURES:
            spmd[f].append(got[f])
    record: dict[str, object] = {
        "bench": "T5",
        "what": "the brief's dt @ dt.T, 1024 x 1024 float32, sharding_spec ['data_parallel', None] on a 4 x 2 mesh",
        "baseline": "the same DTensor program SPMD: mpiexec -n 8, gloo, distribute_tensor with the same placements",
    }
    for f in FIGURES:
        record[f"mesh_{f}"] = r(median(ours[f]))
        record[f"spmd_{f}"] = r(median(spmd[f]))
        record[f"speed_{f.removesuffix('_ms')}"] = r(median(spmd[f]) / median(ours[f]))
    record.update({
        "ratio_note": "speed = SPMD time / ours (target >= 0.9 for matmul)",
        "repeat_mesh_matmul_ms": [r(v) for v in ours["matmul_ms"]],
        "repeat_spmd_matmul_ms": [r(v) for v in spmd["matmul_ms"]],
        "load": loads,
        "repeats": args.repeats,
    })
    emit(record)


if __name__ == "__main__":
    main()
