"""B3: throughput of 10,000 ``call_one()`` to one actor without waiting, then wait for all.

Run (worker from the launch pool; the raw baseline runs in the same job)::

    mpiexec --oversubscribe --bind-to none -n 2 .venv/bin/python -m mpimesh benchmarks/bench_b3.py

From a plain ``python -m mpimesh`` the worker is spawned and the baseline
is the same exchange between a singleton and a child it spawned
(``_raw.py --spawn``), over the intercommunicator.

Per repeat: a warm-up batch of 1,000, then the timed batch: 10,000
``call_one()`` futures, then ``get()`` on each, in order.  Baseline: one
synchronizing round, then 10,000 pickled small-tuple ``isend``s from rank 0,
then 10,000 ``recv``s of the worker's echoes (the worker receives and sends
back one by one).  Prints one JSON line.
"""

from __future__ import annotations

import argparse
import time

from _actors import Bench, describe_job, raw_pipelined, raw_standalone
from _common import SPAWNED_BASELINE, emit, median, ratio, watchdog, worker_host


def batch(one, n: int) -> float:
    """Seconds for ``n`` pipelined calls, from the first send to the last reply."""
    t0 = time.perf_counter()
    futs = [one.noop.call_one(i) for i in range(n)]
    for i, f in enumerate(futs):
        if f.get(120) != i:
            raise AssertionError(f"expecting reply {i}, got {f.get()}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=10000)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    watchdog()

    procs = worker_host().spawn_procs(per_host={"gpus": 1})
    mesh = procs.spawn("b3", Bench)
    mesh.initialized.get(60)
    one = mesh.slice(gpus=0)
    info = one.info.call_one().get(60)

    ours, base = [], []
    for _ in range(args.repeats):
        batch(one, args.warmup)
        ours.append(args.calls / batch(one, args.calls))
        if info["spawned"]:
            secs = raw_standalone("pipelined", 2, args.calls, spawned=True)["seconds"]
        else:
            secs = raw_pipelined(one, info["world_rank"], args.calls)
        base.append(args.calls / secs)

    rate = median(ours)
    brate = median(base)
    record = {
        "bench": "B3",
        "what": "10,000 call_one() without waiting, then get() all",
        "calls": args.calls,
        "repeats": args.repeats,
        "calls_per_s": round(rate),
        "baseline": "mpi4py pipelined pickled isend x N then recv N echoes, "
        + (SPAWNED_BASELINE if info["spawned"] else "same job on COMM_WORLD"),
        "baseline_msgs_per_s": round(brate),
        "ratio": ratio(brate, rate),
        "ratio_note": "baseline rate / our rate",
        "repeat_calls_per_s": [round(x) for x in ours],
        "baseline_repeat_msgs_per_s": [round(x) for x in base],
    }
    record.update(describe_job([info]))
    procs.stop().get(60)
    emit(record)


if __name__ == "__main__":
    main()
