"""The worker role: serve until SHUTDOWN, leave cleanly.

A worker never lets an exception reach mpi4py (which would call
``MPI_Abort`` and take the job down): everything ends in a BYE to the
controller and an orderly ``MPI_Finalize``.  A worker whose controller has
died exits on its own: no rank outlives the controller.  ``_roles.boot``
starts workers (:func:`run`).
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from .._core import protocol
from .._core.logs import Forwarder, go_local, install_forwarders, warn
from .._core.ports import OneReply
from .._core.protocol import CONTROLLER, Frame, Kind, PortRef
from .._core.runtime import Runtime, extend_sys_path
from .._transport import live, ulfm_beat
from .._transport.buffers import warm
from .._transport.frames import TAG_FRAME
from .._transport.mpi import MPI, library
from ..config import settings
from ..future import Future
from ..supervision import MeshFailure
from .base import BaseRole
from .hostwatch import HostWatch
from .job_status import set_job_exit_status
from .liveness import BUSY_CPU, PING_AFTER, leave_job_dir, stop_last_words

__all__ = ["Worker", "finish", "run"]

Addr = tuple[int, int]

# How often an idle worker checks that its controller still exists.
_WATCH_PERIOD = 0.25


class Heartbeat:
    """Tells the controller that this worker lives while its polling has stalled.

    The controller's PING is answered by whichever thread polls; a poll that
    spends seconds receiving a large payload, or that waits for the router's
    lock while an actor holds it for a long MPI call, answers nothing
    meanwhile.  This thread looks every half ping interval and, if no poll
    has been made since its last look, sends a heartbeat (a quiet PING)
    itself, through the send path alone, which no receive blocks
    (issue #14 item 11; see ``_roles.liveness``).

    It needs the GIL, which an actor in a long C call may hold.  So where the
    native part is bound, a thread in C (``native/beat.c``) also sends a
    heartbeat every half ping interval in which the process used at least
    :data:`~.liveness.BUSY_CPU` of a core: a busy process lives, while one
    stopped, or hung without using the CPU, stays silent and is declared
    dead, on any host.

    Args:
        runtime: this worker's runtime.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        #: seconds between two looks
        self.period = min(PING_AFTER, settings.heartbeat_timeout / 4) / 2
        #: statistics: heartbeats sent because the polling had stalled
        self.sent = 0
        # the native part, while its heartbeat thread runs
        self._native: Any = None
        self._native_sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mpimesh-heartbeat", daemon=True)

    @property
    def native_sent(self) -> int:
        """Statistics: heartbeats the native thread sent because the process was busy."""
        return int(self._native.beat_sent()) if self._native is not None else self._native_sent

    def start(self) -> None:
        """Start looking (non-blocking)."""
        self._thread.start()
        self._native = _start_native(self.rt, self.period)

    def stop(self) -> None:
        """Stop looking; waits at most one period for the threads to end."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(self.period + 1.0)
        if self._native is not None:
            self._native_sent = int(self._native.beat_stop())
            self._native = None

    def _run(self) -> None:
        router = self.rt.router
        seen = router.polls
        while not self._stop.wait(self.period):
            polls = router.polls
            if polls == seen:
                self.sent += 1
                try:
                    router.flush()  # frames held for a batch would wait for the stalled poll too
                    router.send_quiet(CONTROLLER, protocol.ping(-self.sent))
                except ConnectionError:
                    return  # the controller is gone: _watch_controller ends this process
            seen = polls


def _start_native(rt: Runtime, period: float) -> Any:
    """Start the native heartbeat thread; returns ``mpimesh._native``, or None where it cannot run."""
    from .._transport import native

    if not native.bind():
        return None  # not built, or MPIMESH_WIRE=mpi4py: the Python thread alone
    from .. import _native

    link = rt.router.controller_link()
    if not hasattr(_native, "beat_start") or link is None:
        return None  # an older build
    handle, rank = link
    _native.beat_start(handle, rank, TAG_FRAME, pickle.dumps(protocol.ping(0), protocol=5), period, BUSY_CPU)
    return _native


class Worker(BaseRole):
    """A launch-pool or spawned worker: serves actors for the controller.

    Args:
        runtime: this process's runtime.
        spawned: started by ``MPI_Comm_spawn``: it waits for the controller's
            INIT, and disconnects from its parent at the end.
    """

    name = "worker"
    #: A worker outlives any death but the controller's: ending the job is the controller's call.
    fault_tolerant = True

    def __init__(self, runtime: Runtime, *, spawned: bool = False) -> None:
        super().__init__(
            runtime, {Kind.INIT: self.on_init, Kind.SHUTDOWN: self.on_shutdown, Kind.PING: self.on_ping,
                      Kind.WATCH: self.on_watch, Kind.SHRINK: self.on_shrink}
        )
        self.spawned = spawned
        #: a spawned worker has heard the controller's INIT
        self.initialized = not spawned
        #: the controller said at SHUTDOWN that a process of the job died
        #: (perhaps before this worker existed: then rt.dead does not know)
        self.deaths = False
        #: this worker's stdout and stderr, once it serves (``_core.logs``)
        self.forwarders: list[Forwarder] = []
        #: speaks for this worker while its polling stalls, once it serves
        self.heartbeat = Heartbeat(runtime)
        #: this host's other workers, watched for a controller on another host (made by the first WATCH)
        self.host_watch: HostWatch | None = None
        # When the controller's silence is counted from (see _controller_alive).
        self._watched = time.monotonic()
        self._silent_since = 0.0
        runtime.every_ms(self._drain_forwarders)
        runtime.role = self

    # --- frames -----------------------------------------------------------------------------------

    def on_init(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """INIT: a spawned worker learns where the controller runs and its ``sys.path``."""
        _, _, _island, host, pid, path = frame
        rt = self.rt
        rt.controller_host, rt.controller_pid = host, pid
        if host != rt.host:
            warm(settings.recv_warm_bytes)  # for the first large argument (docs/design/data.md)
        extend_sys_path(path)
        with rt.cond:
            self.initialized = True
            rt.cond.notify_all()

    def on_shutdown(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """SHUTDOWN: stop every actor, say BYE and exit with the status given."""
        _, _, exit_code, deaths = frame
        self.deaths = self.deaths or deaths
        if self.host_watch is not None:
            self.host_watch.close()  # the others leave too: their exits are no news
        self.request_stop(exit_code)

    def on_watch(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """WATCH: report the exits of these workers of this host to the controller (it runs on another host)."""
        if self.host_watch is None:
            self.host_watch = HostWatch(self.rt)
        self.host_watch.add(frame[2])

    def on_shrink(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """SHRINK: shrink the world to its live processes with every other one, off the wire's thread.

        Announced here, before any later frame is dispatched: a communicator
        the engine makes after the heal waits for the shrink
        (``_transport.live``).
        """
        live.announce()
        threading.Thread(target=self._shrink, name="mpimesh-shrink", daemon=True).start()

    def _shrink(self) -> None:
        try:
            live.shrink(settings.spawn_timeout)  # the controller's bound: it reports a frozen process
        except (MPI.Exception, TimeoutError) as exc:
            warn(f"could not shrink the world to its live processes: {exc}", self.rt.addr)

    def on_ping(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """PING: echo the controller's heartbeat (quietly: a heartbeat wakes nobody)."""
        self.rt.router.send_quiet(CONTROLLER, frame)

    # --- the runtime's questions (the Role protocol) ----------------------------------------------

    def record_death(self, addr: Addr, cause: str) -> str:
        """The report of a death this worker found itself (ULFM's, the controller silent)."""
        return f"process {addr[0]}.{addr[1]} {cause}"

    def live_addrs(self) -> list[Addr]:
        """Nobody: telling the others of a death is the controller's job."""
        return []

    def fatal(self, report: str) -> None:
        """Never called: a worker is :attr:`fault_tolerant`."""

    def unhandled(self, failure: MeshFailure) -> None:
        """A failure of a mesh that no actor owns: only the controller script can own one, so report it."""
        warn(f"failure with no owner:\n{failure.report()}", self.rt.addr)

    def settle_mpi_report(self, addr: Addr, text: str) -> bool:
        """Not now: the controller's report, with the cause, usually follows within milliseconds."""
        return False

    def allocate(self, per_host: int, hosts: list[str]) -> list[tuple[Addr, str]]:
        """``per_host`` processes on each of ``hosts``, from the controller (blocking)."""
        fut = OneReply("spawn_procs", "spawn_procs", CONTROLLER)
        self.rt.send(CONTROLLER, protocol.allocate(per_host, hosts, self._port(fut)))
        placed: list[tuple[Addr, str]] = fut.get()
        return placed

    def replace(self, hosts: list[str]) -> list[tuple[Addr, str]]:
        """Healing takes spares from the controller's pool: only the controller script heals a mesh."""
        raise RuntimeError(
            "cannot heal a process mesh from an actor: healing runs on the controller; call heal_mesh(procs) in "
            "the script (an actor may report the failure to it, e.g. through a Channel)"
        )

    def named_actor(self, name: str, body: bytes) -> Any:
        """The controller's singleton actor mesh ``name`` (blocking)."""
        fut = OneReply("get_or_spawn_controller", "get_or_spawn_controller", CONTROLLER)
        self.rt.send(CONTROLLER, protocol.named_actor(name, body, self._port(fut)))
        return fut.get()

    def job_hosts(self) -> list[str]:
        """The job's hosts in launch order, from the controller (blocking)."""
        fut = OneReply("host_mesh", "host_mesh", CONTROLLER)
        self.rt.send(CONTROLLER, protocol.job_hosts(self._port(fut)))
        hosts: list[str] = fut.get()
        return hosts

    def release(self, addrs: list[Addr], reason: str) -> Future[None]:
        """Ask the controller to stop the actors on ``addrs`` and take the processes back."""
        fut = OneReply("ProcMesh.stop()", "ProcMesh.stop", CONTROLLER)
        self.rt.send(CONTROLLER, protocol.release(addrs, reason, self._port(fut)))
        return fut

    def _port(self, fut: OneReply) -> PortRef:
        # A reply port of this process for the controller's one answer to a request.
        return (self.rt.addr, self.rt.ports.open(fut))

    # --- serving ----------------------------------------------------------------------------------

    def serve(self) -> int:
        """Serve actors until the controller says SHUTDOWN; returns the exit status."""
        rt = self.rt
        self.forwarders = install_forwarders(rt)
        self.heartbeat.start()
        self._loop(_WATCH_PERIOD, self._watch_controller)
        cells = rt.actors.stop_all("job shutdown", lambda: None, owned=False)
        stuck = rt.actors.wait_stopped(cells, settings.cleanup_timeout)
        rt.owners.end()  # the ownership tree's root closes with the job (docs/design/ownership.md)
        if not stuck:
            rt.actors.join_threads(1.0)
        stop_last_words(rt.controller_pid, rt.addr)
        rt.close_bell()
        leave_job_dir(rt.controller_pid, list(rt.dead))
        go_local(self.forwarders)
        self.heartbeat.stop()
        rt.peers.leave()
        rt.send(CONTROLLER, protocol.bye(len(stuck)))
        rt.drain_sends(2.0)
        if self.spawned:
            self._disconnect_parent()
        return self.exit_code

    def _drain_forwarders(self) -> None:
        for forwarder in self.forwarders:
            forwarder.drain()  # lines a write could not send itself

    def _watch_controller(self) -> None:
        rt = self.rt
        if self.stopping or self._controller_alive():
            return
        warn(f"controller (pid {rt.controller_pid}) is gone; exiting", rt.addr)
        if not self.spawned:
            # The controller died before it could give the job its status
            # (killed by a signal): under ULFM the launcher would exit 0.
            set_job_exit_status(1)
        os._exit(1)

    def _controller_alive(self) -> bool:
        rt = self.rt
        if rt.controller_host != rt.host:
            # Another node: the controller pings every worker at least every
            # half heartbeat timeout; twice the timeout of silence means it is gone.
            # Silence counts only while this worker could listen: an actor
            # holding the GIL for seconds kept this thread (and the polls
            # that would have read the PINGs waiting in MPI) from running,
            # and the worker ended itself (issue #14 item 11).
            now = time.monotonic()
            gap, self._watched = now - self._watched, now
            since = max(rt.router.heard_controller, self._silent_since)
            if gap > 2 * _WATCH_PERIOD:
                since = self._silent_since = min(now, since + gap - _WATCH_PERIOD)
            return now - since < 2 * settings.heartbeat_timeout
        try:
            os.kill(rt.controller_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def _disconnect_parent(self) -> None:
        # The controller disconnects only from an island that is whole
        # (Islands.drop): once a sibling has died (issue #3: the
        # island now outlives it), MPI_Comm_disconnect fails (MPI_ERR_COMM on
        # Open MPI 5).  A disconnect the controller does not join would wait:
        # the watchdog bounds it.
        rt = self.rt
        if any(addr[0] == rt.addr[0] for addr in rt.dead):
            return
        watchdog = threading.Timer(settings.shutdown_timeout, os._exit, args=(self.exit_code,))
        watchdog.daemon = True
        watchdog.start()
        try:
            with rt.router.exclusive():
                MPI.Comm.Get_parent().Disconnect()
        finally:
            watchdog.cancel()


#: Seconds a worker may wait in MPI_Finalize.  Finalize is collective: it
#: returns when the slowest process of the job reaches it, and the controller
#: gets there only after its own interpreter teardown (3-9 s with torch loaded
#: on a loaded 2-core machine).  8 s ended a worker with status 1 after a clean
#: run (tests/launch/test_pip_install.py, 1 CI rehearsal in 4).  The
#: controller bounds its own exit by it too (``EndOfJob.leave``);
#: ``MPIMESH_FINALIZE_BOUND`` sets it for tests.
FINALIZE_BOUND = float(os.environ.get("MPIMESH_FINALIZE_BOUND", "30"))

#: Seconds a worker's interpreter may take to exit once MPI_Finalize returned.
EXIT_AFTER_FINALIZE = 30.0


def finish(code: int, dead: bool) -> int:
    """End a worker process with ``code``, in bounded time.

    Args:
        code: the exit status.
        dead: a process of the job has died (``MPI_Finalize`` is skipped).
    """
    sys.stdout.flush()
    sys.stderr.flush()
    mpich = not library().startswith("Open MPI")
    # MPI_Finalize can spin forever once a process of the job has died
    # (Open MPI's ULFM): skip it then, and bound it always.  mpi4py's
    # Finalize holds the GIL (measured: no Python thread runs while it
    # waits), so only faulthandler's watchdog, a C thread, can end a process
    # stuck there (status 1).  It must outlast the slowest peer's way to
    # Finalize, which is no hang (FINALIZE_BOUND).
    if dead and not mpich:
        os._exit(code)
    try:
        ulfm_beat.stop()  # its thread's last MPI call returns first: none may run beside or after MPI_Finalize
    except TimeoutError as exc:
        # MPI's progress is stuck, and the thread may call MPI any time: no
        # Finalize (undefined beside it), as after a death; the job learns it from the status.
        warn(f"{exc}; exiting with status {code or 1} without MPI_Finalize")
        os._exit(code or 1)
    faulthandler.dump_traceback_later(FINALIZE_BOUND, exit=True)
    MPI.Finalize()
    # MPI_Finalize, the call known to spin, is done: what is left is the
    # interpreter's own exit, which with torch loaded takes 3-9 s on a loaded
    # 2-core machine (module teardown); 8 s ended such workers with status 1
    # after a clean run (examples/ddp_in_actors.py: 10 runs in 22).
    faulthandler.dump_traceback_later(EXIT_AFTER_FINALIZE, exit=True)
    # A teardown that keeps the GIL free but lingers (a non-daemon thread)
    # ends with the job's status, not faulthandler's 1.
    watchdog = threading.Timer(5.0, os._exit, args=(code,))
    watchdog.daemon = True
    watchdog.start()
    # Leave through the interpreter's exit, as a plain Python program does:
    # module globals are finalized (their __del__ run, as Monarch's do when
    # a process mesh stops) and atexit handlers run.  MPICH's Hydra also
    # needs it: it kills the whole job when a rank ends with _exit() after
    # MPI_Finalize.  The watchdogs above bound a shutdown that hangs on a
    # thread stuck in C code.
    return code


def run(boot: Callable[[], Worker]) -> int:
    """A worker process from start to end: ``boot()``, serve, finish; returns the exit status."""
    # Ctrl-C at the terminal reaches every rank; the controller decides what
    # happens (it stops the workers), so a worker must not die of it first.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    worker = None
    try:
        worker = boot()
        code = worker.serve()
    except BaseException:
        traceback.print_exc()
        code = 1
    if worker is not None:
        worker.heartbeat.stop()  # no MPI call from it once MPI_Finalize may run
    return finish(code, worker is not None and (worker.deaths or bool(worker.rt.dead)))
