"""The job's exit status under ``mpiexec --with-ft ulfm`` (issue #3).

Under ULFM, Open MPI's PRRTE runs the job as *recoverable*: a rank that dies
no longer ends the job.  A rank that *exits* with a non-zero status still
does, unless ``PRTE_MCA_state_base_error_non_zero_exit=0``: PRRTE 3.0.14
counts such an exit twice towards the job's end and, at the third one in a
7-rank job, ends the whole job with status 1 and no report.  With the
setting (``mpimesh run`` adds it, see ``_launcher``) those exits are
survivable, but PRRTE no longer takes any rank's status for the job's:
``prterun`` exits 0 after a failed script.  ``MPI_Abort`` does not help: in a
recoverable job it only notifies the other ranks, and ``prterun`` still
exits 0.

What does carry a status is ``PMIx_Abort`` naming the caller's whole
namespace (``PMIX_RANK_WILDCARD``): PRRTE 3.0.12 and later (Open MPI 5.0.9
and later) records it as the job's exit status and, in a recoverable job,
kills nobody.  So, when ``mpimesh run`` says so (``MPIMESH_PMIX_EXIT_STATUS=1``):

* the controller hands its non-zero status over once every worker has
  stopped, and then exits 0 itself: after the call PRRTE treats a non-zero
  exit of rank 0 as the job's end, kills the workers still in
  ``MPI_Finalize`` and prints "prterun has exited due to process rank 0 ...
  calling abort";
* a launch-pool worker that finds the controller gone (killed by a signal)
  hands over 1, so that such a job never ends with 0.

What was checked, and on which Open MPI, is in docs/design/runtime.md
("Job status: what was measured").  Caveat: PRRTE records the status only on
the node that runs ``prterun`` (where rank 0 runs unless a hostfile or
``--host`` puts it elsewhere).

A launcher's own status can lie the other way too (issue #27): ``srun``'s is
the highest of every task's, so a worker that died and was handled fails the
job, and a node lost under ``srun --no-kill`` or ``prterun`` gives 0.  So the
controller also writes the job's status to ``MPIMESH_STATUS_FILE`` when that
is set (the ``jobs/slurm`` templates set it and exit with it; a job whose
controller never wrote it, killed or lost with its node, failed).
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable
from typing import Any, cast

from .._transport.mpi import MPI, fault_tolerant, library
from ..config import settings

__all__ = ["set_job_exit_status", "write_status_file"]

# pmix_common.h: PMIX_MAX_NSLEN, PMIX_RANK_WILDCARD
_NSLEN = 255
_RANK_WILDCARD = 0xFFFFFFFE

_PmixAbort = Callable[[int, bytes, Any, int], int]


class _PmixProc(ctypes.Structure):
    _fields_ = [("nspace", ctypes.c_char * (_NSLEN + 1)), ("rank", ctypes.c_uint32)]


_recorded: int | None = None


def _wanted() -> bool:
    return (
        settings.pmix_exit_status
        and "PMIX_NAMESPACE" in os.environ
        and fault_tolerant()
        and library().startswith("Open MPI")
    )


def _pmix_abort() -> _PmixAbort | None:
    """``PMIx_Abort`` of the PMIx library that MPI has loaded, or ``None``."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[5].strip() for line in maps if "/libpmix.so" in line}
    except (OSError, IndexError):
        return None
    for path in sorted(paths):
        try:
            # RTLD_NOLOAD: only the copy already in this process, never a second one.
            lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        func = getattr(lib, "PMIx_Abort", None)
        if func is not None:
            func.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(_PmixProc), ctypes.c_size_t]
            func.restype = ctypes.c_int
            return cast(_PmixAbort, func)
    return None


def set_job_exit_status(code: int, *, timeout: float = 2.0) -> bool:
    """Make ``code`` the exit status of the whole MPI job; the first call that succeeds wins.

    Does nothing for a zero ``code``, or unless this process was launched by
    ``mpiexec --with-ft ulfm`` with ``MPIMESH_PMIX_EXIT_STATUS=1``.  Blocks
    at most ``timeout`` seconds (a call to the local PRRTE daemon).

    Returns:
        Whether the launcher acknowledged the status (now or before).
    """
    global _recorded
    code &= 0xFF
    if _controller():
        write_status_file(code)
    if _recorded is not None:
        return True
    if code == 0 or not _wanted():
        return False
    func = _pmix_abort()
    if func is None:
        return False
    proc = _PmixProc(os.environ["PMIX_NAMESPACE"].encode()[:_NSLEN], _RANK_WILDCARD)
    result: list[int] = []

    def call() -> None:
        result.append(func(code, b"mpimesh: the job's exit status", ctypes.byref(proc), 1))

    thread = threading.Thread(target=call, name="mpimesh-exit-status", daemon=True)
    thread.start()
    thread.join(timeout)
    if result != [0]:
        return False
    _recorded = code
    return True


def _controller() -> bool:
    # Rank 0 of the launch world (or the singleton); a spawned island's rank 0 has a parent.
    return MPI.COMM_WORLD.Get_rank() == 0 and MPI.Comm.Get_parent() == MPI.COMM_NULL


def write_status_file(code: int) -> None:
    """Write ``code`` to ``MPIMESH_STATUS_FILE`` when it is set; a later call overwrites it (the last status wins).

    The controller calls it (through :func:`set_job_exit_status`) once every
    worker has stopped, and again with the final status as it leaves.
    """
    path = os.environ.get("MPIMESH_STATUS_FILE")
    if not path:
        return
    try:
        with open(path, "w", encoding="ascii") as file:
            file.write(f"{code & 0xFF}\n")
    except OSError as exc:
        print(f"mpimesh: warning: cannot write the job's status to MPIMESH_STATUS_FILE={path}: {exc}",
              file=sys.stderr, flush=True)
