"""B7: a worker dies while a call to it is pending: ms from the death to the exception at the caller.

Run (a driver: it launches every job itself, each bounded)::

    .venv/bin/python benchmarks/bench_b7.py              # 50 kills per mode
    .venv/bin/python benchmarks/bench_b7.py --kills 10 --modes spawned,raw

Modes, each ``--kills`` kill-and-recover rounds:

* ``pool``: launch-pool workers, ``mpimesh run -n K`` (``mpiexec --with-ft
  ulfm``: ULFM keeps the survivors).  Every round takes a fresh pool rank, so
  a job does K-1 rounds and the mode runs as many jobs as it needs
  (``--pool-n``, default 26: two jobs for 50 kills).
* ``spawned``: ``python -m mpimesh``: every round spawns a fresh process
  with ``MPI_Comm_spawn``.
* ``exit1``: spawned workers that call ``os._exit(1)`` inside the pending
  call; the time runs from just before the ``os._exit``, stamped by the
  worker with ``CLOCK_MONOTONIC`` (one clock for the whole host).
* ``pool-exit1``: the same with launch-pool workers
  (survivable since ``mpimesh run`` sets PRRTE's
  ``state_base_error_non_zero_exit=0`` on Open MPI 5.0.9 and later).
* ``raw``: the baseline, ULFM's own detection: a raw mpi4py job under
  ``mpiexec --with-ft ulfm -n R``; rank 0 has an ``irecv`` pending from rank
  i, SIGKILLs it, and times the ``MPI.Exception`` (``ERR_PROC_FAILED``).

A round: ``spawn_procs`` + ``spawn`` + a first call (``recover_ms``: what it
costs to continue on fresh processes), then a pending call to an endpoint
that blocks, then ``os.kill(pid, SIGKILL)`` from the controller (``t0``),
then ``get(--cap)`` until ``SupervisionError`` (``t1``); ``detect_ms = t1 -
t0``.  Then ``procs.stop()``.  A ``get`` that runs past ``--cap`` is a hang,
and so is every round a job did not reach before it was killed at its
``--timeout``; rounds a job did not reach because it ended early are
``lost``.  A job that finished its rounds but does not exit within
``--exit-bound`` seconds is an ``exit_hang`` (killed with its whole session).

Bounds (../shared/reference/BENCHMARKS.md, B7): 100 ms from SIGKILL to the
exception for launch-pool workers, 2 s for any other death and for spawned
workers.  Prints one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

from _common import emit, kill_session, launch_env, median, percentile, r, worker_host

from mpimesh import Actor, endpoint

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.dirname(sys.executable)
BOUND_MS = {"pool": 100.0, "spawned": 2000.0, "exit1": 2000.0, "pool-exit1": 2000.0}
MODES = ("pool", "spawned", "exit1", "pool-exit1", "raw")


# ---------------------------------------------------------------------------
# the job side (controller script under `python -m mpimesh`)


class Victim(Actor):
    """One per worker process; dies on request."""

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def block(self) -> None:
        time.sleep(600)  # the pending call: the controller kills this process meanwhile

    @endpoint
    def exit_now(self, stamp: str) -> None:
        with open(stamp, "w") as f:
            f.write(repr(time.clock_gettime(time.CLOCK_MONOTONIC)))
        os._exit(1)


def child(how: str, rounds: int, cap: float) -> None:
    """Kill-and-recover ``rounds`` times; one ``B7ROUND`` JSON line per round, then ``B7END``."""
    from mpi4py import MPI

    import mpimesh
    from mpimesh import SupervisionError

    failures: list[Any] = []
    mpimesh.unhandled_fault_hook = failures.append  # keep running: we handle deaths here
    stamps = tempfile.mkdtemp(prefix="mpimesh-b7-")
    for i in range(rounds):
        row: dict[str, Any] = {"round": i}
        t_r = time.monotonic()
        try:
            procs = worker_host().spawn_procs(per_host={"gpus": 1})
            mesh = procs.spawn("victim", Victim)
            pid = mesh.pid.call_one().get(cap)
        except Exception as exc:  # no fresh process: nothing more to measure in this job
            row["outcome"] = f"recover failed: {type(exc).__name__}: {exc}"
            print("B7ROUND " + json.dumps(row), flush=True)
            break
        row["recover_ms"] = (time.monotonic() - t_r) * 1e3
        stamp = os.path.join(stamps, f"{i}.txt")
        if how == "sigkill":
            fut = mesh.block.call_one()
            t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
            os.kill(pid, signal.SIGKILL)
        else:
            fut = mesh.exit_now.call_one(stamp)
        try:
            fut.get(cap)
            row["outcome"] = "value"
        except SupervisionError:
            t1 = time.clock_gettime(time.CLOCK_MONOTONIC)
            row["outcome"] = "supervision"
        except TimeoutError:
            row["outcome"] = "hang"
        except Exception as exc:
            row["outcome"] = f"{type(exc).__name__}: {exc}"
        if row["outcome"] == "supervision":
            if how != "sigkill":
                with open(stamp) as f:
                    t0 = float(f.read())
            row["detect_ms"] = (t1 - t0) * 1e3
        try:
            procs.stop().get(cap)
        except Exception as exc:
            row["stop"] = f"{type(exc).__name__}: {exc}"
        print("B7ROUND " + json.dumps(row), flush=True)
    shutil.rmtree(stamps, ignore_errors=True)
    end = {"mpi_library": MPI.Get_library_version().splitlines()[0].rstrip("\x00 "), "failures": len(failures)}
    print("B7END " + json.dumps(end), flush=True)


def raw() -> None:
    """The baseline: rank 0 SIGKILLs each other rank in turn while an irecv from it is pending."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if rank != 0:
        comm.send(os.getpid(), dest=0, tag=1)
        comm.recv(source=0, tag=2)  # never sent: rank 0 kills this process
        return
    pids = [0] + [comm.recv(source=i, tag=1) for i in range(1, size)]
    for i in range(1, size):
        req = comm.irecv(source=i, tag=3)
        t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
        os.kill(pids[i], signal.SIGKILL)
        row: dict[str, Any] = {"round": i}
        try:
            req.wait()
            row["outcome"] = "value"
        except MPI.Exception as exc:
            row["detect_ms"] = (time.clock_gettime(time.CLOCK_MONOTONIC) - t0) * 1e3
            row["outcome"] = exc.Get_error_string()
        print("B7ROUND " + json.dumps(row), flush=True)
    print("B7END " + json.dumps({"mpi_library": MPI.Get_library_version().splitlines()[0].rstrip("\x00 ")}), flush=True)
    sys.stdout.flush()
    os._exit(0)  # every peer is dead: skip MPI_Finalize


# ---------------------------------------------------------------------------
# the driver


def run_job(cmd: list[str], timeout: float, exit_bound: float) -> dict[str, Any]:
    """Run one job in a session of its own; its rounds, how it ended, and its end line."""
    proc = subprocess.Popen(cmd, env=launch_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    rows: list[dict[str, Any]] = []
    end: list[dict[str, Any]] = []
    end_at: list[float] = []
    err: list[str] = []

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("B7ROUND "):
                rows.append(json.loads(line[8:]))
            elif line.startswith("B7END "):
                end.append(json.loads(line[6:]))
                end_at.append(time.monotonic())

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for t in readers:
        t.start()
    start = time.monotonic()
    killed = ""
    while proc.poll() is None:
        now = time.monotonic()
        if now - start > timeout:
            killed = f"still running after {timeout:g} s"
        elif end_at and now - end_at[0] > exit_bound:
            killed = f"did not exit within {exit_bound:g} s of its last round"
        if killed:
            break
        try:
            proc.wait(0.1)
        except subprocess.TimeoutExpired:
            pass
    kill_session(proc.pid)  # the hung job, or stragglers that outlived the leader
    proc.wait()
    for t in readers:
        t.join(5.0)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    return {"rows": rows, "end": end[0] if end else None, "returncode": None if killed else proc.returncode,
            "killed": killed, "stderr": "".join(err)[-600:], "seconds": time.monotonic() - start}


def job_cmds(mode: str, kills: int, pool_n: int, raw_n: int, cap: float) -> list[tuple[list[str], int]]:
    """The commands of a mode, each with the number of rounds it should do."""
    me = os.path.abspath(__file__)
    if mode == "raw":
        mpiexec = [os.path.join(BIN, "mpiexec"), "--with-ft", "ulfm", "--oversubscribe", "--bind-to", "none"]
        per = raw_n - 1
        return [(mpiexec + ["-n", str(raw_n), sys.executable, me, "--raw"], per)
                for _ in range(math.ceil(kills / per))]
    how = "sigkill" if mode in ("pool", "spawned") else "exit1"
    tail = ["--cap", str(cap)]
    if mode.startswith("pool"):
        per = pool_n - 1
        out = []
        left = kills
        while left > 0:
            n = min(per, left)
            out.append(([os.path.join(BIN, "mpimesh"), "run", "-n", str(n + 1), "--oversubscribe", me,
                         "--child", how, "--rounds", str(n), *tail], n))
            left -= n
        return out
    return [([sys.executable, "-m", "mpimesh", me, "--child", how, "--rounds", str(kills), *tail], kills)]


def summarize(mode: str, jobs: list[dict[str, Any]], planned: int) -> dict[str, Any]:
    rows = [row for job in jobs for row in job["rows"]]
    ms = [row["detect_ms"] for row in rows if "detect_ms" in row]
    # A round not reached is a hang if its job was killed for overrunning, and lost if the job ended early.
    missing = [(job, max(0, job["planned"] - len(job["rows"]))) for job in jobs]
    hangs = sum(row.get("outcome") == "hang" for row in rows) + sum(n for job, n in missing if job["killed"])
    entry: dict[str, Any] = {
        "rounds": len(rows),
        "planned": planned,
        "detected": len(ms),
        "hangs": hangs,
        "lost": sum(n for job, n in missing if not job["killed"]),
        "errors": sum(row.get("outcome") not in ("hang", "supervision") and "detect_ms" not in row for row in rows),
        "jobs": len(jobs),
        "exit_hangs": sum(bool(job["end"]) and bool(job["killed"]) for job in jobs),
    }
    if ms:
        entry.update(median_ms=r(median(ms), 2), p99_ms=r(percentile(ms, 99), 2), max_ms=r(max(ms), 2),
                     min_ms=r(min(ms), 2))
    if mode in BOUND_MS:
        entry["bound_ms"] = BOUND_MS[mode]
        entry["within_bound"] = sum(m <= BOUND_MS[mode] for m in ms)
    recover = [row["recover_ms"] for row in rows if "recover_ms" in row]
    if recover:
        entry["recover_median_ms"] = r(median(recover), 1)
        entry["recover_max_ms"] = r(max(recover), 1)
    problems = [f"{job['killed'] or 'status ' + str(job['returncode'])}: {job['stderr'][-300:]}"
                for job in jobs if job["killed"] or job["returncode"] not in (0,)]
    odd = sorted({str(row.get("outcome")) for row in rows} - {"supervision"})
    if mode == "raw":
        odd = sorted({str(row.get("outcome")) for row in rows if "detect_ms" not in row})
    if problems:
        entry["job_problems"] = problems[:3]
    if odd:
        entry["other_outcomes"] = odd[:5]
    return entry


def driver(args: argparse.Namespace) -> None:
    modes = args.modes.split(",")
    out: dict[str, dict[str, Any]] = {}
    library = None
    for mode in modes:
        jobs = []
        planned = 0
        for cmd, rounds in job_cmds(mode, args.kills, args.pool_n, args.raw_n, args.cap):
            planned += rounds
            job = run_job(cmd, args.timeout, args.exit_bound)
            job["planned"] = rounds
            jobs.append(job)
            library = library or (job["end"] or {}).get("mpi_library")
        out[mode] = summarize(mode, jobs, planned)
    hangs = sum(entry["hangs"] for m, entry in out.items() if m != "raw")
    record: dict[str, Any] = {
        "bench": "B7",
        "what": "ms from a worker's death (SIGKILL by the controller, or os._exit(1)) to SupervisionError "
                "at the pending caller; each round then continues on freshly spawned processes",
        "kills": args.kills,
        "hangs": hangs,
        "exit_hangs": sum(entry["exit_hangs"] for m, entry in out.items() if m != "raw"),
        "lost": sum(entry["lost"] for m, entry in out.items() if m != "raw"),
    }
    for mode in ("pool", "spawned", "exit1", "pool-exit1"):
        if mode in out and "median_ms" in out[mode]:
            key = mode.replace("-", "_")
            record[f"{key}_median_ms"] = out[mode]["median_ms"]
            record[f"{key}_p99_ms"] = out[mode]["p99_ms"]
            record[f"{key}_max_ms"] = out[mode]["max_ms"]
    if "raw" in out:
        record["baseline"] = ("raw mpi4py under mpiexec --with-ft ulfm: irecv pending from a rank that rank 0 "
                              "SIGKILLs; ms to MPI.Exception (ULFM's own detection), same run")
        record["baseline_median_ms"] = out["raw"].get("median_ms")
        record["baseline_max_ms"] = out["raw"].get("max_ms")
    record["modes"] = out
    record["mpi_library"] = library
    record["loadavg_1m"] = round(os.getloadavg()[0], 2)
    emit(record)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kills", type=int, default=50, help="kill-and-recover rounds per mode")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated: pool,spawned,exit1,raw,pool-exit1")
    ap.add_argument("--pool-n", type=int, default=26, help="ranks per pool job (K-1 rounds each)")
    ap.add_argument("--raw-n", type=int, default=11, help="ranks per raw baseline job")
    ap.add_argument("--cap", type=float, default=10.0, help="seconds a round may wait before it counts as a hang")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per job")
    ap.add_argument("--exit-bound", type=float, default=20.0,
                    help="seconds a job may take to exit after its last round")
    ap.add_argument("--child", choices=["sigkill", "exit1"], help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.raw:
        raw()
    elif args.child:
        child(args.child, args.rounds, args.cap)
    else:
        driver(args)


if __name__ == "__main__":
    main()
