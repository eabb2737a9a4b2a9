"""B6: a 64 MiB RDMABuffer owned by one actor, read into a local tensor by another process.

Run (owner from the launch pool; the raw baseline runs in the same job)::

    mpiexec --oversubscribe --bind-to none -n 2 .venv/bin/python -m mpimesh benchmarks/bench_b6.py

From a plain ``python -m mpimesh benchmarks/bench_b6.py`` the owner is
spawned, and the baseline runs as a separate ``mpiexec -n 2`` job of
``_bulk.py``.

The owner actor wraps ``torch.randn(16 * 1024 * 1024)`` in an
:class:`mpimesh.RDMABuffer` and returns the handle; the controller reads it
with ``handle.read_into(dst).get()`` into a reused local tensor.  Per repeat:
2 warm-up reads, then 10 timed reads; then the baseline on the same two
ranks: ``Win.Allocate`` of 64 MiB on the owner's rank and 10 timed
lock/``Get``/unlock from rank 0 (MPI's one-sided path with no copy of ours in
it).  Figures are medians over repeats of per-repeat medians.  Also reported:
the same reads forced through MPI: by pull (``_data.pulls``, the cross-host
path: one two-sided message the owner's poller sends) and through the
island's window (``MPIMESH_RMA_WINDOWS=always``; its speed depends on how
often the owner polls MPI).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import _bulk
import torch
from _actors import describe_job
from _common import emit, gbps, median, r, standalone_bulk, watchdog, worker_host
from mpi4py import MPI

from mpimesh import Actor, RDMABuffer, endpoint, rma

HERE = os.path.dirname(os.path.abspath(__file__))


class Owner(Actor):
    """Owns the weights; also the owner half of the raw baseline."""

    def __init__(self) -> None:
        self.weights = torch.randn(16 * 1024 * 1024)
        self.buffer = RDMABuffer(self.weights.view(torch.uint8))

    @endpoint
    def handle(self) -> RDMABuffer:
        return self.buffer

    @endpoint
    def checksum(self) -> float:
        return float(self.weights.sum())

    @endpoint
    def info(self) -> dict[str, Any]:
        world = MPI.COMM_WORLD
        return {"pid": os.getpid(), "world_rank": world.Get_rank(), "world_size": world.Get_size(),
                "spawned": MPI.Comm.Get_parent() != MPI.COMM_NULL}

    @endpoint
    def raw_peer(self, nbytes: int) -> int:
        comm2 = _bulk.pair(MPI.COMM_WORLD, MPI.COMM_WORLD.Get_rank())
        try:
            return _bulk.get_peer(comm2, nbytes)
        finally:
            comm2.Free()


def timed_reads(handle: RDMABuffer, dst: torch.Tensor, n: int, timeout: float = 60) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        handle.read_into(dst, timeout=timeout).get(timeout)
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mpi-reads", type=int, default=3, help="reads through the MPI window path per repeat")
    args = ap.parse_args()
    watchdog()

    procs = worker_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("b6", Owner)
    mesh.initialized.get(60)
    owner = mesh.slice(gpus=0)
    info = owner.info.call_one().get(60)
    handle = owner.handle.call_one().get(60)
    dst = torch.empty(handle.size() // 4, dtype=torch.float32)
    view = dst.view(torch.uint8)
    path = handle.backend

    ours, base = [], []
    forced: dict[str, list[float]] = {"pull": [], "window": []}
    for _ in range(args.repeats):
        timed_reads(handle, view, args.warmup)
        ours.append(statistics.median(timed_reads(handle, view, args.reads)) * 1e3)
        if abs(float(dst.sum()) - owner.checksum.call_one().get(60)) > 1e-2 * max(1.0, abs(float(dst.sum()))):
            raise AssertionError("read_into delivered other bytes than the owner's")
        for way, times in forced.items() if args.mpi_reads else ():
            rma._force = way
            try:
                if handle.backend == "mpi":
                    times.append(statistics.median(timed_reads(handle, view, args.mpi_reads, 120)) * 1e3)
            except ConnectionError:
                pass  # no window on one host unless MPIMESH_RMA_WINDOWS=always
            finally:
                rma._force = None
        if not info["spawned"]:
            fut = owner.raw_peer.call_one(_bulk.MIB64)
            comm2 = _bulk.pair(MPI.COMM_WORLD, info["world_rank"])
            try:
                secs = _bulk.get_root(comm2, _bulk.MIB64, args.reads)
            finally:
                comm2.Free()
            fut.get(120)
            base.append(statistics.median(secs) * 1e3)

    alone = standalone_bulk("b6", args.reads)
    med = median(ours)
    bmed = median(base) if base else (alone or {}).get("median_ms")
    record = {
        "bench": "B6",
        "what": "64 MiB RDMABuffer owned by an actor, read_into a local tensor by the controller",
        "reads": args.reads,
        "repeats": args.repeats,
        "backend": path,
        "median_ms": r(med),
        "gbps": gbps(med),
        "baseline": "Win.Allocate + lock/Get/unlock of 64 MiB, "
        + ("standalone mpiexec -n 2 job (_bulk.py b6)" if not base else "same job, same two ranks"),
        "baseline_median_ms": r(bmed),
        "baseline_gbps": gbps(bmed),
        "ratio_gbps": r(bmed / med) if bmed and med else None,
        "ratio_note": "our GB/s over the baseline's (target >= 0.8)",
        "standalone_baseline_ms": (alone or {}).get("median_ms"),
        "standalone_baseline_gbps": (alone or {}).get("gbps"),
        "mpi_pull_path_ms": r(median(forced["pull"])) if forced["pull"] else None,
        "mpi_pull_path_gbps": gbps(median(forced["pull"])) if forced["pull"] else None,
        "mpi_window_path_ms": r(median(forced["window"])) if forced["window"] else None,
        "mpi_window_path_gbps": gbps(median(forced["window"])) if forced["window"] else None,
        "mpi_window_note": "dynamic window; the owner's runtime must poll MPI for it to progress",
        "repeat_median_ms": [r(v) for v in ours],
        "baseline_repeat_median_ms": [r(v) for v in base],
    }
    record.update(describe_job([info]))
    handle.drop().get(60)
    procs.stop().get(60)
    emit(record)


if __name__ == "__main__":
    main()
