"""Helpers shared by the benchmark scripts (no MPI at import time).

Every ``bench_*.py`` prints one JSON line last; :func:`emit` writes it.
Figures are medians over repeats (the machine is small, shared and noisy).
This module does not import mpi4py or mpimesh, so that the driver of B5 and
``run_all.sh`` can use it without initializing MPI.
"""

from __future__ import annotations

import faulthandler
import json
import os
import signal
import statistics
import subprocess
import sys
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "MPI_ENV",
    "SPAWNED_BASELINE",
    "TAG",
    "emit",
    "kill_session",
    "launch_env",
    "median",
    "percentile",
    "r",
    "ratio",
    "run_bounded",
    "summary_us",
    "watchdog",
    "world_size_from_env",
]

#: Tag of the raw mpi4py baselines on ``MPI.COMM_WORLD``.  mpimesh sends only
#: on private duplicates of COMM_WORLD (tags 0x6D6D/0x6D6E), so COMM_WORLD
#: itself carries nothing else.
TAG = 77

#: the ``baseline`` text of a spawned-worker run (see ``_actors.raw_standalone``)
SPAWNED_BASELINE = "separate job: a singleton and the processes it spawned, over the intercommunicator"

#: Environment every MPI launch of the benchmarks gets (see
#: ../shared/reference/mpi-facts.md: root, and no libfabric, which adds ~1 s
#: to every MPI_Init and spawn).
MPI_ENV = {
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "PRTE_ALLOW_RUN_AS_ROOT": "1",
    "PRTE_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    "OMPI_MCA_btl": "self,sm,tcp",
    "OMPI_MCA_mtl": "^ofi",
}


def launch_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """A clean environment for a child launch: ours, minus any MPI job state.

    Variables set by an enclosing mpiexec or singleton (``OMPI_COMM_WORLD_*``,
    ``PMIX_*``, ``PRTE_*`` other than the root permissions) would make the
    child believe it belongs to our job.
    """
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith(("OMPI_", "PMIX_", "PRTE_", "OPAL_")) and k not in MPI_ENV)
    }
    env.update(MPI_ENV)
    # A singleton's MPI_Comm_spawn starts `prte` from PATH: put the venv's
    # bin (where the PyPI Open MPI installs it) first, as mpimesh does.
    bindir = os.path.dirname(sys.executable)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    if extra:
        env.update(extra)
    return env


def run_bounded(cmd: Sequence[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own; on timeout kill the whole session.

    Killing only mpiexec could leave its ranks (or a singleton's ``prte``)
    behind, so every process of the new session gets SIGKILL.

    Raises:
        subprocess.TimeoutExpired: after the session was killed.
    """
    proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        proc.communicate()
        raise
    kill_session(proc.pid)  # stragglers that outlived the leader
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def kill_session(sid: int) -> None:
    """SIGKILL every process whose session id is ``sid`` (a leader we started)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of stat: session id
            try:
                os.kill(int(entry), signal.SIGKILL)
            except ProcessLookupError:
                pass


def world_size_from_env() -> int:
    """World size promised by Open MPI's mpiexec, or 1 for a plain ``python``."""
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", "1"))


def watchdog(seconds: float | None = None) -> None:
    """Dump all stacks and exit if the benchmark is still running after ``seconds``.

    Under mpiexec the controller's exit makes the job end: the workers see
    their controller gone.  Default: ``BENCH_WATCHDOG_S`` or 300 s.
    """
    if seconds is None:
        seconds = float(os.environ.get("BENCH_WATCHDOG_S", "300"))
    faulthandler.dump_traceback_later(seconds, exit=True)


def median(values: Iterable[float]) -> float:
    """Median of ``values``."""
    return float(statistics.median(list(values)))


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``."""
    data = sorted(values)
    if not data:
        raise ValueError("expecting at least one sample, got none")
    k = max(0, min(len(data) - 1, int(round(q / 100.0 * len(data) + 0.5)) - 1))
    return float(data[k])


def summary_us(samples_ns: Sequence[int]) -> dict[str, float]:
    """Median and p99 of nanosecond samples, in microseconds."""
    us = [s / 1000.0 for s in samples_ns]
    return {"median_us": round(median(us), 2), "p99_us": round(percentile(us, 99), 2)}


def r(value: float | None, digits: int = 2) -> float | None:
    """``round`` that passes ``None`` through."""
    return None if value is None else round(value, digits)


def ratio(ours: float | None, base: float | None) -> float | None:
    """``ours / base`` to two places (B1's 1.2x target needs the second), or ``None`` when either is missing."""
    if ours is None or not base:
        return None
    return round(ours / base, 2)


def emit(record: dict[str, Any]) -> None:
    """Print the benchmark's JSON line (last line of stdout)."""
    sys.stdout.flush()
    sys.stderr.flush()
    print(json.dumps(record, sort_keys=False), flush=True)


MIB64 = 64 * 1024 * 1024


def gbps(ms: float | None, nbytes: int = MIB64) -> float | None:
    """Bandwidth in GB/s of moving ``nbytes`` in ``ms`` milliseconds."""
    return None if not ms else round(nbytes / ms / 1e6, 2)


def standalone_bulk(kind: str, reps: int) -> dict[str, Any] | None:
    """The raw half of B4/B6 as a job of its own (`_bulk.py kind reps` under mpiexec -n 2).

    A second opinion beside the same-job baseline: errors are reported, not raised.
    """
    from mpi4py import MPI

    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    flags = ["--oversubscribe", "--bind-to", "none"] if MPI.Get_library_version().startswith("Open MPI") else []
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bulk.py")
    cmd = [mpiexec, *flags, "-n", "2", sys.executable, script, kind, str(reps)]
    try:
        proc = run_bounded(cmd, launch_env(), 120)
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"status {proc.returncode}: {proc.stderr[-500:]}"}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def worker_host() -> Any:
    """Where a benchmark's actors go: the job's last host (a ``HostMesh`` with no dimension).

    On one host that is this host, whose launch-pool ranks serve first (rank
    1 is the raw baselines' peer).  In ``bench_hosts.py``'s layouts
    (``--host mh1:1,mh2:K``: the controller alone on mh1) it is mh2, where
    every worker runs, so the actor is on the other host.
    """
    from mpimesh import host_mesh

    hosts = host_mesh()
    return hosts.slice(hosts=len(hosts) - 1)
