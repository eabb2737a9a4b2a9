"""B9: broadcast fan-out, ``call().get()`` on meshes of 1, 2, 4, 8 and 16 actors.

Run (16 workers from the launch pool, oversubscribed on a small machine)::

    mpiexec --oversubscribe --bind-to none -n 17 .venv/bin/python -m mpimesh benchmarks/bench_b9.py

From a plain ``python -m mpimesh`` the workers are spawned (one island per
mesh) and the baseline is the same exchange between a singleton and k
children it spawned (``_raw.py --spawn``), over the intercommunicator.

For each size k: ``spawn_procs(per_host={"gpus": k})``, one actor per
process; per repeat 50 warm-up and 500 timed ``call().get()``, the
controller's CPU time (``time.process_time``: all its threads) over the
timed calls; then the baseline on the same k ranks: rank 0 sends a pickled
small tuple to each and receives each answer, 20 + 500 rounds (the workers
sit in blocking ``recv``).  The processes go back to the pool before the next
size.  Prints one JSON line.
"""

from __future__ import annotations

import argparse
import os
import time

from _actors import Bench, describe_job, raw_fanout, raw_standalone
from _common import SPAWNED_BASELINE, emit, median, r, ratio, summary_us, watchdog

from mpimesh import this_host


def timed(mesh, n: int) -> tuple[dict[str, float], float]:
    """``n`` calls on the whole mesh: latency summary and controller CPU µs per call."""
    clock = time.perf_counter_ns
    out = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = clock()
        mesh.noop.call(1).get(120)
        out.append(clock() - t0)
    cpu = time.process_time() - cpu0
    return summary_us(out), cpu / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1,2,4,8,16")
    ap.add_argument("--calls", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--base-warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    watchdog(float(os.environ.get("BENCH_WATCHDOG_S", "540")))

    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    job = None
    for k in sizes:
        procs = this_host().spawn_procs(per_host={"gpus": k})
        mesh = procs.spawn(f"b9_{k}", Bench)
        mesh.initialized.get(120)
        infos = mesh.info.call().get(120).values()
        spawned = any(i["spawned"] for i in infos)
        job = describe_job(infos)
        ours, cpus, base, bcpus = [], [], [], []
        for _ in range(args.repeats):
            timed(mesh, args.warmup)
            lat, cpu = timed(mesh, args.calls)
            ours.append(lat)
            cpus.append(cpu)
            rounds = args.base_warmup + args.calls
            if spawned:
                res = raw_standalone("fanout", k + 1, rounds, timeout=240, spawned=True)
                ns, bcpu = res["ns"], res["cpu_s"]
            else:
                ns, bcpu = raw_fanout(mesh, [i["world_rank"] for i in infos], rounds, timeout=240)
            base.append(summary_us(ns[args.base_warmup:]))
            bcpus.append(bcpu / rounds * 1e6)
        procs.stop().get(120)
        med = median(s["median_us"] for s in ours)
        bmed = median(s["median_us"] for s in base)
        results[str(k)] = {
            "median_us": r(med),
            "p99_us": r(median(s["p99_us"] for s in ours)),
            "controller_cpu_us_per_call": r(median(cpus)),
            "baseline_median_us": r(bmed),
            "baseline_controller_cpu_us_per_round": r(median(bcpus)),
            "ratio": ratio(med, bmed),
            "repeat_medians_us": [s["median_us"] for s in ours],
        }

    record = {
        "bench": "B9",
        "what": "call().get() on meshes of k actors, one per process, oversubscribed",
        "calls": args.calls,
        "repeats": args.repeats,
        "sizes": results,
        "baseline": "mpi4py pickled send to each of k ranks then recv each; workers in blocking recv; "
        + (SPAWNED_BASELINE if job and job["workers"] == "spawned" else "same job on COMM_WORLD"),
        "cpu_note": "controller process CPU (all its threads, time.process_time) over the timed calls / calls; "
        "includes the waiting thread's spin-polling",
        "cores": os.cpu_count(),
    }
    record.update(job or {})
    emit(record)


if __name__ == "__main__":
    main()
