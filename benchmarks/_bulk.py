"""Raw mpi4py baselines of the bulk-data benchmarks (B4, B6): both halves, and a standalone job.

In an mpimesh job, the worker half runs inside an endpoint of the benchmark
actor on ``MPI.COMM_WORLD`` (tag ``_common.TAG + 10``), which mpimesh never
uses, while rank 0 runs the controller half on its main thread.  Run alone
(``mpiexec -n 2 python benchmarks/_bulk.py KIND REPEATS``) the same exchange
runs in a pure mpi4py job, without mpimesh's threads, and prints one JSON
line: the baseline for spawned workers, and a second opinion otherwise.

Buffers are reused and faulted in before timing, and the receive side sits
at the same address modulo 64 as the send side: the best case for the copy
(misaligned copies run at half speed or less on the machines measured).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

import numpy as np
from _common import TAG

__all__ = ["aligned", "sendrecv_root", "sendrecv_peer", "get_root", "get_peer", "pair", "MIB64"]

MIB64 = 64 * 1024 * 1024
BULK_TAG = TAG + 10


def aligned(nbytes: int, offset: int = 0) -> np.ndarray:
    """A faulted-in uint8 array whose address is ``offset`` modulo 64."""
    base = np.ones(nbytes + 128, np.uint8)
    start = (offset - base.ctypes.data) % 64
    return base[start:start + nbytes]


def pair(comm: Any, peer: int) -> Any:
    """A communicator of rank 0 and ``peer`` alone (collective over those two only)."""
    group = comm.Get_group().Incl([0, peer])
    try:
        return comm.Create_group(group, tag=BULK_TAG)
    finally:
        group.Free()


def sendrecv_root(comm: Any, peer: int, src: np.ndarray, reps: int) -> list[float]:
    """Rank 0's half of the Send/Recv baseline: per repeat, Send ``src``, wait for a 1-byte ack; seconds."""
    ack = np.empty(1, np.uint8)
    comm.Send(np.array([src.ctypes.data % 64], np.int64), peer, BULK_TAG)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        comm.Send(src, peer, BULK_TAG)
        comm.Recv(ack, peer, BULK_TAG)
        out.append(time.perf_counter() - t0)
    return out


def sendrecv_peer(comm: Any, nbytes: int, reps: int, reduce: bool = False) -> int:
    """The peer's half: receive at the sender's alignment, (sum,) ack."""
    offset = np.empty(1, np.int64)
    comm.Recv(offset, 0, BULK_TAG)
    buf = aligned(nbytes, int(offset[0]))
    ack = np.empty(1, np.uint8)
    for _ in range(reps):
        comm.Recv(buf, 0, BULK_TAG)
        if reduce:
            buf.view(np.float32).sum()
        comm.Send(ack, 0, BULK_TAG)
    return reps


def get_root(comm2: Any, nbytes: int, reps: int) -> list[float]:
    """Rank 0 of a 2-process communicator: ``Win.Allocate`` (0 bytes here), then lock/Get/unlock; seconds."""
    from mpi4py import MPI

    win = MPI.Win.Allocate(0, 1, comm=comm2)
    try:
        base = comm2.recv(source=1, tag=BULK_TAG)
        dst = aligned(nbytes, base % 64)
        out = []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            win.Lock(1, MPI.LOCK_SHARED)
            win.Get([dst, MPI.BYTE], 1, [0, nbytes, MPI.BYTE])
            win.Unlock(1)
            out.append(time.perf_counter() - t0)
        if int(dst[-1]) != 7:
            raise AssertionError(f"Win.Get read {int(dst[-1])}, expecting 7")
        comm2.Barrier()
        return out[1:]
    finally:
        win.Free()


def get_peer(comm2: Any, nbytes: int) -> int:
    """Rank 1's half: allocate and fill the window, then wait while rank 0 reads it."""
    from mpi4py import MPI

    win = MPI.Win.Allocate(nbytes, 1, comm=comm2)
    try:
        mem = np.frombuffer(win.tomemory(), np.uint8)
        mem[:] = 7
        comm2.send(int(mem.ctypes.data), dest=0, tag=BULK_TAG)
        comm2.Barrier()
    finally:
        win.Free()
    return nbytes


def _standalone(kind: str, reps: int) -> None:
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    if kind == "b4":
        if rank == 0:
            import torch

            src = torch.randn(MIB64 // 4).view(torch.uint8).numpy()  # the allocator B4 sends from
            secs = sendrecv_root(world, 1, src, reps + 2)[2:]
        else:
            sendrecv_peer(world, MIB64, reps + 2)
    else:
        comm2 = pair(world, 1)
        secs = get_root(comm2, MIB64, reps) if rank == 0 else [get_peer(comm2, MIB64)]
    if rank == 0:
        ms = statistics.median(secs) * 1e3
        print(json.dumps({"kind": kind, "median_ms": round(ms, 3), "gbps": round(MIB64 / ms / 1e6, 2),
                          "repeat_ms": [round(s * 1e3, 3) for s in secs],
                          "mpi_library": MPI.Get_library_version().splitlines()[0].strip("\x00 ")}), flush=True)


if __name__ == "__main__":
    _standalone(sys.argv[1], int(sys.argv[2]))
