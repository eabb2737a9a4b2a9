"""The dashboard's cost (issue #29): controller CPU, B1 and B3, with no page open and with one open.

Run (every pool rank a worker of one mesh; 64 workers: ``-n 65``)::

    mpiexec --oversubscribe --bind-to none -n 9 .venv/bin/python -m mpimesh benchmarks/bench_dashboard.py

The controller serves ``mpimesh.dashboard(0)``.  Each of ``--repeats``
rounds measures both states, closed then open in even rounds and open then
closed in odd ones, so that a drift of the shared machine's load falls on
both alike.  "Open" is a reader of ``/events`` in a separate process, as a
browser is: it costs the controller only what the server does.  In each
state: the controller's CPU (utime + stime of all its threads,
``/proc/self/stat``) and the workers' (summed) over ``--idle`` seconds of
an idle job; B1 (``--b1-calls`` sequential ``call_one().get()`` to worker
0, median µs); B3 (``--b3-calls`` pipelined ``call_one()``, calls/s).

Prints one JSON line: per state the median of each figure; per figure the
open/closed ratio of each round (paired: same round, same load), their
median and their spread (min, max); and the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from typing import Any

from _actors import Bench
from _common import emit, median, r, watchdog

import mpimesh
from mpimesh import this_host

TICK = os.sysconf("SC_CLK_TCK")
READER = "import sys, urllib.request\nfor _ in urllib.request.urlopen(sys.argv[1]): pass\n"
FIGURES = ("controller_cpu_pct", "workers_cpu_pct", "b1_us", "b3_calls_s")


def cpu_seconds(pid: int | str = "self") -> float:
    """utime + stime of a process (all its threads), in seconds; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def idle_cpu(seconds: float, workers: list[int]) -> tuple[float, float]:
    """Percent of one core this process, and its workers together, used over ``seconds`` of idleness."""
    mine, theirs, t0 = cpu_seconds(), sum(cpu_seconds(p) for p in workers), time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    return (100.0 * (cpu_seconds() - mine) / wall,
            100.0 * (sum(cpu_seconds(p) for p in workers) - theirs) / wall)


def b1(one: Any, calls: int) -> float:
    """Median µs of ``calls`` sequential ``call_one().get()``."""
    samples = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        one.noop.call_one(i).get(60)
        samples.append(time.perf_counter_ns() - t0)
    return median(samples) / 1000.0


def b3(one: Any, calls: int) -> float:
    """Calls per second of ``calls`` pipelined ``call_one()``, then ``get()`` each."""
    t0 = time.perf_counter()
    futs = [one.noop.call_one(i) for i in range(calls)]
    for f in futs:
        f.get(120)
    return calls / (time.perf_counter() - t0)


def measure(state: str, url: str, one: Any, pids: list[int], args: argparse.Namespace) -> dict[str, float]:
    """One state's figures: a page open (a reader of ``/events``) or none."""
    reader = None
    if state == "open":
        reader = subprocess.Popen([sys.executable, "-c", READER, url + "events"])
        time.sleep(1.5)  # the first look (every process asked) is done
    try:
        controller, workers = idle_cpu(args.idle, pids)
        return {"controller_cpu_pct": controller, "workers_cpu_pct": workers,
                "b1_us": b1(one, args.b1_calls), "b3_calls_s": b3(one, args.b3_calls)}
    finally:
        if reader is not None:
            reader.kill()
            reader.wait()
            time.sleep(1.5)  # the server sees the page gone; the collector stops


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=4.0, help="seconds of idleness per CPU figure")
    ap.add_argument("--repeats", type=int, default=6, help="rounds (each measures closed and open)")
    ap.add_argument("--b1-calls", type=int, default=2000)
    ap.add_argument("--b3-calls", type=int, default=10000)
    args = ap.parse_args()
    watchdog(120 + args.repeats * (2 * args.idle + 60))
    load_before = os.getloadavg()[0]
    url = mpimesh.dashboard(0)
    workers = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "3")) - 1
    procs = this_host().spawn_procs(per_host={"gpus": max(1, workers)})
    mesh = procs.spawn("bench", Bench)
    mesh.initialized.get(120)
    pids = [int(info["pid"]) for info in mesh.info.call().get(60).values()]
    one = mesh.slice(gpus=0)
    b1(one, 200)
    b3(one, 1000)
    rounds: list[dict[str, dict[str, float]]] = []
    for i in range(args.repeats):
        order = ("closed", "open") if i % 2 == 0 else ("open", "closed")
        rounds.append({state: measure(state, url, one, pids, args) for state in order})
    procs.stop().get(60)
    record: dict[str, object] = {"bench": "dashboard", "workers": workers, "idle_s": args.idle,
                                 "repeats": args.repeats, "load1_before": round(load_before, 2),
                                 "load1_after": round(os.getloadavg()[0], 2)}
    for state in ("closed", "open"):
        for name in FIGURES:
            record[f"{state}_{name}"] = r(median(one_round[state][name] for one_round in rounds))
    for name in FIGURES:
        ratios = [one_round["open"][name] / one_round["closed"][name] for one_round in rounds
                  if one_round["closed"][name] > 0]
        if ratios:
            record[f"{name}_open_over_closed"] = {"median": r(median(ratios), 3), "min": r(min(ratios), 3),
                                                  "max": r(max(ratios), 3)}
    emit(record)


if __name__ == "__main__":
    main()
