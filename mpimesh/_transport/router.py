"""Routing: which link, and which rank on it, takes a frame to an address.

A process is addressed as ``(island, rank)``.  Island 0 is the launch world
(the controller is ``(0, 0)``); island ``k > 0`` is the world of the ``k``-th
set of processes created with ``MPI_Comm_spawn``.  A process talks directly to
the processes of its own island and to the controller; anything else is
relayed by the controller (a ``FORWARD`` frame), which keeps one path per pair
of processes and so keeps MPI's per-pair ordering.  Once two processes of
different islands have exchanged a frame, the controller brokers a direct
link between them (:mod:`.peers`) and both switch to it after a ``MARK`` on
the relay path (:meth:`Router.adopt`), so their order survives the switch.

:class:`Router` decides where a frame goes and hands it to its wire
(:mod:`.wire`), which makes the MPI calls: the mpi4py wire or the native one,
picked once per process by :func:`mpimesh._transport.make_router`.  What the
router does not route (receiving, batching, the locks, statistics) is its
wire's: the router's methods for those are the wire's own, bound once, and
its properties read and set the wire's fields.  The figures behind these
choices are in docs/design/transport.md.
"""

from __future__ import annotations

import contextlib
import pickle
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from .buffers import layout
from .frames import CONTROLLER, Addr, Frame, forward, mark
from .links import NO_BUFFERS, Link
from .mpi import MPI, keep_alone
from .wire import Wire

__all__ = ["Addr", "Router", "CONTROLLER"]


class Router:
    """Sends frames to addresses over its wire's links, and keeps the routes.

    Args:
        addr: this process's address.
        wire: the wire that makes the MPI calls (see :func:`mpimesh._transport.make_router`).
    """

    def __init__(self, addr: Addr, wire: Wire) -> None:
        self.addr = addr
        #: the wire: receiving, sending, batching, statistics
        self.wire = wire
        #: held for receiving and every MPI call other than a send (the wire's)
        self.lock = wire.lock
        self._send_lock = wire.send_lock
        # The wire's I/O, bound once: nothing between the caller and the wire.
        self.poll = wire.poll
        self.flush = wire.flush
        self.drain = wire.drain
        self.pending_sends = wire.pending_sends
        self.exclusive = wire.exclusive
        self.watch = wire.watch
        self._send = wire.send
        self._post = wire.post
        # island -> the link its ranks are addressed on directly
        self._routes: dict[int, Link] = {}
        # how to reach the controller directly (spawned workers: the parent link)
        self._parent: Link | None = None
        # the link to relay through for islands without a direct route
        self._relay: tuple[Link, int] | None = None
        # processes of other islands reached on a direct link of their own (see
        # adopt); changed under the send lock (a relayed frame checks it there)
        self._peers: dict[Addr, Link] = {}
        # direct links not polled yet: their peer's MARK has not come (see adopt)
        self._unpolled: dict[Addr, Link] = {}
        # peers whose MARK came before their link was made here
        self._marked: set[Addr] = set()
        #: statistics: frames this process relayed for others (the controller's FORWARDs)
        self.relayed = 0
        keep_alone(self)

    # -- islands and the relay ---------------------------------------------

    def add_island(self, comm: MPI.Comm, island: int) -> None:
        """Reach the ranks of ``island`` through ``comm`` (their rank = comm rank)."""
        link = Link(comm, island, None)
        with self.lock:
            self.wire.add_link(link)
            self._routes[island] = link

    def add_parent(self, comm: MPI.Intercomm) -> None:
        """Reach the controller through a spawned worker's parent intercommunicator."""
        link = Link(comm, 0, CONTROLLER)
        with self.lock:
            self.wire.add_link(link)
        self._parent = link
        self._relay = (link, 0)

    def set_relay(self, island: int) -> None:
        """Relay frames for other islands through the controller, reached over ``island``'s link."""
        self._relay = (self._routes[island], 0)

    def remove_island(self, island: int) -> MPI.Comm | None:
        """Stop polling and routing to ``island``; returns its communicator."""
        with self.lock:
            link = self._routes.pop(island, None)
            if link is None:
                return None
            self.wire.remove_link(link)
        self.wire.forget(link)  # frames held for the island's processes go nowhere now
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
        route, see ``send_raw``), then a ``MARK`` leaves on the relay path, after
        every frame relayed before it; ``peer`` polls the link only after the
        MARK (:meth:`marked`), and until then MPI holds what was sent on it.
        """
        link = Link(comm, peer[0], peer)
        if self._relay is None:
            raise ConnectionError(f"no relay from process {self.addr} to process {peer} to switch links on")
        relay_link, relay_rank = self._relay
        note = pickle.dumps(forward(None, peer, pickle.dumps(mark(self.addr), protocol=5)), protocol=5)
        with self._send_lock:
            self._peers[peer] = link
        self._post(relay_link, relay_rank, note, NO_BUFFERS)
        with self.lock:
            if peer in self._marked:
                self._marked.discard(peer)
                self.wire.add_link(link)
            else:
                self._unpolled[peer] = link

    def marked(self, peer: Addr) -> None:
        """``peer``'s MARK has come: what it sends next comes on its direct link; poll it."""
        with self.lock:
            link = self._unpolled.pop(peer, None)
            if link is None:
                self._marked.add(peer)
            else:
                self.wire.add_link(link)

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        """Hold both of the wire's locks: no other thread of the runtime makes an MPI call meanwhile.

        For :func:`.mpi.alone` (a communicator made where Open MPI 5 does
        not survive another thread's progress).  The receiving lock first,
        as the pollers take them.
        """
        with self.exclusive(), self._send_lock:
            yield

    def drop_peer(self, peer: Addr) -> MPI.Comm | None:
        """Stop sending to and polling ``peer``'s direct link (it died or left); returns its communicator.

        Frames to ``peer`` go through the relay again.
        """
        with self._send_lock:
            link = self._peers.pop(peer, None)
        if link is not None:
            self.wire.forget(link)
        with self.lock:
            self._marked.discard(peer)
            self._unpolled.pop(peer, None)
            if link is not None:
                self.wire.remove_link(link)
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

    # -- the wire's hooks and statistics --------------------------------------

    @property
    def heard(self) -> dict[Addr, float] | None:
        """Source -> when a frame from it last arrived, for the tracked sources.

        The controller's liveness sets it; ``None`` (workers): track the
        controller only, in :attr:`heard_controller`.
        """
        return self.wire.heard

    @heard.setter
    def heard(self, heard: dict[Addr, float] | None) -> None:
        self.wire.heard = heard

    @property
    def heard_controller(self) -> float:
        """When a frame from the controller last arrived (``time.monotonic``), while :attr:`heard` is None."""
        return self.wire.heard_controller

    @heard_controller.setter
    def heard_controller(self, when: float) -> None:
        self.wire.heard_controller = when

    @property
    def ring(self) -> Callable[[Addr], None] | None:
        """Rings a peer's doorbell (:mod:`.bell`) after a frame that follows a pause."""
        return self.wire.ring

    @ring.setter
    def ring(self, ring: Callable[[Addr], None] | None) -> None:
        self.wire.ring = ring

    @property
    def every_ms(self) -> Callable[[], None] | None:
        """Called about once per millisecond of polling (liveness, logs)."""
        return self.wire.every_ms

    @every_ms.setter
    def every_ms(self, every_ms: Callable[[], None] | None) -> None:
        self.wire.every_ms = every_ms

    @property
    def on_hold(self) -> Callable[[], None] | None:
        """Called when a frame is held back for a batch and none was (wake a poller)."""
        return self.wire.on_hold

    @on_hold.setter
    def on_hold(self, on_hold: Callable[[], None] | None) -> None:
        self.wire.on_hold = on_hold

    @property
    def frames_in(self) -> int:
        """Frames received and dispatched (statistics)."""
        return self.wire.frames_in

    @property
    def frames_out(self) -> int:
        """Frames sent, one per frame of a batch (statistics)."""
        return self.wire.frames_out

    @property
    def batches_out(self) -> int:
        """BATCH messages sent, each carrying several frames (statistics)."""
        return self.wire.batches_out

    @property
    def sent_at(self) -> float:
        """When this process last sent a frame (``time.monotonic``)."""
        return self.wire.sent_at

    @property
    def polls(self) -> int:
        """Polls made so far; one that stays put means the polling has stalled (a worker's heartbeat watches it)."""
        return self.wire.polls

    # -- sending -----------------------------------------------------------

    def send(self, dest: Addr, frame: Frame, buffers: Sequence[Any] = ()) -> None:
        """Send ``frame`` (and raw ``buffers``) to ``dest``; returns at once."""
        if not buffers:
            link = self._routes.get(dest[0])
            rank = dest[1]
            if link is None and self._peers:
                # a direct link to a process of another island (see adopt)
                link = self._peers.get(dest)
                rank = 0
            if link is not None and dest != self.addr:
                self._send(link, rank, frame)
                return
        else:
            # bufsizes with each large buffer's alignment (see buffers.layout)
            frame = (frame[0], layout(buffers), *frame[2:])
        self.send_raw(dest, pickle.dumps(frame, protocol=5), buffers)

    def direct(self, dest: Addr) -> tuple[dict[int, Link], Link] | None:
        """The island routes and the link :meth:`send` takes to ``dest`` for a frame without buffers, or None.

        None unless ``dest`` is on an island with a route (not this process, a
        peer's direct link or the relay).  A sender that keeps the link
        (``_core.calls``' call sites) may use it while ``routes[dest[0]] is link``.
        """
        link = self._routes.get(dest[0])
        if link is None or dest == self.addr:
            return None
        return self._routes, link

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
            self.wire.loop_back(data, buffers)
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
            if not self._post(self._relay[0], self._relay[1], relay, buffers, quiet, lambda: dest in self._peers):
                # switched to a direct link meanwhile: the MARK has left, so must this
                peer = self._peers.get(dest)
                if peer is None:
                    raise ConnectionError(f"no route from process {self.addr} to process {dest}: its link is gone")
                self._post(peer, 0, data, buffers, quiet)
        else:
            raise ConnectionError(f"no route from process {self.addr} to process {dest}: its island is gone")

