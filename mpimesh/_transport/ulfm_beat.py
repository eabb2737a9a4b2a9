"""ULFM's heartbeats after the boot: MPI progress from a C thread, which needs no GIL.

With its heartbeat detector on (:func:`.boot_beat.detector_on`: what mpimesh
turns on under ``srun --mpi=pmix``), Open MPI sends a process's heartbeats
from inside its MPI calls only.  After the boot the runtime's pollers make
those calls, from Python threads: a script that holds the GIL longer than the
detector's timeout (2 s: a C call through ``ctypes.PyDLL``, a ``list.sort()``
of 12M ints) stops them all, and the other ranks declare the controller
dead (``MPI_ERR_PROC_FAILED``, exit 1).  :func:`start` hands the boot beat's
job (``_launch/boot_beat.py``, a Python thread that serves until the boot's
first communicator) to a thread of ``mpimesh._native`` (native/ulfm_beat.c)
for the rest of the process's life.  :func:`held` keeps it from MPI while
:func:`.mpi.alone` makes a communicator.  It ends at the interpreter's
exit right before mpi4py's ``MPI_Finalize`` (a ``Py_AtExit`` function): an
``atexit`` stop came before the interpreter's teardown, seconds without an MPI
call where it frees much, and the other ranks, in ``MPI_Finalize`` already,
declared the controller dead.

Every wait for the thread is bounded: an ``MPI_Iprobe`` that never returns
(MPI's progress stuck) must not hang its caller.  :func:`held` raises
``TimeoutError``; so does :func:`stop`, and the thread may then still be in
MPI, so its caller must not call ``MPI_Finalize`` (``_roles.worker.finish``
leaves without it); the stop at the interpreter's exit leaves with status 1
and a line on stderr, before mpi4py's ``MPI_Finalize``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from typing import Any

from .._launch import boot_beat

__all__ = ["HOLD_BOUND", "STOP_BOUND", "start", "stop", "held", "running"]

_native: Any = None  # mpimesh._native while the thread runs

#: Seconds :func:`held` waits at most for the thread's polls under way (8 ``MPI_Iprobe``, microseconds each).
HOLD_BOUND = 30.0

#: Seconds :func:`stop` (and the stop at the interpreter's exit) waits at most for the thread's polls under way.
STOP_BOUND = 30.0


def start(libpath: str | None, self_handle: int, environ: Mapping[str, str] = os.environ) -> bool:
    """Start the thread where :func:`.boot_beat.wanted`; returns whether it runs.

    Args:
        libpath: the loaded libmpi (:func:`.mpi.loaded_libmpi`); ``None``: not found, no thread.
        self_handle: ``MPI.COMM_SELF.handle``, the communicator it probes.
        environ: where the detector's MCA variables and ``MPIMESH_BOOT_BEAT`` are read.
    """
    global _native
    if _native is not None or libpath is None or not boot_beat.wanted(environ):
        return _native is not None
    try:
        from .. import _native as native
    except ImportError:  # no native part: the Python pollers alone feed the detector
        return False
    if not hasattr(native, "ulfm_beat_start"):
        return False
    native.ulfm_beat_start(libpath, self_handle, boot_beat.PERIOD, boot_beat.CALLS, STOP_BOUND)
    _native = native
    return True


def stop(bound: float | None = None) -> int:
    """End the thread now and wait for its last MPI call; returns the wakes on which it polled (0: none ran).

    Args:
        bound: seconds to wait at most for the thread's polls under way (default :data:`STOP_BOUND`).

    Raises:
        TimeoutError: the thread's ``MPI_Iprobe`` did not return within ``bound`` seconds: MPI's progress
            is stuck, and the thread, still running, may call MPI any time (no ``MPI_Finalize`` then).
    """
    global _native
    native, _native = _native, None
    if native is None:
        return 0
    try:
        return int(native.ulfm_beat_stop(STOP_BOUND if bound is None else bound))
    except TimeoutError:
        _native = native  # it still runs: a later stop may end it
        raise


def running() -> bool:
    """Whether the thread runs."""
    return _native is not None


@contextlib.contextmanager
def held(bound: float = HOLD_BOUND) -> Iterator[None]:
    """No MPI call from the thread meanwhile (its polls under way end first, the GIL released).

    Raises:
        TimeoutError: the thread's polls did not end within ``bound`` seconds: an ``MPI_Iprobe`` that does
            not return, MPI's progress stuck (nothing is held, and the body does not run).
    """
    native = _native
    if native is None:
        yield
        return
    native.ulfm_beat_hold(bound)
    try:
        yield
    finally:
        native.ulfm_beat_release()
