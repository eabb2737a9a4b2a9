"""T4: one data-parallel MLP step on 4 processes driven from the controller, against torch DDP (gloo) under mpiexec.

A driver (run it with a plain python, not under mpiexec)::

    .venv/bin/python benchmarks/bench_t4.py [--repeats 3] [--steps 30]

Each repeat launches, one after the other (interleaved, so that a change of
the machine's load hits all three alike): ``mpiexec -n 5 python -m mpimesh
_t4_module.py`` (the brief's step on ``module_to_mesh(model, Mesh((4,),
("dp",)))``: global-view parameters, gradients bucketed and all-reduced
during the backward pass, the MPI backend), ``mpiexec -n 5 python -m mpimesh
_t4_mesh.py`` (per-process tensors with a hand-written ``reduce_``), and
``mpiexec -n 4 python _t4_ddp.py`` (the same model, data and optimizer under
``DistributedDataParallel`` on gloo, what users run today).  Prints one JSON
line: medians over repeats, and the ratios to DDP (target for
``module_to_mesh``: <= 1.1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from _common import emit, launch_env, median, r, run_bounded

HERE = os.path.dirname(os.path.abspath(__file__))


def mpiexec(n: int, *args: str) -> list[str]:
    from mpi4py import MPI

    flags = ["--oversubscribe", "--bind-to", "none"] if MPI.Get_library_version().startswith("Open MPI") else []
    return [os.path.join(os.path.dirname(sys.executable), "mpiexec"), *flags, "-n", str(n), *args]


def last_json(out: str) -> dict[str, float]:
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            parsed: dict[str, float] = json.loads(line)
            return parsed
    raise RuntimeError(f"no JSON line in:\n{out[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    env = launch_env({"PYTHONPATH": HERE + os.pathsep + os.environ.get("PYTHONPATH", "")})
    module, ours, piped, ddp = [], [], [], []
    steps = [str(args.steps), str(args.warmup)]
    for _ in range(args.repeats):
        done = run_bounded(mpiexec(5, sys.executable, "-m", "mpimesh", os.path.join(HERE, "_t4_module.py"), *steps),
                           env, 300)
        module.append(last_json(done.stdout + done.stderr)["module_step_ms"])
        done = run_bounded(mpiexec(5, sys.executable, "-m", "mpimesh", os.path.join(HERE, "_t4_mesh.py"), *steps),
                           env, 300)
        got = last_json(done.stdout + done.stderr)
        ours.append(got["mesh_step_ms"])
        piped.append(got["mesh_pipelined_step_ms"])
        done = run_bounded(mpiexec(4, sys.executable, os.path.join(HERE, "_t4_ddp.py"), *steps), env, 300)
        ddp.append(last_json(done.stdout + done.stderr)["ddp_step_ms"])
    emit({
        "bench": "T4",
        "what": "one data-parallel step of a 256-1024-1024-16 MLP, 64 rows per process, SGD, 4 processes",
        "module_step_ms": r(median(module)),
        "mesh_step_ms": r(median(ours)),
        "mesh_pipelined_step_ms": r(median(piped)),
        "baseline": "torch DDP (gloo) launched SPMD by mpiexec -n 4, same model/data/optimizer",
        "ddp_step_ms": r(median(ddp)),
        "ratio_module": r(median(module) / median(ddp)),
        "ratio": r(median(ours) / median(ddp)),
        "ratio_pipelined": r(median(piped) / median(ddp)),
        "ratio_note": "our step time over DDP's (module_to_mesh: target <= 1.1); 'module' and 'step' fetch the "
                      "loss every step, 'pipelined' only after the last",
        "repeat_module_ms": [r(v) for v in module],
        "repeat_mesh_ms": [r(v) for v in ours],
        "repeat_ddp_ms": [r(v) for v in ddp],
        "repeats": args.repeats,
    })


if __name__ == "__main__":
    main()
