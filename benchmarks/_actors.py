"""The benchmark actor and the controller-side helpers that use it.

Imported by the controller scripts after ``python -m mpimesh`` has started
MPI; the workers import it by name (the controller sends its ``sys.path``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import _raw
from _common import launch_env, run_bounded
from mpi4py import MPI

from mpimesh import Actor, endpoint

__all__ = ["Bench", "describe_job", "raw_collective", "raw_fanout", "raw_pipelined", "raw_standalone"]

HERE = os.path.dirname(os.path.abspath(__file__))


class Bench(Actor):
    """No-op endpoints plus the worker halves of the raw baselines."""

    @endpoint
    def noop(self, x: int) -> int:
        return x

    @endpoint
    def info(self) -> dict[str, Any]:
        world = MPI.COMM_WORLD
        return {
            "pid": os.getpid(),
            "world_rank": world.Get_rank(),
            "world_size": world.Get_size(),
            "spawned": MPI.Comm.Get_parent() != MPI.COMM_NULL,
        }

    @endpoint
    def echo_world(self, rounds: int) -> int:
        # Blocks this actor's thread in MPI for the whole baseline: fine here.
        return _raw.echo(MPI.COMM_WORLD, rounds)

    @endpoint
    def block_world(self) -> int:
        return _raw.block(MPI.COMM_WORLD)

    @endpoint
    def take(self, t: Any) -> None:
        """A no-op that takes a (large) argument."""

    @endpoint
    def collective_world(self, ranks: list[int], rounds: int, nbytes: int) -> int:
        # The worker half of _raw.collective on a communicator of `ranks` of COMM_WORLD.
        comm = _raw.group_comm(MPI.COMM_WORLD, ranks)
        try:
            _raw.collective(comm, rounds, nbytes)
        finally:
            comm.Free()
        return rounds


def library_version() -> str:
    """First line of the MPI library's version string."""
    return MPI.Get_library_version().splitlines()[0].strip().strip("\x00").strip()


def describe_job(infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The JSON fields every benchmark reports about its launch."""
    spawned = {bool(i["spawned"]) for i in infos}
    return {
        "mpiexec_n": MPI.COMM_WORLD.Get_size() if MPI.COMM_WORLD.Get_size() > 1 else None,
        "mpi_library": library_version(),
        "workers": "spawned" if spawned == {True} else ("pool" if spawned == {False} else "mixed"),
        "spin_us": os.environ.get("MPIMESH_SPIN_US", "default"),
        "idle_sleep_us": os.environ.get("MPIMESH_IDLE_SLEEP_US", "default"),
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }


def raw_fanout(mesh: Any, world_ranks: Sequence[int], rounds: int, timeout: float = 120.0) -> tuple[list[int], float]:
    """Raw ping-pong from rank 0 to every rank of ``world_ranks`` at once, in this job.

    ``mesh`` is the actor mesh whose actors live on exactly those ranks; each
    echoes ``rounds`` times on ``COMM_WORLD`` inside an endpoint call.

    Returns:
        Per-round ns and the controller's CPU seconds (see ``_raw.fanout``).
    """
    fut = mesh.echo_world.call(rounds)
    out = _raw.fanout(MPI.COMM_WORLD, list(world_ranks), rounds)
    fut.get(timeout)
    return out


def raw_collective(mesh: Any, world_ranks: Sequence[int], rounds: int, nbytes: int = 0,
                   timeout: float = 240.0) -> tuple[list[int], float]:
    """MPI's own trees on the controller and ``world_ranks`` (``_raw.collective``), in this job.

    ``mesh``'s actors live on exactly ``world_ranks``; each runs the worker
    half inside an endpoint call.

    Returns:
        Per-round ns and the controller's CPU seconds.
    """
    ranks = [0, *world_ranks]
    fut = mesh.collective_world.call(ranks, rounds, nbytes)
    comm = _raw.group_comm(MPI.COMM_WORLD, ranks)
    try:
        out = _raw.collective(comm, rounds, nbytes)
    finally:
        comm.Free()
    fut.get(timeout)
    return out


def raw_pipelined(one: Any, world_rank: int, n: int, timeout: float = 120.0) -> float:
    """B3's raw baseline in this job: seconds for ``n`` pipelined pickled sends and acks."""
    fut = one.echo_world.call_one(n + 1)
    secs = _raw.pipelined(MPI.COMM_WORLD, world_rank, n)
    fut.get(timeout)
    return secs


def raw_standalone(kind: str, nprocs: int, rounds: int, timeout: float = 120.0, *,
                   spawned: bool = False) -> dict[str, Any]:
    """Run ``_raw.py`` as a job of its own, for scripts whose workers were spawned.

    ``spawned``: a singleton that spawns ``nprocs - 1`` echo processes and
    talks to them over the intercommunicator (the link mpimesh's spawned
    workers have); else an ``mpiexec -n nprocs`` job over ``COMM_WORLD``.
    The child gets a scrubbed environment (``launch_env``), so it starts a job
    of its own even when called from inside an MPI singleton.
    """
    script = os.path.join(HERE, "_raw.py")
    if spawned:
        cmd = [sys.executable, script, kind, str(rounds), "--spawn", str(nprocs - 1)]
    else:
        mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
        cmd = [mpiexec, "--oversubscribe", "--bind-to", "none", "-n", str(nprocs),
               sys.executable, script, kind, str(rounds)]
    proc = run_bounded(cmd, launch_env(), timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"raw baseline {cmd} failed with status {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def time_calls(fn: Any, n: int) -> list[int]:
    """Call ``fn()`` ``n`` times; per-call wall ns."""
    clock = time.perf_counter_ns
    out = []
    for _ in range(n):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out
