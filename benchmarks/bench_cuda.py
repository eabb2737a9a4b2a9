"""B4 on the GPU: a 64 MiB CUDA tensor as an endpoint argument, and a 4 MiB engine reduction of CUDA tensors.

Run on a machine with a GPU (the worker comes from the launch pool, the raw
baselines run in the same job)::

    mpiexec --oversubscribe --bind-to none -n 3 python -m mpimesh benchmarks/bench_cuda.py

Without a CUDA-aware MPI (neither PyPI wheel is one) a CUDA tensor is staged
through page-locked host memory: device to host on the sender, ``Send``,
host to device on the receiver.  The baselines do exactly that by hand with
mpi4py: the controller copies the tensor into a reused pinned buffer and
``Send``s it; the worker ``Recv``s into its pinned buffer, copies it to its
GPU, synchronizes and acknowledges with one byte.  Also measured: the same
exchange of host memory alone (no GPU copies), what the machine's MPI gives.

The reduction: inside ``activate()``, ``t.reduce("gpus", "sum")`` of a 4 MiB
CUDA tensor on two workers, fetched back (synchronizes), against a raw
mpi4py ``Allreduce`` of pinned copies with the same copies to and from the
GPU, between the same two workers.  Both are timed at the controller, each
with its round trip (the engine's issue and fetch; the raw one's call to the
two workers and their replies); the raw reduction timed on the workers alone,
between barriers, is reported beside (``reduce_baseline_workers_ms``).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np
import torch
from _common import TAG, emit, gbps, median, r, watchdog
from mpi4py import MPI

import mpimesh
from mpimesh import Actor, endpoint, this_host
from mpimesh._data.buffers import cuda_support

MIB64 = 64 * 1024 * 1024
#: ``cpu`` checks this script's logic on a machine without a GPU (the figures then mean nothing).
DEVICE = os.environ.get("BENCH_CUDA_DEVICE", "cuda")
RAW_TAG = TAG + 20


def pinned(nbytes: int) -> torch.Tensor:
    """A reused, faulted-in, page-locked host buffer."""
    buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=torch.cuda.is_available())
    buf.fill_(1)
    return buf


def sync() -> None:
    """Wait for the GPU's queued work (nothing to wait for on the CPU)."""
    if DEVICE == "cuda":
        torch.cuda.synchronize()


class Receiver(Actor):
    """The endpoint under test, and the worker halves of the raw baselines."""

    @endpoint
    def ignore(self, x: torch.Tensor) -> str:
        return str(x.device)

    @endpoint
    def rank(self) -> int:
        return MPI.COMM_WORLD.Get_rank()

    @endpoint
    def raw_peer(self, nbytes: int, reps: int, to_gpu: bool) -> int:
        world = MPI.COMM_WORLD
        host = pinned(nbytes)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=DEVICE)
        ack = np.zeros(1, np.uint8)
        for _ in range(reps):
            world.Recv(host.numpy(), 0, RAW_TAG)
            if to_gpu:
                dev.copy_(host, non_blocking=True)
                sync()
            world.Send(ack, 0, RAW_TAG)
        return reps

    @endpoint
    def raw_open(self, ranks: list[int], numel: int) -> None:
        """Make the raw reduction's communicator of ``ranks`` and its buffers (collective over them)."""
        world = MPI.COMM_WORLD
        group = world.Get_group().Incl(ranks)
        self.comm = world.Create_group(group, tag=RAW_TAG)
        group.Free()
        self.dev = torch.ones(numel, device=DEVICE)
        self.send, self.recv = pinned(numel * 4).view(torch.float32), pinned(numel * 4).view(torch.float32)

    def _allreduce(self) -> None:
        self.send.copy_(self.dev)
        self.comm.Allreduce(self.send.numpy(), self.recv.numpy(), MPI.SUM)
        self.dev.copy_(self.recv, non_blocking=True)
        sync()

    @endpoint
    def raw_allreduce(self, reps: int) -> list[float]:
        """Seconds of each of ``reps`` reductions, timed here between barriers (no controller in them)."""
        out = []
        for _ in range(reps):
            self.comm.Barrier()
            t0 = time.perf_counter()
            self._allreduce()
            self.comm.Barrier()
            out.append(time.perf_counter() - t0)
        return out

    @endpoint
    def raw_allreduce_once(self) -> None:
        """One reduction, for the controller to time with its call's round trip, as it times the engine's."""
        self._allreduce()

    @endpoint
    def raw_close(self) -> None:
        self.comm.Free()


def timed(fn: Any, n: int) -> float:
    """Median seconds of ``n`` calls of ``fn``."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def copies(calls: int) -> dict[str, float | None]:
    """Milliseconds of each way a 64 MiB tensor gets off and onto the GPU in this process (no MPI)."""
    x = torch.randn(MIB64 // 4, device=DEVICE)
    dev = torch.empty_like(x)
    pin = pinned(MIB64).view(torch.float32)
    page = torch.ones(MIB64 // 4)

    def h2d(src: torch.Tensor) -> None:
        dev.copy_(src, non_blocking=True)
        sync()

    def via_pinned() -> None:
        pin.copy_(page)
        h2d(pin)

    ways = {"d2h_fresh_pageable": lambda: x.cpu(), "d2h_reused_pageable": lambda: page.copy_(x),
            "d2h_pinned": lambda: pin.copy_(x), "h2d_pageable": lambda: h2d(page),
            "h2d_memcpy_then_pinned": via_pinned, "h2d_pinned": lambda: h2d(pin)}
    out = {}
    for name, fn in ways.items():
        fn()
        out[f"{name}_ms"] = r(timed(fn, calls) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    watchdog()
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("bench_cuda.py: no CUDA device here; run it on a machine with a GPU")

    local_copies = copies(args.calls)
    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("cuda", Receiver)
    mesh.initialized.get(60)
    one = mesh.slice(gpus=0)
    ranks = [one.rank.call_one().get(60), mesh.slice(gpus=1).rank.call_one().get(60)]
    x = torch.randn(MIB64 // 4, device=DEVICE)
    host = pinned(MIB64)
    ack = np.zeros(1, np.uint8)
    world = MPI.COMM_WORLD
    from_pool = world.Get_size() > max(ranks)

    def raw(to_gpu: bool) -> float:
        fut = one.raw_peer.call_one(MIB64, args.calls + 2, to_gpu)
        secs = []
        for _ in range(args.calls + 2):
            t0 = time.perf_counter()
            if to_gpu:
                host.copy_(x.view(torch.uint8))
            world.Send(host.numpy(), ranks[0], RAW_TAG)
            world.Recv(ack, ranks[0], RAW_TAG)
            secs.append(time.perf_counter() - t0)
        fut.get(120)
        return statistics.median(secs[2:])

    numel = 1 << 20
    ours, base, host_only, red, red_base, red_workers = [], [], [], [], [], []
    for _ in range(args.repeats):
        assert one.ignore.call_one(x).get(60) == str(x.device)
        ours.append(timed(lambda: one.ignore.call_one(x).get(60), args.calls))
        if from_pool:
            base.append(raw(True))
            host_only.append(raw(False))
        with procs.activate():
            t = torch.ones(numel, device=DEVICE)

        def reduce_once(t: Any = t) -> None:
            with procs.activate():
                out = t.reduce("gpus", "sum")[:1]
            mpimesh.inspect(out, gpus=0)

        reduce_once()
        red.append(timed(reduce_once, args.calls))
        if from_pool:
            mesh.raw_open.call(ranks, numel).get(120)
            futs = [mesh.slice(gpus=g).raw_allreduce.call_one(args.calls + 2) for g in (0, 1)]
            red_workers.append(statistics.median(futs[0].get(120)[2:]))
            futs[1].get(120)

            def raw_once() -> None:
                mesh.raw_allreduce_once.call().get(60)

            raw_once()
            red_base.append(timed(raw_once, args.calls))
            mesh.raw_close.call().get(60)

    record = {
        "bench": "B4-cuda",
        "what": "64 MiB CUDA tensor as an endpoint argument (no-op endpoint); 4 MiB reduce of CUDA tensors",
        "device": torch.cuda.get_device_name(0) if DEVICE == "cuda" else DEVICE,
        "cuda_aware": cuda_support().aware,
        "calls": args.calls,
        "repeats": args.repeats,
        "arg_ms": r(median(ours) * 1e3),
        "arg_gbps": gbps(median(ours) * 1e3),
        "baseline": "same job: controller copies to a pinned buffer and Sends; worker Recvs into pinned, copies to "
                    "its GPU, synchronizes, acks one byte",
        "baseline_ms": r(median(base) * 1e3) if base else None,
        "baseline_gbps": gbps(median(base) * 1e3) if base else None,
        "ratio_gbps": r(median(base) / median(ours)) if base else None,
        "host_only_ms": r(median(host_only) * 1e3) if host_only else None,
        "host_only_gbps": gbps(median(host_only) * 1e3) if host_only else None,
        "reduce_ms": r(median(red) * 1e3),
        "reduce_timing": "at the controller: issue, reduce, fetch of one element (its round trip included)",
        "reduce_baseline": "same two workers: pinned copy, Allreduce, copy back to the GPU, synchronize; timed at the "
                           "controller from its call to both workers' replies (a round trip, as the reduce's)",
        "reduce_baseline_ms": r(median(red_base) * 1e3) if red_base else None,
        "reduce_ratio": r(median(red) / median(red_base)) if red_base else None,
        "reduce_baseline_workers": "the same reduction timed on the workers between barriers (no round trip)",
        "reduce_baseline_workers_ms": r(median(red_workers) * 1e3) if red_workers else None,
        "copies": local_copies,
        "copies_note": "64 MiB off and onto the GPU in the controller's process, no MPI",
    }
    procs.stop().get(60)
    emit(record)


if __name__ == "__main__":
    main()
