"""The ``"mpimesh"`` torch.distributed backend against gloo and raw MPI: all_reduce of 4 KiB, 1 MiB and 64 MiB.

Run (4 pool workers; worlds of 2 and 4 of them, every figure taken on the same processes in the same job)::

    mpiexec --oversubscribe --bind-to none -n 5 .venv/bin/python -m mpimesh benchmarks/bench_mpipg.py

For each world size and tensor size, one actor per process of the world
times, in turns within every repeat (so that the three share the noise of
this small machine), a loop of in-place all-reduces (sum) of a float32
tensor:

* ``mpimesh``: ``dist.all_reduce(t)`` on the default group, made by
  ``init_process_group("mpimesh")`` (MPI under torch.distributed);
* ``gloo``: ``dist.all_reduce(t, group=g)`` with ``g = new_group(backend="gloo")``
  over the same processes;
* ``raw`` (the baseline): mpi4py ``comm.Allreduce(MPI.IN_PLACE, array)`` of
  the same tensor's memory as NumPy, on the very communicator the mpimesh
  group runs on.

Each loop starts after a barrier; rank 0's time per operation is reported
(median over ``--repeats``).  ``--hosts``: the world spans every host of the
job (``hosts x gpus``).  Across simulated hosts::

    bash .ci/multihost.sh up 2
    mpiexec $(bash .ci/multihost.sh flags) --host pg1:3,pg2:2 -n 5 \\
        .venv/bin/python -m mpimesh benchmarks/bench_mpipg.py --hosts

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from _common import emit, median, r, watchdog
from mpi4py import MPI

from mpimesh import Actor, endpoint, host_mesh, this_host
from mpimesh.spmd import setup_torch_elastic_env

#: tensor sizes (bytes) and loop lengths
SIZES = {"4KiB": (4 << 10, 400), "1MiB": (1 << 20, 40), "64MiB": (64 << 20, 3)}


class Bench(Actor):
    """Times all-reduce loops of the three kinds on this process, in its torch.distributed world."""

    @endpoint
    def run(self, sizes: list[str], repeats: int) -> dict[str, dict[str, float]]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("mpimesh")
        gloo = dist.new_group(backend="gloo")
        comm = dist.group.WORLD.comm  # type: ignore[union-attr]
        out: dict[str, dict[str, list[float]]] = {}
        try:
            for name in sizes:
                nbytes, iters = SIZES[name]
                t = torch.zeros(nbytes // 4)
                arr = t.numpy()
                loops = {
                    "raw": lambda arr=arr: comm.Allreduce(MPI.IN_PLACE, arr, op=MPI.SUM),
                    "mpimesh": lambda t=t: dist.all_reduce(t),
                    "gloo": lambda t=t: dist.all_reduce(t, group=gloo),
                }
                for fn in loops.values():  # warm-up: connections, first-touch of buffers
                    fn()
                times: dict[str, list[float]] = {k: [] for k in loops}
                for _ in range(repeats):
                    for kind, fn in loops.items():
                        comm.Barrier()
                        t0 = time.perf_counter()
                        for _ in range(iters):
                            fn()
                        times[kind].append((time.perf_counter() - t0) / iters * 1e6)
                out[name] = times
        finally:
            dist.destroy_process_group()
        return {name: {k: median(v) for k, v in times.items()} for name, times in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worlds", default="2,4", help="world sizes (processes), comma-separated")
    ap.add_argument("--sizes", default=",".join(SIZES), help=f"tensor sizes, of {list(SIZES)}")
    ap.add_argument("--hosts", action="store_true", help="worlds across every host of the job")
    args = ap.parse_args()
    watchdog()
    worlds = [int(w) for w in args.worlds.split(",")]
    sizes = args.sizes.split(",")
    if args.hosts:
        hosts = host_mesh()
        procs: Any = hosts.spawn_procs(per_host={"gpus": max(worlds) // hosts.size("hosts")})
    else:
        procs = this_host().spawn_procs(per_host={"gpus": max(worlds)})
    results: dict[str, Any] = {}
    for n in worlds:
        world = _world(procs, n, args.hosts)
        setup_torch_elastic_env(world, backend="mpimesh")
        bench = world.spawn(f"bench_mpipg_{n}", Bench)
        first = list(bench.run.call(sizes, args.repeats).get(1200).values())[0]
        results[f"n{n}"] = {
            name: {
                "raw_us": r(t["raw"], 1), "mpimesh_us": r(t["mpimesh"], 1), "gloo_us": r(t["gloo"], 1),
                "mpimesh_over_raw": r(t["mpimesh"] / t["raw"]), "gloo_over_raw": r(t["gloo"] / t["raw"]),
                "gloo_over_mpimesh": r(t["gloo"] / t["mpimesh"]),
            } for name, t in first.items()}
        results[f"n{n}"]["hosts"] = sorted(set(world.hostnames))
    procs.stop().get(60)
    emit({
        "bench": "mpipg",
        "what": "all_reduce (sum, in place) of float32 tensors: torch.distributed on the mpimesh backend, on gloo, "
                "and raw mpi4py Allreduce on the mpimesh group's communicator; same processes, same job",
        "processes": "launch pool" if all(a[0] == 0 for a in procs._addrs) else "spawned",
        "results": results,
        "baseline": "raw mpi4py comm.Allreduce(MPI.IN_PLACE, numpy view) on the same communicator, same processes",
        "mpi_library": MPI.Get_library_version().splitlines()[0].strip(),
        "loadavg_1min": os.getloadavg()[0],
        "repeats": args.repeats,
    })


def _world(procs: Any, n: int, hosts: bool) -> Any:
    """The first ``n`` processes of ``procs``; across hosts, ``n`` spread evenly over them."""
    if not hosts:
        return procs.slice(gpus=slice(0, n))
    per_host = n // procs.size("hosts")
    return procs if per_host == procs.size("gpus") else procs.slice(gpus=slice(0, per_host))


if __name__ == "__main__":
    main()
