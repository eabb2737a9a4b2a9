"""ULFM's heartbeats through the boot: MPI progress from ``MPI_Init`` to the boot's first collective.

With its heartbeat detector on (``mpi_ft_detector``: what mpimesh turns on
under ``srun --mpi=pmix``, :data:`.survival.DIRECT_LAUNCH_ULFM`), Open MPI's
ULFM sends a process's heartbeats from its progress engine only, that is
from inside an MPI call (its own detector thread, ``mpi_ft_detector_thread``,
hung 2 jobs of 2 in ``MPI_Finalize`` here).  ``MPI_Init`` runs while
``mpimesh`` is imported, and the rest of the import (~0.3 s of CPU, 1-2 s on a
loaded node) runs before the boot's first MPI call.  Meanwhile the other
ranks wait in that call, their detectors hear nothing, and 2 s after the slow
rank's last heartbeat one of them declares it dead: every rank's boot fails
(``MPI_ERR_PROC_FAILED`` in the first ``Dup``, an agreement error, or garbage
in the boot's ``allgather``).  That was 3 jobs in ~30 under srun on a loaded
machine, and none under ``mpiexec``, which leaves the detector off
(docs/design/runtime.md, "Boot under srun").

:func:`start` keeps a thread making MPI calls every 50 ms from ``MPI_Init``
on, 8 at a time (Open MPI runs its timers once in 8 calls).  :func:`stop`
ends it before the boot makes its first communicator, since Open MPI
misbehaves when one thread makes a communicator while another polls
(``_transport.mpi.alone``).  From then on the runtime's own polls (every few
ms) feed the detector, and in the controller a C thread that needs no GIL
(``_transport/ulfm_beat.py``), started where this one is wanted: a script
may hold the GIL for seconds.  The module does not import MPI: the caller
passes the call to make.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Mapping

__all__ = ["PERIOD", "CALLS", "detector_on", "wanted", "start", "stop", "running"]

#: seconds between two wakes of the thread: ULFM's detector event is due every tenth of its period
#: (0.5 s under srun)
PERIOD = 0.05
#: MPI calls a wake makes: Open MPI runs its events (the detector's timer among them) once in 8 calls
#: of ``opal_progress`` (``opal/runtime/opal_progress.c``); one call a wake sent a heartbeat every
#: 0.8-2.1 s, and one job in 24 still died at boot
CALLS = 8

_TRUE = ("1", "true", "yes", "on", "enabled")
_stop = threading.Event()
_thread: threading.Thread | None = None


def detector_on(environ: Mapping[str, str]) -> bool:
    """Whether Open MPI's ULFM heartbeat detector runs in this process (its MCA variables in *environ*)."""
    return (environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in _TRUE
            and environ.get("OMPI_MCA_mpi_ft_detector", "").lower() in _TRUE)


def start(progress: Callable[[], object]) -> None:
    """Call ``progress()`` (an MPI call that drives progress) :data:`CALLS` times a :data:`PERIOD`, until :func:`stop`.

    Call it right after ``MPI_Init``; the thread is also stopped at exit,
    before mpi4py finalizes MPI.  A second call while it runs does nothing.
    """
    global _thread
    if _thread is not None:
        return

    def run() -> None:
        while not _stop.wait(PERIOD):
            try:
                for _ in range(CALLS):
                    progress()
            except Exception:  # MPI is failing: the boot's own calls will say how
                return

    _stop.clear()
    _thread = threading.Thread(target=run, name="mpimesh-boot-beat", daemon=True)
    _thread.start()
    atexit.register(stop)


def stop() -> None:
    """End the thread and wait for its last MPI call to return; does nothing when none runs."""
    global _thread
    thread, _thread = _thread, None
    if thread is None:
        return
    _stop.set()
    if thread is not threading.current_thread():
        thread.join()


def running() -> bool:
    """Whether the thread runs (a boot has not stopped it yet)."""
    return _thread is not None


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to :func:`start` the thread: the detector runs and ``MPIMESH_BOOT_BEAT`` is not ``0``.

    The controller's C thread after the boot (``_transport/ulfm_beat.py``) runs under the same condition.
    """
    return detector_on(environ) and environ.get("MPIMESH_BOOT_BEAT", "1").lower() not in ("0", "false", "no", "off")
