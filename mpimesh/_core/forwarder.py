"""Casts down a tree, a receiver's side: forward the subtree, deliver in the sender's order.

A process that a ``CAST`` reaches (see ``_core.multicast`` for the caller's
side and the scheme) forwards the rest of its entries, split into at most
the cast's fan-out parts, each to its first entry, and hands its own call to
its actor.  A child found dead is skipped and its part forwarded around it
(``trees.send_subtree``).  When the replies are gathered up the tree,
the call goes on with a :class:`~.relays.Relay` of this process as its
reply port.  A large argument follows the cast in ``PART`` frames, each
forwarded as it comes (:meth:`Forwarder.on_part`).

Order.  Every actor message from a sender that casts here through trees is
numbered (a cast in its entry, a direct frame in a ``SEQ`` envelope); they
are handed to the actors in number order, and one that arrives early is held
until its turn.  A number delivered or held already keeps its first copy: a
cast can come twice, up its tree and resent around a dead forwarder, in
either order; the relay of the copy not delivered answers its parent with
its children's replies alone (:meth:`~.relays.Relay.disown`).  A resend
(``trees.RESEND``) of a call already run is answered from the relay that
ran it (:meth:`~.relays.Relay.redirect`), or reported lost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

from .._transport.buffers import copy_buffer, recv_buffer
from . import protocol
from .entries import Entries
from .folds import Fold
from .protocol import KIND, Frame
from .relays import KEEP, Relay, lost
from .relays import Runtime as _RelayRuntime
from .trees import GATHER, RESEND, send_subtree, split

__all__ = ["Forwarder", "ForwarderRuntime", "Statistics"]

Addr = tuple[int, int]


class ForwarderRuntime(_RelayRuntime, Protocol):
    """What forwarding needs of its process's runtime (``_core.runtime.Runtime``): a relay's, and the dispatch."""

    #: kind -> handler, for the frames this forwarder delivers
    dispatch: dict[int, Callable[[Addr, Frame, list[Any]], None]]


class _Incoming:
    """A cast whose raw buffers arrive in PART frames, on its way to this process's actor."""

    __slots__ = ("children", "buffers", "left", "call", "number", "relay", "opened")

    def __init__(self, children: list[Addr], buffers: list[Any], left: int, call: Frame, number: int,
                 relay: Relay | None) -> None:
        self.children = children
        self.buffers = buffers
        self.left = left
        self.call = call
        self.number = number
        self.relay = relay
        self.opened = time.monotonic()


class Statistics(NamedTuple):
    """Counters of one process's forwarding (see :meth:`Forwarder.statistics`)."""

    casts_forwarded: int
    held: int


class Forwarder:
    """The casts that reach one process: forwarded down its subtree, delivered in order."""

    def __init__(self, runtime: ForwarderRuntime) -> None:
        self.rt = runtime
        self._lock = threading.Lock()
        # held while frames are handed on in order: two polling threads must
        # not hand on one sender's frames side by side
        self._deliver = threading.RLock()
        #: sender -> the next sequence number to deliver from it
        self._expected: dict[Addr, int] = {}
        #: sender -> sequence number -> (frame to deliver, buffers, the relay its reply goes to), held until its turn
        self._held: dict[Addr, dict[int, tuple[Frame | None, list[Any], Relay | None]]] = {}
        self._forwarded = 0
        #: (sender, sequence number) -> the relay of that cast here, kept relays.KEEP seconds
        self._relays: dict[tuple[Addr, int], Relay] = {}
        self._next_relay_prune = 64
        #: (sender, cast id) -> a cast whose raw buffers are arriving in PART frames
        self._incoming: dict[tuple[Addr, int], _Incoming] = {}
        self._next_incoming_prune = 64
        self._folds: dict[bytes, Fold] = {}

    # --- forwarding ---------------------------------------------------------------------------------

    def on_cast(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """CAST: forward the subtree's parts, then deliver this process's call in its sender's order."""
        _, sizes, sender, key, method, payload, port, labels, extent, fanout, gather, stream, wire = frame
        rt = self.rt
        entries = Entries(wire)
        rank, _, number = entries[0]
        rest = entries[1:]
        parts = split(rest, fanout) if rest else []
        relay: Relay | None = None
        if (gather == GATHER or type(gather) is bytes) and port is not None:
            # this subtree's replies meet here: the actor's and one message per child reached
            fold = None if gather == GATHER else self._fold(gather)
            relay = Relay(rt, f"{method} relay", port, fold)
            relay.pid = rt.ports.open(relay)
            port = (rt.addr, relay.pid)
            frame = protocol.cast_again(frame, port, gather)
            with self._lock:
                self._relays[sender, number] = relay
                if len(self._relays) >= self._next_relay_prune:
                    self._prune_relays()
        elif gather == RESEND:
            with self._lock:
                earlier = self._relays.get((sender, number))
                delivered = number < self._expected.get(sender, 1)
            if earlier is not None:
                earlier.redirect(port)
            elif delivered:
                lost(rt, port, rank, method)
        # the processes this one sends to: the first of each part, or, around
        # a dead one, the first of each of its parts (``send_subtree``)
        children: list[Addr] = []
        if stream is not None:
            # the raw buffers follow in PART frames: forward each as it comes
            cid, sizes = stream
            for part in parts:
                send_subtree(rt, frame, part, [], children)
            self._forwarded += bool(parts)
            if relay is not None:
                relay.arm(children)
            call = protocol.call(sizes, key, method, payload, port, (rank, labels, extent))
            incoming = _Incoming(children, [recv_buffer(n) for n in sizes], sum(sizes), call, number, relay)
            with self._lock:
                self._incoming[sender, cid] = incoming
                if len(self._incoming) >= self._next_incoming_prune:
                    self._prune_incoming()
            return
        mine = buffers
        if parts:
            self._forwarded += 1
            for part in parts:
                send_subtree(rt, frame, part, buffers, children)
            if buffers:
                # the children's sends still read these: the actor gets its own
                mine = [copy_buffer(b) for b in buffers]
        if relay is not None:
            relay.arm(children)
        call = protocol.call(sizes, key, method, payload, port, (rank, labels, extent))
        self._in_order(sender, number, call, mine, relay)

    def _fold(self, wire: bytes) -> Fold:
        # the folds of recent casts, unpickled once each (a training loop reduces with the same few)
        fold = self._folds.get(wire)
        if fold is None:
            if len(self._folds) >= 16:
                self._folds.clear()
            fold = self._folds[wire] = Fold.load(wire)
        return fold

    def on_part(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """PART: forward a piece of a cast's raw buffer, copy it into place; the last one delivers the call."""
        _, _, sender, cid, index, offset = frame
        key = (sender, cid)
        incoming = self._incoming.get(key)
        if incoming is None:
            return  # a cast given up (its sender or a forwarder died)
        piece = buffers[0]
        send = self.rt.router.send
        for child in incoming.children:
            try:
                send(child, frame, buffers)
            except ConnectionError:
                pass  # a child that died: the caller resends to its subtree
        n = memoryview(piece).nbytes
        if n:
            memoryview(incoming.buffers[index]).cast("B")[offset:offset + n] = memoryview(piece).cast("B")
        incoming.left -= n
        if incoming.left <= 0:
            with self._lock:
                self._incoming.pop(key, None)
            self._in_order(sender, incoming.number, incoming.call, incoming.buffers, incoming.relay)

    def _prune_incoming(self) -> None:
        # Under the lock: forget streams older than relays.KEEP (their sender or a forwarder died).
        horizon = time.monotonic() - KEEP
        self._incoming = {k: i for k, i in self._incoming.items() if i.opened >= horizon}
        self._next_incoming_prune = 2 * len(self._incoming) + 64

    def _prune_relays(self) -> None:
        # Under the lock: forget relays older than relays.KEEP.
        horizon = time.monotonic() - KEEP
        self._relays = {k: r for k, r in self._relays.items() if r.opened >= horizon}
        self._next_relay_prune = 2 * len(self._relays) + 64

    # --- delivery in order --------------------------------------------------------------------------

    def on_seq(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """SEQ: a direct frame from a sender that casts here through trees; delivered in its order."""
        _, _, sender, number, inner = frame
        self._in_order(sender, number, inner, buffers)

    def _in_order(self, sender: Addr, number: int, frame: Frame | None, buffers: list[Any],
                  relay: Relay | None = None) -> None:
        # Hand on `frame` if it is the next from `sender`, with the held ones
        # that follow it; else hold it.  None: a number skipped (a lost broadcast).
        # A number delivered or held already keeps its first copy (see the
        # module's docstring); the `relay` of the copy not delivered gets no
        # reply from this process: it sends on its children's replies alone.
        with self._deliver:
            with self._lock:
                expected = self._expected.get(sender, 1)
                held = self._held.setdefault(sender, {})
                if number < expected or number in held:
                    duplicate = True
                elif number > expected:
                    held[number] = (frame, buffers, relay)
                    return
                else:
                    duplicate = False
                    ready = [(frame, buffers)]
                    expected += 1
                    while expected in held:
                        item, bufs, _ = held.pop(expected)
                        ready.append((item, bufs))
                        expected += 1
                    self._expected[sender] = expected
            if duplicate:
                if relay is not None:
                    relay.disown()
                return
            dispatch = self.rt.dispatch
            for item, bufs in ready:
                if item is not None:
                    dispatch[item[KIND]](sender, item, bufs)

    def dead(self, addr: Addr) -> None:
        """``addr`` has died: forget what it sent here (nothing more comes from it)."""
        with self._lock:
            self._held.pop(addr, None)
            self._expected.pop(addr, None)

    def statistics(self) -> Statistics:
        """Counters: casts forwarded, frames held for order."""
        with self._lock:
            held = sum(len(h) for h in self._held.values())
        return Statistics(self._forwarded, held)
