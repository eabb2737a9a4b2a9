"""T1-T3: the tensor engine's issue rate, a 64 MiB reduce, and a 64 MiB fetch_shard, each with its raw baseline.

Run (4 pool workers; the baselines run on the same processes in the same job)::

    mpiexec --oversubscribe --bind-to none -n 5 .venv/bin/python -m mpimesh benchmarks/bench_tensor.py

* T1: ``a = a + 1`` on 16-element tensors inside ``procs.activate()``,
  ``--ops`` times, timed on the controller without waiting (then one fetch
  checks the value, untimed); also per second of the controller process's
  CPU time (``time.process_time``: every thread of it, the progress
  thread that sends the batches included), the rate where the controller
  has a core of its own.  Baseline: the same loop through a
  ``torch.Tensor`` wrapper subclass whose ``__torch_dispatch__`` does
  nothing but return a new wrapper (torch's own cost per operation for
  any design that intercepts below autograd), in the same process, right
  after ours in each repeat, per second and per second of process CPU;
  the CPU ratio compares CPU with CPU.
* T2: ``t.reduce("gpus", "sum")`` (new result) and ``t.reduce_("gpus", "sum")``
  (in place) of 64 MiB float32 on 4 processes, each timed on the controller
  from issue to a 4-byte fetch of a result element.  Baseline: raw
  ``Allreduce`` of the same tensors' memory into a reused buffer on a
  communicator of the same 4 processes, timed on the workers (rank 0 of the
  mesh), in the same job.
* T3: ``fetch_shard(t, gpus=1).get()`` of 64 MiB.  Baseline: raw
  ``Send`` of the same tensor's bytes from that process to rank 0
  (``COMM_WORLD``), received into a reused buffer, timed on rank 0.

``--hosts``: the mesh spans every host of the job (``hosts x gpus``) and
T2 reduces over both dimensions; T3 fetches from a process on the last
host.  Across the simulated hosts::

    bash .ci/multihost.sh up 2
    mpiexec $(bash .ci/multihost.sh flags) --host mh1:3,mh2:2 -n 5 \
        .venv/bin/python -m mpimesh benchmarks/bench_tensor.py --hosts

Prints one JSON line; figures are medians over ``--repeats`` of per-repeat medians.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from _common import emit, gbps, median, r, watchdog
from mpi4py import MPI

import mpimesh
from mpimesh import host_mesh, this_host

N64 = 16 * 1024 * 1024  # float32 elements in 64 MiB


@mpimesh.remote(propagate=lambda t, reps, ranks: torch.empty(reps, dtype=torch.float64))
def raw_allreduce(t: torch.Tensor, reps: int, ranks: list[int]) -> torch.Tensor:
    """Time ``reps`` raw Allreduce of ``t``'s memory on a communicator of ``ranks`` (world ranks)."""
    world = MPI.COMM_WORLD
    group = world.Get_group().Incl(ranks)
    comm = world.Create_group(group, tag=4242)
    group.Free()
    src, dst = t.numpy(), torch.empty_like(t).numpy()
    out = []
    for _ in range(reps):
        comm.Barrier()
        t0 = time.perf_counter()
        comm.Allreduce(src, dst, op=MPI.SUM)
        out.append(time.perf_counter() - t0)
    comm.Free()
    return torch.tensor(out, dtype=torch.float64)


@mpimesh.remote(propagate=lambda t, reps: torch.empty(()))
def raw_send(t: torch.Tensor, reps: int) -> torch.Tensor:
    """Send ``t``'s bytes to world rank 0, ``reps`` times (each acknowledged)."""
    buf = t.numpy()
    for _ in range(reps):
        MPI.COMM_WORLD.Send(buf, dest=0, tag=78)
        MPI.COMM_WORLD.Recv(bytearray(1), source=0, tag=79)
    return torch.zeros(())


class _Floor(torch.Tensor):
    """A wrapper subclass whose dispatch does nothing: torch's own per-operation cost."""

    @staticmethod
    def __new__(cls) -> _Floor:
        return torch.Tensor._make_wrapper_subclass(cls, (16,), dtype=torch.float32, device="cpu")

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return _Floor()


def floor_rate(ops: int) -> tuple[float, float]:
    """The baseline's operations per second and per second of the process's CPU."""
    a = _Floor()
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(ops):
        a = a + 1
    return ops / (time.perf_counter() - t0), ops / (time.process_time() - c0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=20_000)
    ap.add_argument("--global-ops", type=int, default=5_000,
                    help="T1's loop on a global-view DTensor (each op runs torch's DTensor dispatch on the workers)")
    ap.add_argument("--only-t1", action="store_true", help="T1 only (per-process and global), no T2/T3")
    ap.add_argument("--reps", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--hosts", action="store_true",
                    help="a mesh over every host of the job (hosts x gpus, 4 processes in all), reduced over both")
    args = ap.parse_args()
    watchdog()

    dims: str | tuple[str, ...] = "gpus"
    far = {"gpus": 1}  # the process T3 fetches from
    if args.hosts:
        hosts = host_mesh()
        n_hosts = hosts.size("hosts")
        procs = hosts.spawn_procs(per_host={"gpus": 4 // n_hosts})
        dims, far = ("hosts", "gpus"), {"hosts": n_hosts - 1, "gpus": 0}
    else:
        procs = this_host().spawn_procs(per_host={"gpus": 4})
    last = {label: size - 1 for label, size in zip(procs._shape.labels, procs._shape.sizes, strict=True)}
    far_rank = procs._addrs[procs.slice(**far)._shape.ranks()[0]][1]
    world_ranks = [a[1] for a in procs._addrs]
    pool = all(a[0] == 0 for a in procs._addrs)
    g_rates, g_cpu_rates = [], []
    floor_cpu_rates: list[float] = []
    floors, rates, cpu_rates, ours, ours_inplace, base, fetched, sent = [], [], [], [], [], [], [], []
    with procs.activate():
        big = torch.ones(N64)
    for _ in range(args.repeats):
        # T1
        with procs.activate():
            a = torch.zeros(16)
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.ops):
                a = a + 1
            rates.append(args.ops / (time.perf_counter() - t0))
            cpu_rates.append(args.ops / (time.process_time() - c0))
        assert mpimesh.inspect(a, **last)[0].item() == args.ops
        floor, floor_cpu = floor_rate(args.ops)
        floors.append(floor)
        floor_cpu_rates.append(floor_cpu)
        # T1 for global-view tensors: the same loop on an mpimesh.DTensor sharded over the mesh
        g = mpimesh.distribute(torch.zeros(16 * 4), procs, sharding_spec=[dims if isinstance(dims, str) else dims[-1]])
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(args.global_ops):
            g = g + 1
        g_rates.append(args.global_ops / (time.perf_counter() - t0))
        g_cpu_rates.append(args.global_ops / (time.process_time() - c0))
        assert g.full_tensor()[0].item() == args.global_ops
        if args.only_t1:
            continue
        # T2
        with procs.activate():
            warm = big.reduce(dims, "sum")
        mpimesh.inspect(warm.view(-1)[:1])
        times, times_inplace = [], []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            with procs.activate():
                s = big.reduce(dims, "sum")
            mpimesh.inspect(s[:1])
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            with procs.activate():
                big.reduce_(dims, "sum")
            mpimesh.inspect(big[:1])
            times_inplace.append(time.perf_counter() - t0)
        with procs.activate():
            big.fill_(1.0)
        ours.append(statistics.median(times) * 1e3)
        ours_inplace.append(statistics.median(times_inplace) * 1e3)
        if pool:
            with procs.activate():
                raw = raw_allreduce(big, args.reps + 1, world_ranks)
            base.append(statistics.median(mpimesh.inspect(raw)[1:].tolist()) * 1e3)
        # T3
        mpimesh.fetch_shard(big, **far).get(120)
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            mpimesh.fetch_shard(big, **far).get(120)
            times.append(time.perf_counter() - t0)
        fetched.append(statistics.median(times) * 1e3)
        if pool:
            one = procs.slice(**far)
            sink = bytearray(N64 * 4)
            with one.activate():
                done = raw_send(big.slice_mesh(**far), args.reps + 1)
            mpimesh.tensor._client.client_of(procs).flush()
            secs = []
            for _ in range(args.reps + 1):
                t0 = time.perf_counter()
                MPI.COMM_WORLD.Recv(sink, source=far_rank, tag=78)
                secs.append(time.perf_counter() - t0)
                MPI.COMM_WORLD.Send(bytearray(1), dest=far_rank, tag=79)
            mpimesh.inspect(done)
            sent.append(statistics.median(secs[1:]) * 1e3)

    record = {
        "bench": "T1-T3",
        "what": "tensor engine on 4 processes: ops issued/s; 64 MiB reduce('gpus', 'sum'); 64 MiB fetch_shard",
        "processes": "launch pool" if pool else "spawned",
        "mesh": dict(zip(procs._shape.labels, procs._shape.sizes, strict=True)),
        "hosts": sorted(set(procs._hosts)),
        "t1_ops_per_s": round(median(rates)),
        "t1_target": 50_000,
        "t1_ops_per_controller_cpu_s": round(median(cpu_rates)),
        "t1_cpu_note": "ops over the controller process's CPU time (all its threads, time.process_time): the rate "
                       "with a core of its own (here 4 busy workers share the 2 cores with it)",
        "t1_baseline": "the same loop through a do-nothing __torch_dispatch__ wrapper subclass, same process",
        "t1_baseline_ops_per_s": round(median(floors)),
        "t1_baseline_ops_per_cpu_s": round(median(floor_cpu_rates)),
        "t1_ratio": r(median(rates) / median(floors)),
        "t1_global_ops_per_s": round(median(g_rates)),
        "t1_global_ops_per_controller_cpu_s": round(median(g_cpu_rates)),
        "t1_global_cpu_ratio": r(median(g_cpu_rates) / median(floor_cpu_rates)),
        "t1_global_note": "g = g + 1 on an mpimesh.DTensor Shard(0) over the mesh; cpu ratios: ops per second of "
                          "the controller process's CPU over the baseline's ops per second of CPU (target >= 0.5)",
        "t1_cpu_ratio": r(median(cpu_rates) / median(floor_cpu_rates)),
        "loadavg_1m": round(os.getloadavg()[0], 1),
        "t2_reduce_ms": r(median(ours)) if ours else None,
        "t2_reduce_inplace_ms": r(median(ours_inplace)) if ours else None,
        "t2_baseline": "raw Allreduce of the same memory on a communicator of the same 4 processes, same job"
        if base else None,
        "t2_baseline_ms": r(median(base)) if base else None,
        "t2_ratio": r(median(base) / median(ours)) if base else None,
        "t2_ratio_inplace": r(median(base) / median(ours_inplace)) if base else None,
        "t3_fetch_ms": r(median(fetched)) if fetched else None,
        "t3_fetch_gbps": gbps(median(fetched)) if fetched else None,
        "t3_baseline": "raw Send of the same 64 MiB from that process to rank 0, same job" if sent else None,
        "t3_baseline_ms": r(median(sent)) if sent else None,
        "t3_ratio": r(median(sent) / median(fetched)) if sent else None,
        "ratio_note": "baseline time over ours (targets: T2 >= 0.8, T3 >= 0.7); T2/T3 include a controller round trip",
        "repeats": args.repeats,
    }
    procs.stop().get(60)
    emit(record)


if __name__ == "__main__":
    main()
