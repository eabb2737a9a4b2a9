"""B2: ``call().get()`` on a mesh of 2 actors in 2 processes.

Run (workers from the launch pool; the raw baseline runs in the same job)::

    mpiexec --oversubscribe --bind-to none -n 3 .venv/bin/python -m mpimesh benchmarks/bench_b2.py

From a plain ``python -m mpimesh`` the workers are spawned and the baseline
is the same exchange between a singleton and 2 children it spawned
(``_raw.py --spawn``), over the intercommunicator.

Per repeat: 100 warm-up calls, 1,000 timed calls on the whole mesh; then the
baseline: rank 0 sends a pickled small tuple to both worker ranks and
receives both answers, 100 + 1,000 rounds.  Prints one JSON line.
"""

from __future__ import annotations

import argparse

from _actors import Bench, describe_job, raw_fanout, raw_standalone, time_calls
from _common import SPAWNED_BASELINE, emit, median, r, ratio, summary_us, watchdog

from mpimesh import this_host


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    watchdog()

    procs = this_host().spawn_procs(per_host={"gpus": 2})
    mesh = procs.spawn("b2", Bench)
    mesh.initialized.get(60)
    infos = mesh.info.call().get(60).values()
    spawned = any(i["spawned"] for i in infos)
    check = mesh.noop.call(7).get(60).values()
    assert check == [7, 7], check

    ours, base = [], []
    for _ in range(args.repeats):
        time_calls(lambda: mesh.noop.call(1).get(), args.warmup)
        ours.append(summary_us(time_calls(lambda: mesh.noop.call(1).get(), args.calls)))
        rounds = args.warmup + args.calls
        if spawned:
            ns = raw_standalone("fanout", 3, rounds, spawned=True)["ns"]
        else:
            ns, _ = raw_fanout(mesh, [i["world_rank"] for i in infos], rounds)
        base.append(summary_us(ns[args.warmup:]))

    med = median(s["median_us"] for s in ours)
    bmed = median(s["median_us"] for s in base)
    record = {
        "bench": "B2",
        "what": "call().get() on a mesh of 2 actors in 2 processes",
        "calls": args.calls,
        "warmup": args.warmup,
        "repeats": args.repeats,
        "median_us": r(med),
        "p99_us": r(median(s["p99_us"] for s in ours)),
        "baseline": "mpi4py pickled send to both ranks then recv both, "
        + (SPAWNED_BASELINE if spawned else "same job on COMM_WORLD"),
        "baseline_median_us": r(bmed),
        "baseline_p99_us": r(median(s["p99_us"] for s in base)),
        "ratio": ratio(med, bmed),
        "repeat_medians_us": [s["median_us"] for s in ours],
        "baseline_repeat_medians_us": [s["median_us"] for s in base],
    }
    record.update(describe_job(infos))
    procs.stop().get(60)
    emit(record)


if __name__ == "__main__":
    main()
