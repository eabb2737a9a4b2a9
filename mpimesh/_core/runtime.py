"""The per-process runtime: one router, one progress engine, ports, actors.

Every process of a job (controller, launch-pool worker, spawned worker) runs
one :class:`Runtime`, the same on every rank.  It owns the dispatch table from
message kinds to handlers (:meth:`Runtime.handle`), answers calls, and holds
what the rest of the package needs to send: this process's address and a
fresh-id counter.  Deaths are reconciled by :class:`~.failures.Failures`.

What differs between the controller and the workers is a :class:`Role`
object (``mpimesh._roles``) that registers its own handlers; the runtime
reaches it only through that protocol.  ``_roles.boot`` builds the two and
connects them.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol

from .._data.pulls import Pulls
from .._transport import make_router
from .._transport.mpi import hostname
from .._transport.peers import Peers, enabled
from .._transport.router import Addr
from ..errors import MeshInternalError
from ..future import Future
from . import failures as _failures
from . import protocol
from . import serialize as _serialize
from .actors import ActorHost
from .failures import Failures
from .failures import Owned as Owned
from .forwarder import Forwarder
from .logs import debug, warn
from .multicast import Multicast
from .owners import Owners
from .ports import PortTable
from .progress import Progress, Waitable
from .protocol import NAMES, Frame, Key, Kind, Status

if TYPE_CHECKING:
    from .._transport.bell import Ringer

__all__ = ["Handler", "Owned", "Role", "Runtime", "extend_sys_path"]

#: A frame handler: ``handler(src, frame, buffers)``, called by the polling thread.
Handler = Callable[[Addr, Frame, list[Any]], None]

_OK, _FAILED, _VALUE = Status.OK, Status.FAILED, Status.VALUE
_reply = protocol.reply


def extend_sys_path(path: Iterable[str]) -> None:
    """Put the entries of another process's ``sys.path`` that this one lacks in front, in their order.

    Classes and functions from importable modules travel by reference, so a
    worker needs the controller's import path (pytest, for one, extends it late).
    """
    for entry in reversed(list(path)):
        if entry not in sys.path:
            sys.path.insert(0, entry)


class Role(_failures.Role, Protocol):
    """What differs between the controller and a worker, as the rest of the package sees it.

    Besides the decisions about deaths (:class:`.failures.Role`), a role
    finds processes for new meshes: the controller itself, a worker by asking
    the controller.
    """

    def allocate(self, per_host: int, hosts: list[str]) -> list[tuple[Addr, str]]:
        """``per_host`` worker processes on each of ``hosts`` for a new mesh, as ``(addr, host)`` (blocking)."""
        ...

    def replace(self, hosts: list[str]) -> list[tuple[Addr, str]]:
        """A process for each of ``hosts``, to replace a dead one there, as ``(addr, host)`` (blocking; heal)."""
        ...

    def job_hosts(self) -> list[str]:
        """The job's hosts, in launch order (blocking)."""
        ...

    def named_actor(self, name: str, body: bytes) -> Any:
        """The controller's singleton actor mesh ``name``, spawned from ``body`` if new (blocking)."""
        ...

    def release(self, addrs: list[Addr], reason: str) -> Future[None]:
        """Stop every actor on ``addrs`` and give the processes back."""
        ...


class Runtime:
    """State and message handlers of one process.

    Args:
        addr: this process's ``(island, rank)``.
    """

    #: the controller's or a worker's behaviour, set by the role object itself
    role: Role

    def __init__(self, addr: Addr) -> None:
        self.addr = addr
        self.host = hostname()
        self.pid = os.getpid()
        self._handlers: dict[int, Handler] = {}
        self.router = make_router(addr, self._handlers, self._mpi_failed, self._broken, names=NAMES)
        self.router.every_ms = self._every_ms
        self.progress = Progress(self.router.poll, lambda: self.router.sent_at)
        self.router.on_hold = self.progress.kick
        self.ports = PortTable()
        self.actors = ActorHost(self)
        #: what each part of this process must tear down (``_core.owners``)
        self.owners = Owners()
        self.failures = Failures(self)
        #: casts down trees as their caller, and the one path of actor-bound frames (``Multicast.post``)
        self.multicast = Multicast(self)
        #: casts down trees as a receiver: forwarded, delivered in their senders' order
        self.forwarder = Forwarder(self)
        #: direct links to processes of other islands (``_transport.peers``)
        self.peers = Peers(self.router, enabled())
        #: reads of RDMABuffers on other hosts, and the owner's side of them (``_data.pulls``)
        self.pulls = Pulls(self.router)
        #: the dispatch table itself (kind -> handler), for frames delivered late (``forwarder``)
        self.dispatch = self._handlers
        # The failures' own tables, read on every reply and call: no property in between.
        self.dead: dict[Addr, str] = self.failures.dead
        #: the host of each process this one spawned actors on (a large cast to its own host goes direct: ``calls``)
        self.hosts: dict[Addr, str] = {}
        self._poll_errors: set[str] = set()
        # run by the polling thread about once per millisecond (see _every_ms)
        self._ticks: list[Callable[[], None]] = [self.failures.check_reported]
        #: rings other processes' doorbells (see open_bell)
        self.ringer: Ringer | None = None
        #: notified when the process's state changes (a role's stop, a spawned worker's INIT)
        self.cond = threading.Condition()
        #: where the controller runs: it names the job's directory (last words, doorbells)
        self.controller_host = self.host
        self.controller_pid = self.pid
        self._ids = itertools.count(1)
        self._site_ids = itertools.count(1)
        #: (actor's address, mesh key, method, message point) -> registered call site (SITE_CALL)
        self.sites: dict[tuple[Any, ...], int] = {}
        actors = self.actors
        for kind, handler in (
            (Kind.SPAWN, actors.on_spawn),
            (Kind.CALL, actors.on_call),
            (Kind.SITE_CALL, actors.on_site_call),
            (Kind.STOP, actors.on_stop),
            (Kind.REPLY, self.ports.on_reply),
            (Kind.FAULT, self.failures.on_fault),
            (Kind.DEAD, self.failures.on_dead),
            (Kind.UNREACHABLE, self.failures.on_unreachable),
            (Kind.BATCH, self.on_batch),
            (Kind.CAST, self.forwarder.on_cast),
            (Kind.SEQ, self.forwarder.on_seq),
            (Kind.PART, self.forwarder.on_part),
            (Kind.LINK, self.peers.on_link),
            (Kind.MARK, self.peers.on_mark),
            (Kind.PULL, self.pulls.on_pull),
        ):
            self.handle(kind, handler)

    # --- dispatch ---------------------------------------------------------------------------------

    def handle(self, kind: int, handler: Handler) -> None:
        """Dispatch every frame of ``kind`` to ``handler``; each kind has exactly one.

        Raises:
            MeshInternalError: ``kind`` has a handler already.
        """
        if kind in self._handlers:
            raise MeshInternalError(f"a second handler for {NAMES.get(kind, kind)} frames in {self.addr}")
        self._handlers[kind] = handler

    def handlers(self) -> dict[int, Handler]:
        """A copy of the dispatch table: kind -> handler."""
        return dict(self._handlers)

    def every_ms(self, tick: Callable[[], None]) -> None:
        """Run ``tick()`` on the polling thread about once per millisecond of polling."""
        self._ticks.append(tick)

    def on_batch(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """BATCH: never dispatched, the router expands it into its frames on receipt."""
        raise MeshInternalError(f"BATCH frame from {src} reached the dispatcher of {self.addr}: the router expands it")

    # --- services for the rest of the package -----------------------------------------------------

    def new_site(self) -> int:
        """A job-wide unique call-site number (see ``Kind.SITE_CALL``)."""
        island, rank = self.addr
        return (island << 48) | (rank << 28) | next(self._site_ids)

    def new_id(self) -> tuple[int, int, int]:
        """A job-wide unique id: this address plus a counter."""
        return (self.addr[0], self.addr[1], next(self._ids))

    def wait(self, done: Callable[[], bool], cond: Waitable, timeout: float | None) -> bool:
        """Wait for ``done()``, driving progress (see ``progress``)."""
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
            frame, buffers = protocol.reply(None, port[1], index, _FAILED, str(value)), []
        else:
            body, buffers = _serialize.dumps(value)
            frame = protocol.reply(tuple(b.nbytes for b in buffers) or None, port[1], index, status, body)
        try:
            self.router.send(dest, frame, buffers)
        except ConnectionError:
            debug(f"reply to {dest} dropped: it has failed", self.addr)

    def reply_value(self, dest: Addr, pid: int, index: int, value: Any) -> None:
        """Answer port ``pid`` of ``dest`` with plain data (``serialize.plain``): it rides in the frame."""
        if dest in self.dead:
            return
        try:
            self.router.send(dest, _reply(None, pid, index, _VALUE, value))
        except ConnectionError:
            debug(f"reply to {dest} dropped: it has failed", self.addr)

    def fault(self, key: Key, rank: int, report: str, spawner: Addr) -> None:
        """Tell the process that spawned an actor that the actor has failed."""
        try:
            self.router.send(spawner, protocol.fault(key, rank, report))
        except ConnectionError:
            warn(f"actor failure with its owner gone:\n{report}")

    def drain_sends(self, timeout: float) -> None:
        """Poll until every send has left, for at most ``timeout`` seconds (a process about to leave)."""
        end = time.monotonic() + timeout
        while self.router.pending_sends() and time.monotonic() < end:
            self.progress.poll_once()
            time.sleep(1e-4)

    # --- doorbells --------------------------------------------------------------------------------

    def open_bell(self) -> None:
        """Sleep on a doorbell and ring peers' (``_transport.bell``); needs the controller's pid."""
        from .._transport.bell import Bell, Ringer, bell_path, job_dir
        from .crowding import Crowding

        try:
            bell = Bell(bell_path(self.controller_pid, self.addr))
        except OSError as exc:
            debug(f"no doorbell ({exc}): idle naps only", self.addr)
            return
        self.ringer = Ringer(self.controller_pid)
        self.router.ring = self.ringer.ring
        self.progress.bell = bell
        # Spinners yield only while the job's processes here (their bells) outnumber the CPUs.
        crowding = Crowding(self.progress, job_dir(self.controller_pid))
        crowding.check()
        if crowding.mode == "auto":
            self.every_ms(crowding.tick)

    def close_bell(self) -> None:
        """Remove this process's doorbell (at exit)."""
        bell, self.progress.bell = self.progress.bell, None
        self.router.ring = None
        if bell is not None:
            bell.close()
        if self.ringer is not None:
            self.ringer.close()

    # --- the router's callbacks -------------------------------------------------------------------

    def _every_ms(self) -> None:
        # Work that need not run at every poll: one poll(2) on the pidfds per
        # poll would cost a noticeable part of a round trip.
        for tick in self._ticks:
            tick()

    def _mpi_failed(self, addrs: list[Addr], text: str) -> None:
        self.failures.mpi_failed(addrs, text)

    def _broken(self, text: str) -> None:
        # A poll or a handler raised.  Report it (once per kind) and keep
        # serving: killing the polling thread would take the process down.
        last = text.strip().splitlines()[-1]
        if last not in self._poll_errors:
            self._poll_errors.add(last)
            warn(f"error in the polling thread (reported once):\n{text}", self.addr)
