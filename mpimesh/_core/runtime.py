"""The per-process runtime: one router, one progress engine, ports, actors.

Every process of a job (controller, launch-pool worker, spawned worker) runs
one :class:`Runtime`.  It owns the dispatch table from message kinds to
handlers (``_protocol.HANDLERS``), answers calls, and holds what the rest of
the package needs to send: this process's address and a fresh-id counter.
The controller adds a :class:`~mpimesh._roles.controller.Controller` for process
management; workers run ``_worker.serve``.
"""

from __future__ import annotations

import atexit
import itertools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import future
from .._roles.liveness import start_last_words
from .._transport import make_router
from .._transport.mpi import MPI, hostname
from .._transport.router import CONTROLLER, Addr
from ..config import settings
from ..errors import MeshInternalError
from ..supervision import MeshFailure
from . import current as _current
from . import serialize as _serialize
from .actors import ActorHost
from .ports import PortTable
from .progress import Progress, Waitable
from .protocol import HANDLERS, NAMES, Frame, Key, Kind, Status

if TYPE_CHECKING:
    from .._roles.controller import Controller
    from .._roles.liveness import Liveness
    from .._transport.bell import Ringer
    from ..shape import Shape
    from .actors import _Cell

__all__ = ["Runtime", "current", "boot_controller", "debug"]

_runtime: Runtime | None = None

# How long a process waits for the fuller report of a death that ULFM told it
# about first (a worker: the controller's DEAD notice; the controller: its
# pidfd), before failing its waits with ULFM's poorer message.
_MPI_REPORT_GRACE = 0.2
_boot_lock = threading.Lock()

_REPLY, _OK, _FAILED, _VALUE = Kind.REPLY, Status.OK, Status.FAILED, Status.VALUE


def debug(msg: str) -> None:
    """Trace line on stderr when ``MPIMESH_DEBUG=1``, tagged with the address."""
    if settings.debug:
        addr = _runtime.addr if _runtime is not None else "?"
        print(f"[mpimesh {addr}] {msg}", file=sys.stderr, flush=True)


class Owned:
    """An actor mesh this process spawned, kept to route its failures to its owner."""

    __slots__ = ("name", "class_name", "addrs", "shape", "owner")

    def __init__(self, name: str, class_name: str, addrs: tuple[Addr, ...], shape: Shape, owner: _Cell | None) -> None:
        self.name = name
        self.class_name = class_name
        self.addrs = addrs
        self.shape = shape
        self.owner = owner

    def failure(self, ranks: list[int], cause: str) -> MeshFailure:
        coords = [self.shape.coordinates(r) for r in ranks]
        return MeshFailure(self.name, ranks, cause, self.class_name, coords)


class Runtime:
    """State and message handlers of one process.

    Args:
        addr: this process's ``(island, rank)``.
        role: ``"controller"`` or ``"worker"``.
    """

    def __init__(self, addr: Addr, role: str) -> None:
        self.addr = addr
        self.role = role
        self.host = hostname()
        self.pid = os.getpid()
        self._handlers: dict[int, Callable[[Addr, Frame, list[Any]], None]] = {}
        self.router = make_router(addr, self._handlers, self._mpi_failed, self._broken, names=NAMES)
        self.router.every_ms = self._every_ms
        self.progress = Progress(self.router.poll, lambda: self.router.sent_at)
        self.router.on_hold = self.progress.kick
        self.ports = PortTable()
        self.actors = ActorHost(self)
        self.controller: Controller | None = None
        self.liveness: Liveness | None = None
        # addr -> report, for every process known dead
        self.dead: dict[Addr, str] = {}
        # actor meshes spawned from this process, by key
        self.owned: dict[Key, Owned] = {}
        self._poll_errors: set[str] = set()
        # workers: peers ULFM reported failed, waiting for the controller's word
        self._mpi_reported: dict[Addr, tuple[float, str]] = {}
        # rings other processes' doorbells (see open_bell)
        self.ringer: Ringer | None = None
        # stdout/stderr forwarders of a worker (see _logs)
        self.forwarders: list[Any] = []
        self.cond = threading.Condition()
        # spawned workers: set when the controller's INIT arrives
        self.initialized = True
        self.stopping = False
        self.exit_code = 0
        self.controller_host = self.host
        self.controller_pid = self.pid
        self._ids = itertools.count(1)
        self._site_ids = itertools.count(1)
        #: (actor's address, mesh key, method, message point) -> registered call site (SITE_CALL)
        self.sites: dict[tuple[Any, ...], int] = {}
        # The kinds of every call go straight to their owners; the rest to _on_<kind>.
        owners: dict[int, Callable[[Addr, Frame, list[Any]], None]] = {
            Kind.CALL: self.actors.on_call,
            Kind.SITE_CALL: self.actors.on_site_call,
            Kind.REPLY: self.ports.on_reply,
        }
        self._handlers.update({kind: owners.get(kind) or getattr(self, name) for kind, name in HANDLERS.items()})

    # -- services for the rest of the package --------------------------------

    def new_site(self) -> int:
        """A job-wide unique call-site number (see ``Kind.SITE_CALL``)."""
        island, rank = self.addr
        return (island << 48) | (rank << 28) | next(self._site_ids)

    def new_id(self) -> tuple[int, int, int]:
        """A job-wide unique id: this address plus a counter."""
        return (self.addr[0], self.addr[1], next(self._ids))

    def wait(self, done: Callable[[], bool], cond: Waitable, timeout: float | None) -> bool:
        """Wait for ``done()``, driving progress (see ``_progress``)."""
        return self.progress.wait(done, cond, timeout)

    def send(self, dest: Addr, frame: Frame, buffers: list[Any] | tuple[Any, ...] = ()) -> None:
        """Send one frame."""
        self.router.send(dest, frame, buffers)

    def reply(self, port: tuple[Addr, int], index: int, status: int, value: Any) -> None:
        """Answer on ``port``: the value (OK), an error payload or a failure report.

        A reply to a process that has died is dropped: nobody is left to read it.

        Raises:
            Exception: ``value`` cannot be pickled (the caller sends an error instead).
        """
        dest = port[0]
        if status == _OK and _serialize.plain(value):
            self.reply_value(dest, port[1], index, value)
            return
        if dest in self.dead:
            return
        frame: Frame
        buffers: list[Any]
        if status == _FAILED:
            frame, buffers = (_REPLY, None, port[1], index, _FAILED, str(value)), []
        else:
            body, buffers = _serialize.dumps(value)
            sizes = tuple(b.nbytes for b in buffers) or None
            frame = (_REPLY, sizes, port[1], index, status, body)
        try:
            self.router.send(dest, frame, buffers)
        except ConnectionError:
            debug(f"reply to {dest} dropped: it has failed")

    def reply_value(self, dest: Addr, pid: int, index: int, value: Any) -> None:
        """Answer port ``pid`` of ``dest`` with plain data (``_serialize.plain``): it rides in the frame."""
        if dest in self.dead:
            return
        try:
            self.router.send(dest, (_REPLY, None, pid, index, _VALUE, value))
        except ConnectionError:
            debug(f"reply to {dest} dropped: it has failed")

    def fault(self, key: Key, rank: int, report: str, spawner: Addr) -> None:
        """Tell the process that spawned an actor that the actor has failed."""
        try:
            self.router.send(spawner, (Kind.FAULT, None, key, rank, report))
        except ConnectionError:
            print(f"mpimesh: actor failure with its owner gone:\n{report}", file=sys.stderr, flush=True)

    # -- failures ----------------------------------------------------------

    def _every_ms(self) -> None:
        # Run by the polling thread about once per millisecond: one poll(2)
        # on the pidfds per poll was a tenth of the round trip.
        for forwarder in self.forwarders:
            forwarder.drain()  # lines a write could not send itself
        if self._mpi_reported:
            self._apply_mpi_reported()
        if self.liveness is not None:
            self.liveness.check()

    def _broken(self, text: str) -> None:
        # A poll or a handler raised.  Report it (once per kind) and keep
        # serving: killing the polling thread would take the process down.
        last = text.strip().splitlines()[-1]
        if last not in self._poll_errors:
            self._poll_errors.add(last)
            print(f"[mpimesh {self.addr}] error in the polling thread (reported once):\n{text}",
                  file=sys.stderr, flush=True)

    def _mpi_failed(self, addrs: list[Addr], text: str) -> None:
        # ULFM reported dead peers.  Its report has no cause (signal, exit
        # status), and on a worker no pid or host either: the controller's
        # pidfd and last words give those, usually within milliseconds, so
        # wait for them a moment before settling for ULFM's word.
        liveness = self.liveness
        for addr in addrs:
            if addr in self.dead:
                continue
            if self.controller is not None:
                if liveness is None or not liveness.watches(addr):
                    # another node: heartbeats would take seconds
                    self.declare_dead(addr, f"reported failed by MPI ({text})")
                    continue
                liveness.check()
                if addr in self.dead:
                    continue
            self._mpi_reported.setdefault(addr, (time.monotonic(), text))

    def _apply_mpi_reported(self) -> None:
        now = time.monotonic()
        for addr, (when, text) in list(self._mpi_reported.items()):
            if addr in self.dead:
                del self._mpi_reported[addr]
            elif now - when > _MPI_REPORT_GRACE:
                del self._mpi_reported[addr]
                if self.controller is not None:
                    self.declare_dead(addr, f"reported failed by MPI ({text})")
                else:
                    self.apply_dead(addr, f"process {addr[0]}.{addr[1]} reported failed by MPI ({text})")

    def declare_dead(self, addr: Addr, cause: str) -> None:
        """On the controller: ``addr`` is dead; tell every process, fail its waits, supervise."""
        if addr in self.dead or self.controller is None:
            return
        report = self.controller.on_dead(addr, cause)
        for other in self.controller.live_addrs():
            try:
                self.router.send(other, (Kind.DEAD, None, addr, report))
            except ConnectionError:
                pass
        self.apply_dead(addr, report)
        if not self.controller.fault_tolerant:
            self.controller.fatal(report)

    def apply_dead(self, addr: Addr, report: str) -> None:
        """``addr`` is dead: fail every wait on it and tell the owners of its actors."""
        if addr in self.dead:
            return
        self.dead[addr] = report
        if self.ringer is not None:
            self.ringer.forget(addr)
        if addr == CONTROLLER:
            return
        self.ports.fail_source(addr, report)
        for owned in list(self.owned.values()):
            ranks = [r for r, a in enumerate(owned.addrs) if a == addr]
            if ranks:
                self.supervise(owned.owner, owned.failure(ranks, report))

    def supervise(self, owner: _Cell | None, failure: MeshFailure) -> None:
        """Deliver ``failure`` to the owner actor, or to the fault hook at the top."""
        if owner is not None:
            owner.put(("supervise", failure, None))
            return
        if self.controller is None:
            print(f"mpimesh: failure with no owner in worker {self.addr}:\n{failure.report()}",
                  file=sys.stderr, flush=True)
            return
        self.controller.unhandled(failure)

    def _on_fault(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        _, _, key, rank, report = frame
        owned = self.owned.get(key)
        if owned is None:
            print(f"mpimesh: failure of an actor whose mesh is gone:\n{report}", file=sys.stderr, flush=True)
            return
        self.supervise(owned.owner, owned.failure([rank], report))

    def _on_dead(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        self.apply_dead(frame[2], frame[3])

    def request_stop(self, code: int) -> None:
        """Make the background loop return (workers: leave the serve loop)."""
        with self.cond:
            self.exit_code = code
            self.stopping = True
            self.cond.notify_all()
        self.progress.wake()

    def open_bell(self) -> None:
        """Sleep on a doorbell and ring peers' (``_bell``); needs the controller's pid."""
        from .._transport.bell import Bell, Ringer, bell_path

        try:
            bell = Bell(bell_path(self.controller_pid, self.addr))
        except OSError as exc:
            debug(f"no doorbell ({exc}): idle naps only")
            return
        self.ringer = Ringer(self.controller_pid)
        self.router.ring = self.ringer.ring
        self.progress.bell = bell

    def close_bell(self) -> None:
        """Remove this process's doorbell (at exit)."""
        bell, self.progress.bell = self.progress.bell, None
        self.router.ring = None
        if bell is not None:
            bell.close()
        if self.ringer is not None:
            self.ringer.close()

    # -- dispatch ----------------------------------------------------------

    def _on_spawn(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        self.actors.on_spawn(src, frame, buffers)

    def _on_stop(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        self.actors.on_stop(src, frame, buffers)

    def _on_shutdown(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        self.request_stop(frame[2])

    def _on_init(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        _, _, _island, host, pid, path = frame
        self.controller_host, self.controller_pid = host, pid
        for entry in reversed(path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        with self.cond:
            self.initialized = True
            self.cond.notify_all()

    def _on_ping(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        if self.controller is not None:
            self.controller.on_ping(src, frame)
        else:
            self.router.send_quiet(CONTROLLER, frame)  # a heartbeat wakes nobody

    def _controller_only(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        if self.controller is None:
            raise MeshInternalError(f"{NAMES.get(frame[0], frame[0])} frame from {src} reached worker {self.addr}")
        getattr(self.controller, HANDLERS[frame[0]])(src, frame, buffers)

    _on_hello = _on_bye = _on_forward = _on_procs = _on_log = _controller_only

    def _on_batch(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        raise MeshInternalError(f"BATCH frame from {src} reached the dispatcher of {self.addr}: the router expands it")


def current() -> Runtime:
    """This process's runtime, booting an embedded controller on first use.

    Raises:
        RuntimeError: a rank other than 0 of a multi-rank world runs the
            controller script (it was not started with ``-m mpimesh``).
    """
    rt = _runtime
    if rt is not None:
        return rt
    with _boot_lock:
        if _runtime is None:
            world = MPI.COMM_WORLD
            if world.Get_size() > 1:
                raise RuntimeError(
                    f"rank {world.Get_rank()} of {world.Get_size()} runs the controller script: every rank of "
                    f"this job started it; launch it with `mpirun -n {world.Get_size()} python -m mpimesh "
                    f"{os.path.basename(sys.argv[0]) or 'script.py'}` so that rank 0 runs it and the others serve"
                )
            boot_controller(MPI.COMM_WORLD, embedded=True)
    assert _runtime is not None
    return _runtime


def _install(rt: Runtime) -> None:
    global _runtime
    _runtime = rt
    _current.runtime = rt
    future._driver = rt.progress.wait


def boot_controller(world: MPI.Intracomm, *, embedded: bool = False) -> Runtime:
    """Start the controller runtime on rank 0 of ``world``.

    Collective over ``world``: the pool workers call ``_worker.boot_pool``.
    """
    from .._data.windows import open_island
    from .._roles.controller import Controller

    rt = Runtime(CONTROLLER, "controller")
    comm = world.Dup()
    rt.router.add_island(comm, 0)
    open_island(rt.router, comm, 0)  # collective: the data plane's window (_windows)
    infos = comm.allgather((rt.host, rt.pid))
    comm.bcast(list(sys.path), root=0)
    rt.controller = Controller(rt, [((0, r), host, pid) for r, (host, pid) in enumerate(infos) if r > 0])
    rt.open_bell()
    _install(rt)
    rt.controller.start()
    if embedded:
        atexit.register(rt.controller.shutdown_at_exit)
    return rt


def boot_pool(world: MPI.Intracomm) -> Runtime:
    """Start a launch-pool worker runtime; collective with :func:`boot_controller`."""
    from .._data.windows import open_island

    rt = Runtime((0, world.Get_rank()), "worker")
    comm = world.Dup()
    rt.router.add_island(comm, 0)
    open_island(rt.router, comm, 0)  # collective with boot_controller
    rt.router.set_relay(0)
    infos = comm.allgather((rt.host, rt.pid))
    rt.controller_host, rt.controller_pid = infos[0]
    start_last_words(rt.controller_pid, rt.addr)
    rt.open_bell()
    path = comm.bcast(None, root=0)
    for entry in reversed(path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    _install(rt)
    return rt


def boot_spawned(island: int) -> Runtime:
    """Start a spawned worker runtime and wait for the controller's INIT."""
    from .._data.windows import open_island

    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        raise RuntimeError("mpimesh --worker must be started by MPI_Comm_spawn from an mpimesh controller")
    world = MPI.COMM_WORLD
    rt = Runtime((island, world.Get_rank()), "worker")
    rt.initialized = False
    comm = world.Dup()
    rt.router.add_island(comm, island)
    open_island(rt.router, comm, island)  # collective over the island's processes
    rt.router.add_parent(parent)
    _install(rt)
    if not rt.wait(lambda: rt.initialized, rt.cond, settings.spawn_timeout):
        raise TimeoutError(f"spawned worker {rt.addr} got no INIT from the controller in {settings.spawn_timeout:g} s")
    start_last_words(rt.controller_pid, rt.addr)
    rt.open_bell()
    rt.router.send(CONTROLLER, (Kind.HELLO, None, rt.host, rt.pid))
    return rt
