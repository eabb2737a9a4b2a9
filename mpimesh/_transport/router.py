"""Frames over MPI through mpi4py: links, routing, batching, sending and receiving.

A process is addressed as ``(island, rank)``.  Island 0 is the launch world
(the controller is ``(0, 0)``); island ``k > 0`` is the world of the ``k``-th
set of processes created with ``MPI_Comm_spawn``.  A process talks directly to
the processes of its own island and to the controller; anything else is
relayed by the controller (a ``FORWARD`` frame), which keeps one path per pair
of processes and so keeps MPI's per-pair ordering.  Once two processes of
different islands have exchanged a frame, the controller brokers a direct
link between them (:mod:`.peers`) and both switch to it after a ``MARK`` on
the relay path (:meth:`Router.adopt`), so their order survives the switch.

Every MPI call of the runtime goes through the router, under one of its two
locks: sends under the send lock, everything else (receiving, the data plane's
windows, spawning) under :attr:`Router.lock`.  Two locks let a thread that
issues calls go on while another receives the replies (MPI is initialised
with ``MPI_THREAD_MULTIPLE``); with one lock, every collision between them
costs a thread hand-off.  Sends are non-blocking (``Isend``): two ranks
flooding each other with blocking sends while neither receives would
deadlock.

Small frames to one process in a burst are coalesced.  A frame leaves at once
unless it follows another to the same process within ``_BURST`` seconds with
no poll in between (a caller issuing calls without waiting, an actor
answering a backlog); such frames wait, up to ``_MAX_BATCH``, and leave
together as one ``BATCH`` message at the next poll of any thread of this
process, which every waiting thread does at once.  A call followed by a wait
(``call_one().get()``) is never held back.  An MPI message costs several
times what pickling a small frame costs, so without batching a pipelined
caller and an actor answering a backlog spend most of their time in MPI.

Raw buffers (the data plane's out-of-band tensors and arrays) are sent from
the caller's memory without a copy and received into pooled blocks
(:mod:`.buffers`) that stay faulted in between messages.

:class:`Router` is the whole I/O path through mpi4py.
:class:`~mpimesh._transport.native_router.NativeRouter` is the same router
with its hot halves (receiving and dispatching, sending a frame that leaves at
once) in C; :func:`mpimesh._transport.make_router` picks one, once.  The
figures behind these choices are in docs/design/transport.md.
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

from ..config import settings
from .bell import RING_AFTER
from .buffers import copy_buffer, layout, recv_buffer
from .frames import BATCH, CONTROLLER, PING, TAG_DATA, TAG_FRAME, Addr, Frame, batch, forward, mark
from .mpi import MPI

__all__ = ["Addr", "Router", "CONTROLLER"]

Handler = Callable[[Addr, Frame, list[Any]], None]
Failed = Callable[[list[Addr], str], None]

# Error classes that mean "a peer process has failed" (ULFM).
_FAILED_CLASSES = {
    getattr(MPI, name)
    for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
    if hasattr(MPI, name)
}

# Raw buffers from this size on keep the sender polling tight until they are sent.
_BULK = 1 << 20

# MPI-3 counts are C ints: a raw buffer of 2 GiB or more travels in pieces of
# at most this many bytes (Open MPI 5 reports MPI 3.1, without MPI_Isend_c).
_PIECE = 1 << 30


def pieces(nbytes: int, piece: int = _PIECE) -> list[tuple[int, int]]:
    """The ``(start, stop)`` byte ranges a raw buffer of ``nbytes`` travels in, in order (one for most)."""
    if nbytes <= piece:
        return [(0, nbytes)]
    return [(start, min(start + piece, nbytes)) for start in range(0, nbytes, piece)]

_monotonic = time.monotonic

# How often a polling thread runs the router's every_ms hook.
_EVERY_MS = 1e-3

# Frames without out-of-band buffers share this (never mutated) list.
_NO_BUFFERS: list[Any] = []

# A frame sent this soon after the previous one to the same process, with no
# poll in between, joins a batch instead of leaving at once.
_BURST = 1e-3
# A batch leaves when it holds this many frames, even before a poll
# (MPIMESH_BATCH_FRAMES; 1: no batching).
_MAX_BATCH = settings.batch_frames

# Frames handled per poll before returning to the waiter loop, so that a flood
# of incoming messages cannot starve the waiter's own check.
_BATCH = 64


class _Out:
    """Frames waiting to leave for one process, and when it was last sent to.

    ``NativeRouter`` keeps a ``_native.Out`` instead, with the same members.
    """

    __slots__ = ("link", "rank", "last", "polls", "frames")

    def __init__(self, link: _Link, rank: int) -> None:
        self.link = link
        self.rank = rank
        self.last = 0.0
        # the router's poll count at the last send
        self.polls = -1
        self.frames: list[bytes] = []


class _Link:
    """One communicator this process polls and sends on."""

    __slots__ = ("comm", "handle", "island", "fixed", "outs")

    def __init__(self, comm: MPI.Comm, island: int, fixed: Addr | None) -> None:
        self.comm = comm
        self.handle: int = comm.handle
        self.island = island
        # A link whose remote group is the controller alone (a spawned
        # worker's parent intercommunicator) maps every source to it.
        self.fixed = fixed
        # rank -> frames waiting to leave for it (see Router._post)
        self.outs: dict[int, Any] = {}

    def source(self, rank: int) -> Addr:
        return self.fixed if self.fixed is not None else (self.island, rank)


class Router:
    """Sends frames to addresses and hands received frames to a handler, through mpi4py.

    Args:
        addr: this process's address.
        handlers: frame kind -> ``handler(src, frame, buffers)``, called for
            every frame, in arrival order, by the thread that polls.
        failed: called as ``failed(addrs, text)`` when MPI reports peers failed.
        broken: called with a traceback's text when a handler or a poll
            raised (the polling thread must survive it).
        names: frame kind -> its name, for those reports (else the number).
    """

    #: one destination's coalescing state: ``_out_type(link, rank)``
    _out_type: ClassVar[type[Any]] = _Out

    def __init__(
        self,
        addr: Addr,
        handlers: dict[int, Handler],
        failed: Failed | None = None,
        broken: Callable[[str], None] | None = None,
        *,
        names: Mapping[int, str] | None = None,
    ) -> None:
        self.addr = addr
        #: held for receiving and every MPI call other than a send
        self.lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._handlers = handlers
        self._failed = failed
        self._broken = broken
        self._names: Mapping[int, str] = names if names is not None else {}
        #: called about once per millisecond of polling (liveness, logs)
        self.every_ms: Callable[[], None] | None = None
        self._next_ms = 0.0
        self._heard: dict[Addr, float] | None = None
        self._heard_controller = time.monotonic()
        self._links: list[_Link] = []
        # island -> the link its ranks are addressed on directly
        self._routes: dict[int, _Link] = {}
        # how to reach the controller directly (spawned workers: the parent link)
        self._parent: _Link | None = None
        # the link to relay through for islands without a direct route
        self._relay: tuple[_Link, int] | None = None
        # processes of other islands reached on a direct link of their own (see adopt)
        self._peers: dict[Addr, _Link] = {}
        # direct links not polled yet: their peer's MARK has not come (see adopt)
        self._unpolled: dict[Addr, _Link] = {}
        # peers whose MARK came before their link was made here
        self._marked: set[Addr] = set()
        #: statistics: frames this process relayed for others (the controller's FORWARDs)
        self.relayed = 0
        # sends in flight: (request, the bytes it reads, whether it is bulk)
        self._sends: deque[tuple[MPI.Request, Any, bool]] = deque()
        # Large sends in flight: the answer to them comes soon, keep polling tight.
        self._bulk = 0
        self._local: deque[tuple[Addr, bytes, list[Any]]] = deque()
        # Pending one-sided operations of the data plane (see watch()).
        self._ticks: list[Callable[[], Callable[[], None] | None]] = []
        self._status = MPI.Status()
        # one entry per thread waiting in exclusive()
        self._wanted: list[None] = []
        self._frames_in = 0
        self._frames_out = 0
        #: statistics: BATCH messages sent (each carrying 2.._MAX_BATCH frames)
        self.batches_out = 0
        self._sent_at = 0.0
        # batches waiting to leave (each link keeps its processes' coalescing state)
        self._held: list[Any] = []
        self._polls = 0
        #: called when a frame is held back for a batch and none was (wake a poller)
        self.on_hold: Callable[[], None] | None = None
        self._ring: Callable[[Addr], None] | None = None

    # -- wiring ------------------------------------------------------------

    def add_island(self, comm: MPI.Comm, island: int) -> None:
        """Reach the ranks of ``island`` through ``comm`` (their rank = comm rank)."""
        link = _Link(comm, island, None)
        with self.lock:
            self._links = [*self._links, link]  # a new list: NativeRouter.poll reads a snapshot
            self._relink()
            self._routes[island] = link

    def add_parent(self, comm: MPI.Intercomm) -> None:
        """Reach the controller through a spawned worker's parent intercommunicator."""
        link = _Link(comm, 0, CONTROLLER)
        with self.lock:
            self._links = [*self._links, link]
            self._relink()
        self._parent = link
        self._relay = (link, 0)

    def _relink(self) -> None:
        # The links changed (lock held): NativeRouter tells its pump.
        pass

    def set_relay(self, island: int) -> None:
        """Relay frames for other islands through the controller, reached over ``island``'s link."""
        self._relay = (self._routes[island], 0)

    def remove_island(self, island: int) -> MPI.Comm | None:
        """Stop polling and routing to ``island``; returns its communicator."""
        with self.lock:
            link = self._routes.pop(island, None)
            if link is None:
                return None
            self._links = [k for k in self._links if k is not link]
            self._relink()
        with self._send_lock:
            # frames held for the island's processes go nowhere now
            for out in link.outs.values():
                out.frames.clear()
            link.outs.clear()
        return link.comm

    def controller_link(self) -> tuple[int, int] | None:
        """The handle of the communicator that reaches the controller directly, and its rank there.

        ``None`` in the controller itself.  A worker's native heartbeat
        (``_roles.worker.Heartbeat``) sends on it from a thread of its own.
        """
        if self.addr == CONTROLLER:
            return None
        link = self._routes.get(CONTROLLER[0])
        if link is not None:
            return link.handle, CONTROLLER[1]
        if self._parent is not None:
            return self._parent.handle, 0
        return None

    def islands(self) -> list[int]:
        """Islands with a direct route."""
        return list(self._routes)

    # -- direct links to processes of other islands (see .peers) -------------

    def adopt(self, peer: Addr, comm: MPI.Intercomm) -> None:
        """Send to ``peer`` over ``comm`` (a direct link) from now on; poll it once ``peer``'s MARK comes.

        Per-pair order survives the switch: the route changes first (a
        relayed frame is posted under the send lock only while there is no
        route, see ``_post``), then a ``MARK`` leaves on the relay path, after
        every frame relayed before it; ``peer`` polls the link only after the
        MARK (:meth:`marked`), and until then MPI holds what was sent on it.
        """
        link = _Link(comm, peer[0], peer)
        if self._relay is None:
            raise ConnectionError(f"no relay from process {self.addr} to process {peer} to switch links on")
        relay_link, relay_rank = self._relay
        note = pickle.dumps(forward(None, peer, pickle.dumps(mark(self.addr), protocol=5)), protocol=5)
        with self._send_lock:
            self._peers[peer] = link
        self._post(relay_link, relay_rank, note, _NO_BUFFERS)
        with self.lock:
            if peer in self._marked:
                self._marked.discard(peer)
                self._poll_link(link)
            else:
                self._unpolled[peer] = link

    def marked(self, peer: Addr) -> None:
        """``peer``'s MARK has come: what it sends next comes on its direct link; poll it."""
        with self.lock:
            link = self._unpolled.pop(peer, None)
            if link is None:
                self._marked.add(peer)
            else:
                self._poll_link(link)

    def _poll_link(self, link: _Link) -> None:
        # Start polling a direct link (lock held).
        self._links = [*self._links, link]
        self._relink()

    def drop_peer(self, peer: Addr) -> MPI.Comm | None:
        """Stop sending to and polling ``peer``'s direct link (it died or left); returns its communicator.

        Frames to ``peer`` go through the relay again.
        """
        with self._send_lock:
            link = self._peers.pop(peer, None)
            if link is not None:
                for out in link.outs.values():
                    out.frames.clear()
                link.outs.clear()
        with self.lock:
            self._marked.discard(peer)
            self._unpolled.pop(peer, None)
            if link is not None and link in self._links:
                self._links = [k for k in self._links if k is not link]
                self._relink()
        return None if link is None else link.comm

    def is_controller(self, comm: MPI.Intercomm) -> bool:
        """Whether the one remote process of ``comm`` (a link just accepted) is the controller."""
        if self._relay is None:
            return False
        relay, rank = self._relay
        theirs = relay.comm.Get_remote_group() if isinstance(relay.comm, MPI.Intercomm) else relay.comm.Get_group()
        remote = comm.Get_remote_group()
        try:
            return MPI.Group.Translate_ranks(remote, [0], theirs)[0] == rank
        finally:
            remote.Free()
            theirs.Free()

    def peers(self) -> list[Addr]:
        """Processes of other islands this process sends to on a direct link."""
        return list(self._peers)

    def relay(self, dest: Addr, data: bytes, buffers: Sequence[Any]) -> None:
        """Pass on a frame relayed for another process (the controller's FORWARD); counted in :attr:`relayed`."""
        self.relayed += 1
        self.send_raw(dest, data, buffers)

    # -- liveness bookkeeping and statistics ---------------------------------

    @property
    def heard(self) -> dict[Addr, float] | None:
        """Source -> when a frame from it last arrived, for the tracked sources.

        The controller's liveness sets it; ``None`` (workers): track the
        controller only, in :attr:`heard_controller`.
        """
        return self._heard

    @heard.setter
    def heard(self, heard: dict[Addr, float] | None) -> None:
        self._heard = heard

    @property
    def heard_controller(self) -> float:
        """When a frame from the controller last arrived (``time.monotonic``), while :attr:`heard` is None."""
        return self._heard_controller

    @heard_controller.setter
    def heard_controller(self, when: float) -> None:
        self._heard_controller = when

    @property
    def ring(self) -> Callable[[Addr], None] | None:
        """Rings a peer's doorbell (:mod:`.bell`) after a frame that follows a pause."""
        return self._ring

    @ring.setter
    def ring(self, ring: Callable[[Addr], None] | None) -> None:
        self._ring = ring

    @property
    def frames_in(self) -> int:
        """Frames received and dispatched (statistics)."""
        return self._frames_in

    @property
    def frames_out(self) -> int:
        """Frames sent, one per frame of a batch (statistics)."""
        return self._frames_out

    @property
    def sent_at(self) -> float:
        """When this process last sent a frame (``time.monotonic``)."""
        return self._sent_at

    @property
    def polls(self) -> int:
        """Polls made so far; one that stays put means the polling has stalled (a worker's heartbeat watches it)."""
        return self._polls

    # -- sending -----------------------------------------------------------

    def send(self, dest: Addr, frame: Frame, buffers: Sequence[Any] = ()) -> None:
        """Send ``frame`` (and raw ``buffers``) to ``dest``; returns at once."""
        if not buffers:
            link = self._routes.get(dest[0])
            if link is not None and dest != self.addr:
                self._post(link, dest[1], pickle.dumps(frame, protocol=5), _NO_BUFFERS)
                return
            link = self._peers.get(dest)
            if link is not None:
                self._post(link, 0, pickle.dumps(frame, protocol=5), _NO_BUFFERS)
                return
        else:
            # bufsizes with each large buffer's alignment (see buffers.layout)
            frame = (frame[0], layout(buffers), *frame[2:])
        self.send_raw(dest, pickle.dumps(frame, protocol=5), buffers)

    def link_of(self, dest: Addr) -> tuple[MPI.Comm, int] | None:
        """The communicator and rank that reach ``dest`` directly, or None (relayed, or no route).

        For messages of the caller's own tags (the data plane's pulls); frames go through :meth:`send`.
        """
        link = self._routes.get(dest[0])
        if link is not None and dest != self.addr:
            comm = link.comm
            size = comm.Get_remote_size() if isinstance(comm, MPI.Intercomm) else comm.Get_size()
            return (comm, dest[1]) if 0 <= dest[1] < size else None
        if dest == CONTROLLER and self._parent is not None:
            return self._parent.comm, 0
        peer = self._peers.get(dest)
        return (peer.comm, 0) if peer is not None else None

    def send_quiet(self, dest: Addr, frame: Frame) -> None:
        """Send a frame that need not wake its receiver (a heartbeat).

        It rings no doorbell and does not count as a send, neither as this
        process's last one (``sent_at``) nor as the last one to ``dest``, so
        the next frame after a pause still rings.  A sleeping receiver sees
        it at its next poll, at most ``MPIMESH_DEEP_SLEEP_US`` later.  A rung
        heartbeat would keep idle processes in their short naps
        (docs/design/transport.md, "Doorbells").
        """
        self.send_raw(dest, pickle.dumps(frame, protocol=5), quiet=True)

    def send_raw(self, dest: Addr, data: bytes, buffers: Sequence[Any] = (), *, quiet: bool = False) -> None:
        """Send an already pickled frame; ``quiet``: see :meth:`send_quiet`."""
        if dest == self.addr:
            # The receiver gets its own copy, as it would from another process.
            self._local.append((dest, data, [copy_buffer(b) for b in buffers]))
            return
        link = self._routes.get(dest[0])
        if link is not None:
            self._post(link, dest[1], data, buffers, quiet)
        elif dest == CONTROLLER and self._parent is not None:
            self._post(self._parent, 0, data, buffers, quiet)
        elif dest in self._peers:
            self._post(self._peers[dest], 0, data, buffers, quiet)
        elif self._relay is not None:
            relay = pickle.dumps(forward(layout(buffers) or None, dest, data), protocol=5)
            if not self._post(self._relay[0], self._relay[1], relay, buffers, quiet, dest):
                # switched to a direct link meanwhile: the MARK has left, so must this
                peer = self._peers.get(dest)
                if peer is None:
                    raise ConnectionError(f"no route from process {self.addr} to process {dest}: its link is gone")
                self._post(peer, 0, data, buffers, quiet)
        else:
            raise ConnectionError(f"no route from process {self.addr} to process {dest}: its island is gone")

    def _post(self, link: _Link, rank: int, data: bytes, buffers: Sequence[Any], quiet: bool = False,
              unless: Addr | None = None) -> bool:
        # Send or hold one frame; False (nothing sent) when ``unless`` has a
        # direct link by the time the send lock is held (a relayed frame must
        # not follow its sender's MARK, see adopt).
        now = _monotonic()
        lock = self._send_lock
        lock.acquire()  # not `with`: cheaper on every frame (docs/design/transport.md, "The locks")
        try:
            if unless is not None and unless in self._peers:
                return False
            self._frames_out += 1
            if not quiet:
                self._sent_at = now
            out = link.outs.get(rank)
            if out is None:
                out = link.outs.setdefault(rank, self._out_type(link, rank))
            if (out.frames or (out.polls == self._polls and now - out.last < _BURST)) and self._hold(
                out, data, buffers, now
            ):
                return True
            if quiet:
                paused = False
            else:
                paused = now - out.last > RING_AFTER
                out.last = now
                out.polls = self._polls
            if buffers:
                self._start_with_buffers(link.comm, rank, data, buffers)
            else:
                self._start(link, rank, data)
            if paused and self._ring is not None:
                self._ring(link.source(rank))
            if self._sends:
                self._reap()
        except MPI.Exception as exc:
            self._send_failed(link, rank, exc)
        finally:
            lock.release()
        return True

    def _send_failed(self, link: _Link, rank: int, exc: MPI.Exception) -> None:
        # A send found its peer failed: ConnectionError, except on a direct
        # link to another island, whose frame is dropped as a relayed one
        # would be, and the failure reported as a failed probe's is: the
        # controller's report of the death (pid, host, cause) fails what
        # waits on the peer, as it did before the switch.
        if exc.Get_error_class() not in _FAILED_CLASSES:
            raise exc
        peer = link.fixed
        if peer is not None and peer != CONTROLLER and self._failed is not None:
            self._failed([peer], exc.Get_error_string())
            return
        raise ConnectionError(f"process {link.source(rank)} has failed: {exc.Get_error_string()}") from None

    def _hold(self, out: Any, data: bytes, buffers: Sequence[Any], now: float) -> bool:
        # A frame in a burst to one process (send lock held): hold it for a
        # batch and return True, or send what is held and return False.
        if out.frames:
            if not buffers:
                out.last = now
                out.frames.append(data)
                if len(out.frames) >= _MAX_BATCH:
                    self._release(out)
                return True
            self._release(out)  # frames leave in order
            return False
        if buffers or _MAX_BATCH <= 1:
            return False
        out.last = now
        out.frames.append(data)
        self._held.append(out)
        if self.on_hold is not None:
            self.on_hold()
        return True

    def _start(self, link: _Link, rank: int, data: bytes) -> None:
        # Send one pickled frame (send lock held); a send that does not
        # complete at once (most small ones do: eager protocol) is kept with
        # its bytes until MPI is done with them.
        req = link.comm.Isend(data, rank, TAG_FRAME)
        if not req.Test():
            self._sends.append((req, data, False))

    def _start_with_buffers(self, comm: MPI.Comm, rank: int, data: bytes, buffers: Sequence[Any]) -> None:
        # A frame and its raw buffers, posted together (send lock held), so
        # that the buffers are the next messages from this process on TAG_DATA.
        sends = self._sends
        sends.append((comm.Isend(data, rank, TAG_FRAME), data, False))
        for buf in buffers:
            view = memoryview(buf).cast("B")
            bulk = view.nbytes >= _BULK
            for start, stop in pieces(view.nbytes):
                self._bulk += bulk
                sends.append((comm.Isend([view[start:stop], MPI.BYTE], rank, TAG_DATA), buf, bulk))

    def _release(self, out: Any) -> None:
        # Send the frames held for one process as one message (send lock held).
        frames = out.frames
        out.frames = []
        if len(frames) == 1:
            data = frames[0]
        else:
            data = pickle.dumps(batch(frames), protocol=5)
            self.batches_out += 1
        self._start(out.link, out.rank, data)

    def flush(self) -> None:
        """Send every batch held back; a failed peer's batch is dropped (liveness reports it)."""
        if not self._held:
            return
        with self._send_lock:
            held, self._held = self._held, []
            for out in held:
                if not out.frames:
                    continue
                try:
                    self._release(out)
                except MPI.Exception as exc:
                    if exc.Get_error_class() not in _FAILED_CLASSES:
                        raise

    def _in_flight(self) -> int:
        # Sends not yet complete (read without the send lock: a hint, except under it).
        return len(self._sends)

    def drain(self, bound: float) -> bool:
        """Wait until every send posted so far has completed, at most ``bound`` seconds; whether they have.

        A send completes only inside MPI calls of this process, and the first
        frame on a new TCP link (a direct link to another island) needs
        several: one posted just before a blocking call that does not drive
        it (``MPI_Comm_disconnect``) would wait for that call to return.
        """
        end = _monotonic() + bound
        while True:
            with self._send_lock:
                self._reap()
                if not self._in_flight():
                    return True
            if _monotonic() >= end:
                return False
            time.sleep(1e-4)

    def _reap(self) -> None:
        # Drop the completed sends at the front (send lock held).
        sends = self._sends
        while sends:
            try:
                if not sends[0][0].Test():
                    return
            except MPI.Exception as exc:
                if exc.Get_error_class() not in _FAILED_CLASSES:
                    raise
            self._bulk -= sends.popleft()[2]

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold :attr:`lock` for an MPI call other than a send (a window, a spawn).

        A poller that spins in MPI (``NativeRouter.poll``) holds the lock for
        its whole spin and takes it again at once: while somebody waits here,
        it stops polling.
        """
        self._wanted.append(None)
        try:
            with self.lock:
                yield
        finally:
            self._wanted.pop()

    def watch(self, tick: Callable[[], Callable[[], None] | None]) -> None:
        """Call ``tick()`` under the lock on every poll until it returns a function.

        The data plane's non-blocking window operations test their requests
        this way; the returned function (which settles a future) runs after
        the lock is released.
        """
        with self.lock:
            self._ticks.append(tick)

    def pending_sends(self) -> int:
        """Sends not yet complete (batches held back are sent first)."""
        self.flush()
        with self._send_lock:
            self._reap()
            return self._in_flight()

    # -- receiving ---------------------------------------------------------

    def poll(self, spin: float = 0.0) -> int:
        """Receive what has arrived and dispatch it; returns the number of frames.

        Heartbeats are not counted: they must not keep an idle process out of
        its back-off.  An exception (an MPI error the router does not know,
        a bug) is reported through ``broken`` and counts as nothing received.

        Args:
            spin: how long the caller would have this call keep probing for a
                frame; only ``NativeRouter`` spins (inside MPI, the GIL
                released), this path probes each link once.
        """
        try:
            return self._poll()
        except Exception:
            self._report()
            return 0

    def _report(self) -> None:
        if self._broken is None:
            raise
        self._broken(traceback.format_exc())

    def _poll(self) -> int:
        self._polls += 1
        if self._held:
            self.flush()
        got: list[tuple[Addr, Frame, list[Any]]] = []
        failures: list[tuple[list[Addr], str]] | None = None
        settle: list[Callable[[], None]] | None = None
        if self._local:
            local = self._local
            while local and len(got) < _BATCH:
                here, payload, carried = local.popleft()
                got.append((here, pickle.loads(payload), carried))
        if self._in_flight() and self._send_lock.acquire(blocking=False):
            # Free completed sends; a thread that is sending does it itself.
            try:
                self._reap()
            finally:
                self._send_lock.release()
        status = self._status
        with self.lock:
            if self._ticks:
                settle = []
                self._tick(settle)
            for link in self._links:
                comm = link.comm
                while len(got) < _BATCH:
                    try:
                        msg = comm.improbe(MPI.ANY_SOURCE, TAG_FRAME, status)
                        if msg is None:
                            # Open MPI often matches a message only at the
                            # probe after the one whose progress pulled it
                            # in: a second probe saves a poll round per leg
                            # (docs/design/transport.md, "Receiving").
                            msg = comm.improbe(MPI.ANY_SOURCE, TAG_FRAME, status)
                    except MPI.Exception as exc:
                        if exc.Get_error_class() not in _FAILED_CLASSES:
                            raise
                        if failures is None:
                            failures = []
                        failures.append(self._acknowledge(link, exc))
                        break
                    if msg is None:
                        break
                    src = status.Get_source()
                    # mpi4py receives and unpickles in one call, cheaper
                    # than Recv into a bytearray, then loads.
                    self._take(got, link.source(src), comm, src, msg.recv())
        if settle:
            for fn in settle:
                fn()
        if failures and self._failed is not None:
            for addrs, text in failures:
                self._failed(addrs, text)
        now = time.monotonic()
        if now >= self._next_ms:
            self._every_ms(now)
        if not got:
            # A pending one-sided operation or large send counts as traffic:
            # keep polling tight until it completes (both ends of an emulated
            # RMA need it; the reply to a large call follows its last byte).
            return 1 if self._ticks or self._bulk else 0
        return self._deliver(got, now)

    def _every_ms(self, now: float) -> None:
        self._next_ms = now + _EVERY_MS
        if self.every_ms is not None:
            self.every_ms()

    def _deliver(self, got: list[tuple[Addr, Frame, list[Any]]], now: float) -> int:
        # Hand frames to their handlers; returns how many count as traffic.
        handlers = self._handlers
        heard = self._heard
        quiet = 0
        for source, frame, buffers in got:
            if heard is not None:
                if source in heard:
                    heard[source] = now
            elif source == CONTROLLER:
                self.heard_controller = now
            kind = frame[0]
            if kind == PING:
                quiet += 1
            try:
                handlers[kind](source, frame, buffers)
            except Exception:
                # A handler bug must not kill the polling thread (and with
                # it the process): report it and keep serving.
                if self._broken is None:
                    raise
                self._broken(f"error handling {self._names.get(kind, kind)} from {source}:\n{traceback.format_exc()}")
        self._frames_in += len(got)
        return len(got) - quiet

    def _take(self, got: list[tuple[Addr, Frame, list[Any]]], source: Addr, comm: MPI.Comm, src: int,
              frame: Frame) -> None:
        # One received frame into got: its raw buffers follow it on TAG_DATA;
        # a BATCH holds several frames.
        if frame[1]:
            got.append((source, frame, self._recv_buffers(comm, src, frame[1])))
        elif frame[0] == BATCH:
            got.extend([(source, pickle.loads(data), _NO_BUFFERS) for data in frame[2]])
        else:
            got.append((source, frame, _NO_BUFFERS))

    @staticmethod
    def _recv_buffers(comm: MPI.Comm, src: int, sizes: tuple[Any, ...]) -> list[Any]:
        # The raw buffers were posted right after the frame.
        buffers = []
        for size in sizes:
            # an int, or (size, offset) for a large buffer
            buf = recv_buffer(size) if type(size) is int else recv_buffer(*size)
            view = memoryview(buf).cast("B")
            for start, stop in pieces(view.nbytes):
                comm.Recv([view[start:stop], MPI.BYTE], src, TAG_DATA)
            buffers.append(buf)
        return buffers

    def _tick(self, settle: list[Callable[[], None]]) -> None:
        keep = []
        for tick in self._ticks:
            done = tick()
            if done is None:
                keep.append(tick)
            else:
                settle.append(done)
        self._ticks = keep

    def _acknowledge(self, link: _Link, exc: MPI.Exception) -> tuple[list[Addr], str]:
        # ULFM: a peer died.  Acknowledge it so that wildcard receives work
        # again for the survivors, and say who it was.
        comm = link.comm
        text = exc.Get_error_string()
        try:
            comm.Ack_failed()
            group = comm.Get_failed()
            try:
                local = comm.Get_remote_group() if isinstance(comm, MPI.Intercomm) else comm.Get_group()
                ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), local)
            finally:
                group.Free()
        except (MPI.Exception, NotImplementedError, AttributeError):
            return [], text
        return [link.source(r) for r in ranks if r is not None and r >= 0], text
