"""B4: a 64 MiB float32 tensor as an endpoint argument; the endpoint returns its sum.

Run (worker from the launch pool; the raw baseline runs in the same job)::

    mpiexec --oversubscribe --bind-to none -n 2 .venv/bin/python -m mpimesh benchmarks/bench_b4.py

From a plain ``python -m mpimesh benchmarks/bench_b4.py`` the worker is
spawned, and the baseline runs as a separate ``mpiexec -n 2`` job of
``_bulk.py``.

Per repeat: 3 warm-up calls, then 10 timed ``call_one(x).get()`` with
``x = torch.randn(16 * 1024 * 1024)``; the same with a copy of ``x`` in
``mpimesh.empty_fast`` memory (huge pages: ``fast_arg``); then the baseline
on the same ranks: 12 raw 64 MiB ``Send``/``Recv`` of the same tensor's
bytes (into a reused, faulted-in buffer at the sender's alignment, each
acknowledged by one byte; the first 2 dropped), and the same from a numpy
copy (``baseline_numpy``: numpy advises huge pages, the best Send the
machine shows; docs/design/data.md, "Where a Send loses its speed").  Also per repeat: the same call to an endpoint that
ignores its argument (the transfer alone) and, for reference, the sum alone.
Figures are medians over repeats of per-repeat medians; GB/s is 64 MiB over
the median time.  After the repeats, a standalone pure-mpi4py job
(``_bulk.py b4``) gives a second baseline without mpimesh's threads.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import _bulk
import numpy as np
import torch
from _actors import describe_job
from _common import emit, gbps, median, r, standalone_bulk, watchdog, worker_host
from mpi4py import MPI

from mpimesh import Actor, empty_fast, endpoint

HERE = os.path.dirname(os.path.abspath(__file__))


class Summer(Actor):
    """B4's endpoint, a no-op twin, and the worker half of the raw baseline."""

    @endpoint
    def total(self, x: torch.Tensor) -> float:
        return float(x.sum())

    @endpoint
    def ignore(self, x: torch.Tensor) -> None:
        return None

    @endpoint
    def info(self) -> dict[str, Any]:
        world = MPI.COMM_WORLD
        return {"pid": os.getpid(), "world_rank": world.Get_rank(), "world_size": world.Get_size(),
                "spawned": MPI.Comm.Get_parent() != MPI.COMM_NULL}

    @endpoint
    def raw_peer(self, nbytes: int, reps: int) -> int:
        # Blocks this actor's thread in MPI for the whole baseline.
        return _bulk.sendrecv_peer(MPI.COMM_WORLD, nbytes, reps)


def per_call(fn: Any, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    watchdog()

    procs = worker_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("b4", Summer)
    mesh.initialized.get(60)
    one = mesh.slice(gpus=0)
    info = one.info.call_one().get(60)
    x = torch.randn(16 * 1024 * 1024)
    expect = float(x.sum())
    src = x.view(torch.uint8).numpy()
    # The same values in huge pages (what mpimesh.empty_fast gives a user), and in numpy's memory.
    fast = empty_fast(x.shape, dtype=x.dtype)
    fast.copy_(x)
    src_numpy = np.empty(_bulk.MIB64, np.uint8)
    src_numpy[:] = src

    def raw(memory: np.ndarray) -> float:
        fut = one.raw_peer.call_one(_bulk.MIB64, args.calls + 2)
        secs = _bulk.sendrecv_root(MPI.COMM_WORLD, info["world_rank"], memory, args.calls + 2)[2:]
        fut.get(120)
        return statistics.median(secs) * 1e3

    ours, moved, base, local, ours_fast, moved_fast, base_numpy = [], [], [], [], [], [], []
    for _ in range(args.repeats):
        per_call(lambda: one.total.call_one(x).get(60), args.warmup)
        times = per_call(lambda: one.total.call_one(x).get(60), args.calls)
        got = one.total.call_one(x).get(60)
        if abs(got - expect) > 1e-3 * max(1.0, abs(expect)):
            raise AssertionError(f"endpoint summed {got}, expecting {expect}")
        ours.append(statistics.median(times) * 1e3)
        per_call(lambda: one.total.call_one(fast).get(60), args.warmup)
        ours_fast.append(statistics.median(per_call(lambda: one.total.call_one(fast).get(60), args.calls)) * 1e3)
        moved.append(statistics.median(per_call(lambda: one.ignore.call_one(x).get(60), args.calls)) * 1e3)
        moved_fast.append(statistics.median(per_call(lambda: one.ignore.call_one(fast).get(60), args.calls)) * 1e3)
        local.append(statistics.median(per_call(lambda: float(x.sum()), args.calls)) * 1e3)
        if not info["spawned"]:
            base.append(raw(src))
            base_numpy.append(raw(src_numpy))

    alone = standalone_bulk("b4", args.calls)
    med = median(ours)
    bmed = median(base) if base else (alone or {}).get("median_ms")
    record = {
        "bench": "B4",
        "what": "64 MiB float32 tensor as an endpoint argument, endpoint returns its sum",
        "calls": args.calls,
        "repeats": args.repeats,
        "median_ms": r(med),
        "gbps": gbps(med),
        "transfer_only_ms": r(median(moved)),
        "transfer_only_gbps": gbps(median(moved)),
        "local_sum_ms": r(median(local)),
        "baseline": "64 MiB Send/Recv of the same bytes into a reused buffer at the sender's alignment, "
        + ("standalone mpiexec -n 2 job (_bulk.py b4)" if not base
           else "same job, rank 0 -> worker rank on COMM_WORLD"),
        "baseline_median_ms": r(bmed),
        "baseline_gbps": gbps(bmed),
        "ratio_gbps": r(bmed / med) if bmed and med else None,
        "ratio_note": "our GB/s over the baseline's (target >= 0.7); the call includes the remote sum",
        "fast_arg_median_ms": r(median(ours_fast)),
        "fast_arg_gbps": gbps(median(ours_fast)),
        "fast_arg_transfer_only_ms": r(median(moved_fast)),
        "fast_arg_transfer_only_gbps": gbps(median(moved_fast)),
        "fast_arg_note": "the same calls with the tensor in mpimesh.empty_fast memory (huge pages)",
        "baseline_numpy_median_ms": r(median(base_numpy)) if base_numpy else None,
        "baseline_numpy_gbps": gbps(median(base_numpy)) if base_numpy else None,
        "baseline_numpy_note": "the same raw Send/Recv from numpy memory (np.empty + fill: huge pages), "
        "the best the machine shows",
        "ratio_fast_transfer_over_numpy_gbps": r(median(base_numpy) / median(moved_fast)) if base_numpy else None,
        "ratio_fast_transfer_note": "no-op endpoint, empty_fast tensor: its GB/s over the raw numpy Send's",
        "standalone_baseline_ms": (alone or {}).get("median_ms"),
        "standalone_baseline_gbps": (alone or {}).get("gbps"),
        "repeat_median_ms": [r(v) for v in ours],
        "baseline_repeat_median_ms": [r(v) for v in base],
        "fast_arg_repeat_median_ms": [r(v) for v in ours_fast],
        "baseline_numpy_repeat_median_ms": [r(v) for v in base_numpy],
    }
    record.update(describe_job([info]))
    procs.stop().get(60)
    emit(record)


if __name__ == "__main__":
    main()
