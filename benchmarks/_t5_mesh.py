"""T5's measured side: the brief's sharded matmul on a 4 x 2 ``Mesh``, driven from the controller.

Run as ``mpiexec -n 9 python -m mpimesh _t5_mesh.py REPS PIPELINED`` (8 pool workers).  Prints one JSON
line (see :func:`_t5_program.summary`): ``dt @ dt.T`` and its ``full_tensor()`` here; ``PIPELINED``
products issued back to back and one ``full_tensor()`` of the last (per product); and the whole
program, ``distribute`` included.
"""

from __future__ import annotations

import json
import sys
import time

from _t5_program import NAMES, SHAPE, SPEC, local_tensor, summary

import mpimesh
from mpimesh.distributed import Mesh


def main() -> None:
    reps, pipelined = int(sys.argv[1]), int(sys.argv[2])
    mesh = Mesh(shape=SHAPE, mesh_dim_names=NAMES)
    local = local_tensor()
    dt = mpimesh.distribute(local, mesh, sharding_spec=SPEC)
    (dt @ dt.T).full_tensor()  # warm-up: the world, DTensor's caches, gloo's connections
    matmul, program = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        (dt @ dt.T).full_tensor()
        matmul.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(pipelined):
        last = dt @ dt.T
    last.full_tensor()
    per = (time.perf_counter() - t0) / pipelined
    for _ in range(reps):
        t0 = time.perf_counter()
        d = mpimesh.distribute(local, mesh, sharding_spec=SPEC)
        (d @ d.T).full_tensor()
        program.append(time.perf_counter() - t0)
    print(json.dumps(summary(matmul, per, program)), flush=True)
    mesh.stop().get(60)


if __name__ == "__main__":
    main()
