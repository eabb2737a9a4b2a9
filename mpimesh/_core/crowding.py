"""Whether a spinning waiter gives its CPU up now and then: only on a host its job crowds.

After traffic, a waiting thread spins in MPI for ``MPIMESH_SPIN_US``
(``_core.progress``).  Where the job's processes on this host outnumber the
CPUs they may run on, the spinner must yield (``sched_yield``) every so many
empty probes, or the process it waits for gets no CPU until the scheduler
preempts the spinner, milliseconds later.  Where each process has a CPU, a
yield hands the CPU to whatever else is runnable there, another job's
process among them, and the spinner gets it back only a time slice later:
on a loaded machine that took B1 from ~5 µs to 17-60 µs a round trip, while
MPI's own blocking receive between the same processes, which never yields
there, kept its ~2.3 µs (docs/design/data.md, "Yields only where the job
crowds its host").  Open MPI decides the same way for its own blocking calls
(``mpi_yield_when_idle``, turned on where a node is oversubscribed).

``MPIMESH_SPIN_YIELD``: ``auto`` (the default) yields while the job's
processes on this host, counted by their doorbells in the job's directory
(``_transport.bell``), outnumber this process's CPUs
(``os.sched_getaffinity``); ``always`` and ``never`` fix the choice.  The
count is taken again every second, as spawned processes come and go.
"""

from __future__ import annotations

import os
import time
from typing import Any

from ..config import settings

__all__ = ["Crowding", "RECOUNT", "crowded"]

#: Seconds between two counts of the job's processes on this host.
RECOUNT = 1.0


def crowded(job_dir: str, cpus: int) -> bool:
    """Whether the job's processes on this host (its doorbells in ``job_dir``) outnumber ``cpus``.

    A directory that cannot be read counts as crowded: yielding is the safe side.
    """
    try:
        here = sum(1 for name in os.listdir(job_dir) if name.startswith("bell-"))
    except OSError:
        return True
    return here > cpus


class Crowding:
    """Sets whether this process's spinning waiters yield (``Progress.yields`` and the native spins).

    Args:
        progress: this process's ``Progress``.
        job_dir: the job's directory on this host (``_transport.bell.job_dir``).
        mode: ``auto``, ``always`` or ``never`` (default: ``MPIMESH_SPIN_YIELD``).
    """

    def __init__(self, progress: Any, job_dir: str, mode: str | None = None) -> None:
        self._progress = progress
        self._job_dir = job_dir
        self.mode = settings.spin_yield if mode is None else mode
        self._cpus = len(os.sched_getaffinity(0))
        self._next = 0.0
        try:
            from .. import _native
        except ImportError:  # built without the native part: the Python spin only
            self._native_set = None
        else:
            self._native_set = getattr(_native, "spin_yield", None)

    def check(self) -> bool:
        """Count again now and set the yields; returns whether spinners yield."""
        if self.mode == "auto":
            yields = crowded(self._job_dir, self._cpus)
        else:
            yields = self.mode == "always"
        self._progress.yields = yields
        if self._native_set is not None:
            self._native_set(yields)
        return yields

    def tick(self) -> None:
        """Run on the polling thread about once per millisecond: counts again once a second."""
        now = time.monotonic()
        if now >= self._next:
            self._next = now + RECOUNT
            self.check()
