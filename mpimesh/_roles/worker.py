"""The worker side: boot, serve until SHUTDOWN, leave cleanly.

A worker never lets an exception reach mpi4py (which would call
``MPI_Abort`` and take the job down): everything ends in a BYE to the
controller and an orderly ``MPI_Finalize``.  A worker whose controller has
died exits on its own: no rank outlives the controller.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
import traceback

from .._core import runtime as _runtime
from .._core.logs import drain_all, install_forwarders
from .._core.protocol import Kind
from .._transport.bell import bell_path
from .._transport.mpi import MPI, library
from .._transport.router import CONTROLLER
from ..config import settings
from .job_status import set_job_exit_status
from .liveness import job_dir, last_words_path, stop_last_words

__all__ = ["main_pool", "main_spawned", "serve"]

# How often an idle worker checks that its controller still exists.
_WATCH_PERIOD = 0.25


def _controller_alive(rt: _runtime.Runtime) -> bool:
    if rt.controller_host != rt.host:
        # Another node: the controller pings every worker at least every
        # half heartbeat timeout; twice the timeout of silence means it is gone.
        return time.monotonic() - rt.router.heard_controller < 2 * settings.heartbeat_timeout
    try:
        os.kill(rt.controller_pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve(rt: _runtime.Runtime, *, spawned: bool = False) -> int:
    """Serve actors until the controller says SHUTDOWN; returns the exit status."""
    rt.forwarders = install_forwarders(rt)
    while not rt.stopping:
        rt.progress.wait(lambda: rt.stopping, rt.cond, _WATCH_PERIOD, background=True)
        if not rt.stopping and not _controller_alive(rt):
            print(f"mpimesh worker {rt.addr}: controller (pid {rt.controller_pid}) is gone; exiting",
                  file=sys.stderr, flush=True)
            if not spawned:
                # The controller died before it could give the job its status
                # (killed by a signal): under ULFM the launcher would exit 0.
                set_job_exit_status(1)
            os._exit(1)
    cells = rt.actors.stop_all("job shutdown", lambda: None)
    stuck = rt.actors.wait_stopped(cells, settings.cleanup_timeout)
    if not stuck:
        rt.actors.join_threads(1.0)
    stop_last_words(rt.controller_pid, rt.addr)
    rt.close_bell()
    # This job's files on this host: the controller removes its own host's
    # job directory whole; on another host nobody did, and each death there
    # left its last words and bell behind (issue #13).  The dead processes'
    # files go (those of another host do not exist here), then the directory
    # once empty: the last worker of this host to leave removes it.
    for addr in rt.dead:
        for path in (last_words_path(rt.controller_pid, addr), bell_path(rt.controller_pid, addr)):
            with contextlib.suppress(OSError):
                os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(job_dir(rt.controller_pid))
    drain_all(rt.forwarders)
    rt.router.send(CONTROLLER, (Kind.BYE, None, len(stuck)))
    deadline = time.monotonic() + 2.0
    while rt.router.pending_sends() and time.monotonic() < deadline:
        rt.progress.poll_once()
        time.sleep(1e-4)
    if spawned:
        _disconnect_parent(rt)
    return rt.exit_code


def _disconnect_parent(rt: _runtime.Runtime) -> None:
    # The controller disconnects only from an island that is whole
    # (_controller._close_island): once a sibling has died (issue #3: the
    # island now outlives it), MPI_Comm_disconnect fails ("Server not
    # available", MPI_ERR_COMM on Open MPI 5).  A disconnect the controller
    # does not join would wait: the watchdog bounds it.
    if any(addr[0] == rt.addr[0] for addr in rt.dead):
        return
    watchdog = threading.Timer(settings.shutdown_timeout, os._exit, args=(rt.exit_code,))
    watchdog.daemon = True
    watchdog.start()
    try:
        with rt.router.exclusive():
            MPI.Comm.Get_parent().Disconnect()
    finally:
        watchdog.cancel()


def _finish(code: int, rt: _runtime.Runtime | None = None) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    mpich = not library().startswith("Open MPI")
    # MPI_Finalize can spin forever once a process of the job has died
    # (seen with Open MPI's ULFM): skip it then, and bound it always.
    watchdog = threading.Timer(5.0, os._exit, args=(code,))
    watchdog.daemon = True
    watchdog.start()
    if rt is not None and rt.dead and not mpich:
        os._exit(code)
    try:
        MPI.Finalize()
    finally:
        if not mpich:
            os._exit(code)  # fast: nothing left to run
        # MPICH's Hydra kills the whole job when a rank ends with _exit()
        # after MPI_Finalize (its exit handlers must run): leave through the
        # interpreter's exit; the watchdog covers a shutdown that hangs on a
        # thread stuck in C code.
    return code


def _ignore_interrupts() -> None:
    # Ctrl-C at the terminal reaches every rank; the controller decides what
    # happens (it stops the workers), so a worker must not die of it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main_pool(world: MPI.Intracomm) -> int:
    """Entry of ranks 1..N-1 of the launch world."""
    _ignore_interrupts()
    rt = None
    try:
        rt = _runtime.boot_pool(world)
        code = serve(rt)
    except BaseException:
        traceback.print_exc()
        code = 1
    return _finish(code, rt)


def main_spawned(island: int) -> int:
    """Entry of a process created with ``MPI_Comm_spawn``."""
    _ignore_interrupts()
    rt = None
    try:
        rt = _runtime.boot_spawned(island)
        code = serve(rt, spawned=True)
    except BaseException:
        traceback.print_exc()
        code = 1
    return _finish(code, rt)
