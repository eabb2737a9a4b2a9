"""The end of a job, on the controller: every way in, and the one bounded way through.

A job ends in one of four ways: the script returns or raises (``leave``, from
``__main__`` or from ``atexit`` for an embedded controller), a failure
reaches the top and the unhandled fault hook raises (``unhandled``), a
process dies in a job that cannot outlive it (``fatal``), or a Jupyter kernel
shuts down (``shutdown``).  Each goes through :meth:`EndOfJob.shutdown`, once,
whose steps read top to bottom, each with its bound, as execnet's
``_terminate_execution`` does: this process's actors, then every worker
(SHUTDOWN, wait for BYE), then the islands' links, then the controller's own
threads, then the job's status.  What cannot stop in time is killed or the
job aborted: no step waits forever.
"""

from __future__ import annotations

import enum
import faulthandler
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from .._core.logs import debug, warn
from .._core.runtime import Runtime
from .._transport.mpi import MPI, library
from ..config import settings
from ..supervision import MeshFailure, Unhandled, current_hook, default_unhandled_fault_hook
from .interactive import interactive_session, report_and_go_on
from .islands import Islands
from .job_status import set_job_exit_status
from .pool import Pool
from .procs import Procs
from .sigint import Interruption
from .worker import FINALIZE_BOUND

__all__ = ["EndOfJob", "Stage"]


class Stage(enum.IntEnum):
    """How far the end of the job has gone; it only moves forward (``EndOfJob._enter``)."""

    #: the job serves
    RUNNING = 0
    #: this process's own actors run ``__cleanup__`` (MPIMESH_CLEANUP_TIMEOUT)
    STOPPING_ACTORS = 1
    #: every worker was sent SHUTDOWN; their BYEs are awaited (MPIMESH_SHUTDOWN_TIMEOUT, once for the whole job)
    STOPPING_WORKERS = 2
    #: whole islands disconnected, what still runs of the others killed, the last frames sent (1 s)
    CLOSING = 3
    #: the controller's own threads stopped (1 s each), the job's status handed to the launcher
    STOPPED = 4


class EndOfJob:
    """The end of the job: who asked for it, how far it has gone, and its steps.

    Args:
        runtime: the controller's runtime.
        procs: the controller's table of workers.
        pool: the launch pool.
        islands: the spawned islands.
        stop_serving: stops the controller's own threads (the progress
            thread, the service thread, the liveness watch) and makes its
            background loop return with the status given (bounded).
    """

    def __init__(self, runtime: Runtime, procs: Procs, pool: Pool, islands: Islands,
                 stop_serving: Callable[[int], None]) -> None:
        self.rt = runtime
        self.procs = procs
        self.pool = pool
        self.islands = islands
        self._stop_serving = stop_serving
        self._lock = threading.Lock()
        self.stage = Stage.RUNNING
        #: an unhandled failure is ending the job (see :meth:`_after_unhandled`): it exits 1
        self.failed_unhandled = False
        # set once the script's thread has begun to leave (see _after_unhandled)
        self._leaving = threading.Event()
        # leave() runs from atexit (an embedded controller): atexit is already running
        self._at_exit = False
        # runs the unhandled fault hook, and the end of a job that cannot outlive a death
        self._supervisor = ThreadPoolExecutor(1, thread_name_prefix="mpimesh-supervisor")

    @property
    def running(self) -> bool:
        """Whether the job still serves (its end has not begun)."""
        return self.stage is Stage.RUNNING

    def _enter(self, stage: Stage) -> bool:
        # The one transition: forward only; False when the end is already there or past it.
        with self._lock:
            if self.stage >= stage:
                return False
            self.stage = stage
        debug(f"end of the job: {stage.name}", self.rt.addr)
        return True

    # --- the steps --------------------------------------------------------------------------------

    def shutdown(self, code: int) -> bool:
        """Stop every process of the job, once; returns False if some did not answer.

        A second call (another way in, while or after the first runs)
        returns True at once.  Blocks at most about
        ``MPIMESH_CLEANUP_TIMEOUT`` plus ``MPIMESH_SHUTDOWN_TIMEOUT`` plus a
        few seconds.
        """
        if not self._enter(Stage.STOPPING_ACTORS):
            return True
        rt, procs = self.rt, self.procs
        cells = rt.actors.stop_all("controller exit", lambda: None, owned=False)
        rt.actors.wait_stopped(cells, settings.cleanup_timeout)
        rt.owners.end()  # the ownership tree's root closes with the job (docs/design/ownership.md)

        # Every island and the pool stop at once: one bound for the whole job,
        # not one per island (a spawned run can have dozens).
        self._enter(Stage.STOPPING_WORKERS)
        islands = {island: self.islands.stop(island, code) for island in list(self.islands.members)}
        pool = self.pool.live_ranks()
        procs.send_shutdown(pool, code)
        procs.wait_left(pool + [a for members in islands.values() for a in members], settings.shutdown_timeout)

        self._enter(Stage.CLOSING)
        clean = True
        for island, members in islands.items():
            left = procs.all_left(members)
            clean &= left
            self.islands.drop(island, members, left)
        if not procs.all_left(pool):
            stuck = [a[1] for a in pool if not procs[a].gone]
            warn(f"ranks {stuck} did not stop within {settings.shutdown_timeout:g} s; aborting the job")
            clean = False
        rt.drain_sends(1.0)

        self._enter(Stage.STOPPED)
        self._stop_serving(code)
        # Every worker has stopped: only now may the launcher hear the status
        # (an unhandled failure leaves with os._exit(1) right after this).
        set_job_exit_status(self.status(code, clean))
        return clean

    def status(self, code: int, clean: bool) -> int:
        """The job's status: the script's ``code``, or 1 if it was 0 and some process may still run.

        A process may still run when it did not stop (``clean`` is False) or
        was declared dead on another host without proof.
        """
        return code if clean and not self.procs.unconfirmed else code or 1

    def leave(self, code: int) -> int:
        """End this process after :meth:`shutdown`, in bounded time.

        Finalizes MPI unless a process of the job has died (MPI_Finalize can
        then spin forever), aborting the job if some process may still hang.

        Returns:
            The status this process should exit with: ``code``, or 0 when
            the launcher already holds ``code`` as the job's status
            (``_job_status``).
        """
        self._leaving.set()
        clean = self.shutdown(code)
        # Hooks of failures that arrived while the job ended run first (in
        # order, on the supervisor's one thread): they may set the status.
        try:
            self._supervisor.submit(lambda: None).result(settings.shutdown_timeout)
        except Exception:
            pass  # a hook that does not return: the job ends regardless
        if self.failed_unhandled:
            # the KeyboardInterrupt of _after_unhandled, what the script made
            # of it, or a failure that reached the default hook as the job ended
            code = code or 1
        sys.stdout.flush()
        sys.stderr.flush()
        status = self.status(code, clean)
        own = 0 if set_job_exit_status(status) else code
        if not clean or self.procs.unconfirmed:
            MPI.COMM_WORLD.Abort(status)
        if self.rt.dead and library().startswith("Open MPI"):
            # MPI_Finalize could spin forever: leave now, after what a
            # normal exit runs (unless atexit is what is running this).
            if not self._at_exit:
                _run_atexit()
            os._exit(own)
        _bound_exit()
        return own

    def at_exit(self) -> None:
        """Atexit hook of an embedded controller (``python script.py``).

        After an unhandled failure the script ends as Python ends on an
        uncaught KeyboardInterrupt (status 130), once the other atexit
        handlers have run.
        """
        self._at_exit = True
        self.leave(0)

    # --- the ways in that are not the script's ---------------------------------------------------

    def fatal(self, report: str) -> None:
        """A process died in a job that cannot survive it: end the job now, with the report (not blocking)."""

        def end() -> None:
            warn(
                f"{report}\nmpimesh: this MPI job cannot outlive a dead process (MPICH, or Open MPI "
                "without fault tolerance), so it ends now; launch with `mpimesh run -n N script.py` (Open MPI: "
                "adds --with-ft ulfm) to keep the survivors"
            )
            try:
                self.shutdown(1)
            finally:
                sys.stdout.flush()
                MPI.COMM_WORLD.Abort(1)

        try:
            self._supervisor.submit(end)
        except RuntimeError:
            end()

    def unhandled(self, failure: MeshFailure) -> None:
        """A failure reached the top: run ``mpimesh.unhandled_fault_hook`` off the progress path (not blocking)."""
        try:
            self._supervisor.submit(self._run_hook, failure)
        except RuntimeError:
            # The interpreter (or this controller) is shutting down: the job
            # is ending anyway, so report instead of running the hook.
            warn(f"failure during shutdown:\n{failure.report()}")

    def _run_hook(self, failure: MeshFailure) -> None:
        # Returning means handled; raising means unhandled (Monarch's
        # contract), and the job ends.  The default hook reports the failure
        # and raises Unhandled; any other exception is added to the cause,
        # which the default hook then reports.
        hook = current_hook()
        if hook is default_unhandled_fault_hook and interactive_session():
            # A notebook or a prompt is not ended by one failed mesh (README, "Notebooks").
            report_and_go_on(failure.report())
            return
        try:
            hook(failure)
            return
        except Unhandled:
            pass
        except BaseException as exc:
            failure.cause += f"\n  unhandled_fault_hook raised {type(exc).__name__}: {exc}"
            try:
                default_unhandled_fault_hook(failure)
            except Unhandled:
                pass
        self._after_unhandled()

    def _after_unhandled(self) -> None:
        # An unhandled failure ends the job as Monarch's default hook does:
        # a KeyboardInterrupt in the main thread, so that the script's
        # `finally` blocks and atexit handlers run, and the job exits 1
        # (leave).  One SIGINT can be lost (a CPython race: it lands as a
        # blocking wait drops the GIL, and wakes nothing), so while the main
        # thread's top frame stays where the first found it, at the same
        # instruction, SIGINT is sent again every 50 ms; never once it has
        # moved (_roles/sigint.py).  A script that has not begun to leave
        # within MPIMESH_SHUTDOWN_TIMEOUT of the first SIGINT (it caught the
        # interrupt, it is stuck in C code, its own handler swallows SIGINT)
        # is ended from here, at once.
        self.failed_unhandled = True
        if self._leaving.is_set():
            return  # the script has ended: leave() is stopping the job, and exits 1
        main = threading.main_thread()
        if (main.is_alive() and main is not threading.current_thread() and main.ident is not None
                and callable(signal.getsignal(signal.SIGINT))):
            interruption = Interruption(main, self._leaving)
            # A daemon thread waits: the interpreter's exit joins the supervisor's.
            threading.Thread(target=self._end_unless_leaving, args=(interruption,), name="mpimesh-end-job",
                             daemon=True).start()
            return
        self._end_now()

    def _end_unless_leaving(self, interruption: Interruption) -> None:
        if not interruption.wait_left(settings.shutdown_timeout):
            self._end_now()

    def _end_now(self) -> None:
        # Stop every worker (bounded), then leave at once with status 1: the
        # script's threads may be blocked anywhere.
        try:
            self.shutdown(1)
        except BaseException:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    def __repr__(self) -> str:
        return f"EndOfJob({self.stage.name})"


def _bound_exit() -> None:
    """Bound what is left of this process's life: the script's atexit handlers, the teardown, ``MPI_Finalize``.

    The workers wait for this process in ``MPI_Finalize`` for
    ``FINALIZE_BOUND`` seconds, then leave without it; Open MPI's
    ``MPI_Finalize`` here then spins for ever (measured: an atexit handler
    of 33 s hung the job until it was killed).  A warning says so at the
    bound, and faulthandler's watchdog (a C thread: ``MPI_Finalize`` holds
    the GIL) ends this process at 1.5 times it, with status 1.
    """
    faulthandler.dump_traceback_later(1.5 * FINALIZE_BOUND, exit=True)
    text = (f"the controller's exit (the script's atexit handlers, the interpreter's teardown) has taken "
            f"{FINALIZE_BOUND:g} s: the workers stop waiting for it in MPI_Finalize now, and MPI_Finalize here "
            f"would not return; this process ends {0.5 * FINALIZE_BOUND:g} s from now with status 1")
    timer = threading.Timer(FINALIZE_BOUND, warn, args=(text,))
    timer.daemon = True
    timer.start()


def _run_atexit() -> None:
    # The script's atexit handlers, once: after this the process ends with os._exit.
    import atexit

    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()
