"""B8: CPU burnt by idle workers, and B1 latency right after an idle period.

Run (2 workers from the launch pool)::

    mpiexec --oversubscribe --bind-to none -n 3 .venv/bin/python -m mpimesh benchmarks/bench_b8.py

(plain ``python -m mpimesh`` spawns the 2 workers instead; the process ids
come from an endpoint either way).

Per repeat: B1 (200 warm-up + 2,000 timed ``call_one().get()`` to worker 0),
then nothing for 10 s while the CPU time (utime + stime from
``/proc/<pid>/stat``, all threads) of every worker and of the controller is
sampled, then the first call after the idle period on its own, then B1 again
without warm-up.  Baseline, once, same job: both workers' actors sit in a
blocking ``MPI.COMM_WORLD.recv`` for the same idle period (what a raw mpi4py
worker waiting for work costs), their CPU measured the same way.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import time

from _actors import Bench, describe_job, time_calls
from _common import TAG, emit, median, r, summary_us, watchdog
from mpi4py import MPI

from mpimesh import this_host

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # stat fields 14, 15


def idle_cpu(pids: list[int], seconds: float) -> list[float]:
    """Percent of one core used by each of ``pids`` over ``seconds`` of wall time."""
    before = [cpu_seconds(p) for p in pids]
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    return [100.0 * (cpu_seconds(p) - b) / wall for p, b in zip(pids, before, strict=True)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idleness")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    watchdog(120 + args.repeats * (args.idle + 20) + args.idle)

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("b8", Bench)
    mesh.initialized.get(60)
    infos = mesh.info.call().get(60).values()
    pids = [i["pid"] for i in infos]
    one = mesh.slice(gpus=0)
    me = os.getpid()

    rows = []
    for _ in range(args.repeats):
        time_calls(lambda: one.noop.call_one(1).get(), args.warmup)
        before = summary_us(time_calls(lambda: one.noop.call_one(1).get(), args.calls))
        cpu = idle_cpu(pids + [me], args.idle)
        t0 = time.perf_counter_ns()
        one.noop.call_one(1).get()
        first_us = (time.perf_counter_ns() - t0) / 1000
        after = summary_us(time_calls(lambda: one.noop.call_one(1).get(), args.calls))
        rows.append({"worker_cpu_pct": [round(c, 2) for c in cpu[:-1]], "controller_cpu_pct": round(cpu[-1], 2),
                     "before": before, "first_call_after_idle_us": round(first_us, 1), "after": after})

    base_cpu = None
    if not any(i["spawned"] for i in infos):
        # Raw baseline: the workers block in MPI recv for the idle period.
        fut = mesh.block_world.call()
        time.sleep(0.5)  # let both actors enter recv before measuring
        base_cpu = idle_cpu(pids, args.idle)
        for i in infos:
            MPI.COMM_WORLD.send(None, dest=i["world_rank"], tag=TAG + 1)
        fut.get(60)

    worker_pct = median(sum(row["worker_cpu_pct"]) / len(pids) for row in rows)
    record = {
        "bench": "B8",
        "what": f"{len(pids)} workers idle {args.idle:g} s: CPU % of one core per worker; B1 before and after",
        "idle_s": args.idle,
        "repeats": args.repeats,
        "idle_worker_cpu_pct": r(worker_pct),
        "idle_controller_cpu_pct": r(median(row["controller_cpu_pct"] for row in rows)),
        "b1_before_median_us": r(median(row["before"]["median_us"] for row in rows)),
        "b1_before_p99_us": r(median(row["before"]["p99_us"] for row in rows)),
        "first_call_after_idle_us": r(median(row["first_call_after_idle_us"] for row in rows)),
        "b1_after_median_us": r(median(row["after"]["median_us"] for row in rows)),
        "b1_after_p99_us": r(median(row["after"]["p99_us"] for row in rows)),
        "baseline": "worker actor blocked in MPI.COMM_WORLD.recv for the idle period (same job)"
        if base_cpu is not None else None,
        "baseline_idle_worker_cpu_pct": r(sum(base_cpu) / len(base_cpu)) if base_cpu else None,
        "rows": rows,
    }
    record.update(describe_job(infos))
    procs.stop().get(60)
    emit(record)


if __name__ == "__main__":
    main()
