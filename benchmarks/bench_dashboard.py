"""The dashboard's cost (issue #29): controller CPU, B1 and B3, with no page open and with one open.

Run (every pool rank a worker of one mesh; 64 workers: ``-n 65``)::

    mpiexec --oversubscribe --bind-to none -n 9 .venv/bin/python -m mpimesh benchmarks/bench_dashboard.py

The controller serves ``mpimesh.dashboard(0)``.  Per repeat, first with no
page open, then with one (a reader of ``/events`` in a separate process,
as a browser is: it costs the controller only what the server does): the
controller's CPU (utime + stime of all its threads, ``/proc/self/stat``)
over ``--idle`` seconds of an idle job; B1 (2,000 ``call_one().get()`` to
worker 0, median µs); B3 (10,000 pipelined ``call_one()``, calls/s).  Prints
one JSON line: the medians, and the open/closed ratios.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _actors import Bench
from _common import emit, median, r, watchdog

import mpimesh
from mpimesh import this_host

TICK = os.sysconf("SC_CLK_TCK")
READER = "import sys, urllib.request\nfor _ in urllib.request.urlopen(sys.argv[1]): pass\n"


def cpu_seconds() -> float:
    """utime + stime of this process (all its threads), in seconds."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def idle_cpu(seconds: float) -> float:
    """Percent of one core this process used over ``seconds`` of idleness."""
    before, t0 = cpu_seconds(), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu_seconds() - before) / (time.monotonic() - t0)


def b1(one: object, calls: int) -> float:
    """Median µs of ``calls`` sequential ``call_one().get()``."""
    samples = []
    for i in range(calls):
        t0 = time.perf_counter_ns()
        one.noop.call_one(i).get(60)  # type: ignore[attr-defined]
        samples.append(time.perf_counter_ns() - t0)
    return median(samples) / 1000.0


def b3(one: object, calls: int) -> float:
    """Calls per second of ``calls`` pipelined ``call_one()``, then ``get()`` each."""
    t0 = time.perf_counter()
    futs = [one.noop.call_one(i) for i in range(calls)]  # type: ignore[attr-defined]
    for f in futs:
        f.get(120)
    return calls / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=5.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    watchdog(120 + args.repeats * (2 * args.idle + 60))
    url = mpimesh.dashboard(0)
    workers = int(os.environ.get("OMPI_COMM_WORLD_SIZE", "3")) - 1
    procs = this_host().spawn_procs(per_host={"gpus": max(1, workers)})
    mesh = procs.spawn("bench", Bench)
    mesh.initialized.get(120)
    one = mesh.slice(gpus=0)
    b1(one, 200)
    b3(one, 1000)
    figures: dict[str, dict[str, list[float]]] = {"closed": {}, "open": {}}
    for _ in range(args.repeats):
        for state in ("closed", "open"):
            reader = None
            if state == "open":
                reader = subprocess.Popen([sys.executable, "-c", READER, url + "events"])
                time.sleep(1.5)  # the first look (every process asked) is done
            got = figures[state]
            got.setdefault("controller_cpu_pct", []).append(idle_cpu(args.idle))
            got.setdefault("b1_us", []).append(b1(one, 2000))
            got.setdefault("b3_calls_s", []).append(b3(one, 10000))
            if reader is not None:
                reader.kill()
                reader.wait()
                time.sleep(1.5)  # the server sees the page gone; the collector stops
    procs.stop().get(60)
    record: dict[str, object] = {"bench": "dashboard", "workers": workers, "idle_s": args.idle,
                                 "load1": round(os.getloadavg()[0], 2)}
    for state, got in figures.items():
        for name, values in got.items():
            record[f"{state}_{name}"] = r(median(values))
    for name in ("b1_us", "b3_calls_s"):
        record[f"{name}_open_over_closed"] = r(median(figures["open"][name]) / median(figures["closed"][name]), 3)
    emit(record)


if __name__ == "__main__":
    main()
