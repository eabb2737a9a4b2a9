"""B1: round-trip latency of ``call_one().get()`` to one actor in another process.

Run (workers from the launch pool; the raw baseline runs in the same job)::

    mpiexec --oversubscribe --bind-to none -n 2 .venv/bin/python -m mpimesh benchmarks/bench_b1.py

``-n 3`` works too (the spare rank idles).  From a plain
``python -m mpimesh benchmarks/bench_b1.py`` the worker is spawned and the
baseline is the same ping-pong between a singleton and a child it spawned
(``_raw.py --spawn``), over the intercommunicator that spawned workers have.

Per repeat: 200 warm-up calls, 2,000 timed sequential calls; then the
baseline: pickled small-tuple ``send``/``recv`` ping-pong between rank 0 and
the worker's rank (200 warm-up + 2,000 rounds).  Prints one JSON line.

Where a round trip's time goes was measured with clock stamps in a scratch
build of the native part (docs/design/data.md, "B1 at 1.1x"): Python-level
probes, as an earlier ``--split`` had, miss the paths that run in C.
"""

from __future__ import annotations

import argparse

from _actors import Bench, describe_job, raw_fanout, raw_standalone, time_calls
from _common import SPAWNED_BASELINE, emit, median, r, ratio, summary_us, watchdog, worker_host


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    watchdog()

    procs = worker_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("b1", Bench)
    mesh.initialized.get(60)
    one = mesh.slice(gpus=0)
    info = one.info.call_one().get(60)

    ours, base = [], []
    for _ in range(args.repeats):
        time_calls(lambda: one.noop.call_one(1).get(), args.warmup)
        ours.append(summary_us(time_calls(lambda: one.noop.call_one(1).get(), args.calls)))
        if info["spawned"]:
            rounds = args.warmup + args.calls
            ns = raw_standalone("fanout", 2, rounds, spawned=True)["ns"][args.warmup:]
        else:
            ns, _ = raw_fanout(mesh, [info["world_rank"]], args.warmup + args.calls)
            ns = ns[args.warmup:]
        base.append(summary_us(ns))

    med = median(s["median_us"] for s in ours)
    bmed = median(s["median_us"] for s in base)
    record = {
        "bench": "B1",
        "what": "call_one().get() round trip to 1 actor in another process",
        "calls": args.calls,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "median_us": r(med),
        "p99_us": r(median(s["p99_us"] for s in ours)),
        "baseline": "mpi4py pickled send/recv ping-pong of a small tuple, "
        + (SPAWNED_BASELINE if info["spawned"] else "same job, rank 0 <-> worker rank on COMM_WORLD"),
        "baseline_median_us": r(bmed),
        "baseline_p99_us": r(median(s["p99_us"] for s in base)),
        "ratio": ratio(med, bmed),
        "repeat_medians_us": [s["median_us"] for s in ours],
        "baseline_repeat_medians_us": [s["median_us"] for s in base],
    }
    record.update(describe_job([info]))
    procs.stop().get(60)
    emit(record)


if __name__ == "__main__":
    main()
