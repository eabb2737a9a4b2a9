"""Casts down a tree, the caller's side: a call to N actors leaves the caller as at most k messages.

A cast to a view of ``N >= MPIMESH_CAST_TREE_MIN`` actors is one ``CAST``
frame per child of the caller, not N ``CALL`` frames.  A ``CAST`` carries the
call once and the list of the ``(rank, address, sequence)`` entries of its
subtree; the first entry is the receiver's own.  The receiver forwards the
rest, split into at most ``MPIMESH_CAST_FANOUT`` contiguous parts, each to
its first entry, then hands its own call to its actor.  A subtree stays in one
island (processes of one ``MPI_Comm_spawn``, or the launch world): a process
forwards only to processes it reaches directly.  Replies go straight to the
caller's port, as for a direct call, or up the tree (``_core.relays``).
This module is the caller's side (:class:`Multicast`: the entries' tables,
the numbering, the cast and its log); a receiver's side, forwarding and
delivery in order, is ``_core.forwarder``; the tree's shape, ``_core.trees``.

Order.  Messages from one process to another keep the order they were sent
in, whatever path they take.  Once a process has cast to a destination
through a tree, every actor message it sends there (casts, calls, stops)
carries a per-pair sequence number: a cast's in its entry, a direct frame in
a ``SEQ`` envelope.  Every actor-bound frame (a call, a spawn, a stop) leaves
through one path, :meth:`Multicast.post`, which numbers it when it must be.
The destination delivers them in sequence order and holds any that arrive
early (``_core.forwarder``).  A message sent straight to a destination before
the first cast that reached it through a tree carries no number: it left the
sender before the cast did, so it arrives first unless the direct link stalls
for longer than the cast's two hops.

Faults.  A forwarder that finds a child dead skips it and forwards the
child's part itself.  A forwarder that dies holding a cast is found by the
caller when the controller's ``DEAD`` notice arrives: the caller sends its
logged casts again to the dead forwarder's subtree (receivers drop what they
already delivered, by sequence number).  A process can get a call both up
its tree and from the resend, in either order: it runs the first copy to
arrive, and the relay of the other copy answers its parent with its
children's replies alone.  A call's cast stays logged until all
its replies are in; a broadcast's for ``_RETAIN`` seconds, its buffers only
while the log holds less than ``_RETAIN_BYTES``: one resent without its
buffers is lost for that subtree, which the caller reports, and its sequence
numbers are skipped so that later messages still arrive.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ..config import settings
from . import protocol
from .entries import Entries, Entry, Table
from .logs import warn
from .protocol import CAST_FANOUT, CAST_GATHER, CAST_METHOD, CAST_REPLY_PORT, Frame, Key, PortRef
from .trees import RESEND, plan, send_subtree, split

if TYPE_CHECKING:
    import numpy as np

    from .ports import Receiver
    from .runtime import Runtime

__all__ = ["Multicast", "Statistics"]

Addr = tuple[int, int]

#: Seconds a broadcast's cast stays logged for a resend: more than it takes to
#: declare a forwarder dead that hung or died holding it (heartbeats).
_RETAIN = 2 * settings.heartbeat_timeout + 5.0
#: Bytes of broadcast buffers the log keeps; older broadcasts keep only their tree.
_RETAIN_BYTES = 1 << 30

#: Casts with at least this many bytes of raw buffers go down a binary tree in PART frames ...
STREAM_MIN = 8 << 20
#: ... of this many bytes each.
PIECE = 4 << 20


class _Logged(NamedTuple):
    """A cast as its caller sent it, kept to resend it around a dead forwarder."""

    frame: Frame
    buffers: list[Any]
    nbytes: int
    #: its destinations
    addrs: Sequence[Addr]
    #: the subtrees the caller sent, packed (``_core.entries``; their first entries are its children)
    wires: list[bytes]
    #: the replies' receiver (a call), or None (a broadcast)
    waiting: Receiver | None
    sent: float


_new_logged = tuple.__new__


class Statistics(NamedTuple):
    """Counters of one process's multicast state (see :meth:`Multicast.statistics`)."""

    casts_sent: int
    casts_forwarded: int
    held: int
    resent: int
    lost: int


class Multicast:
    """The tree casts of one process as their caller, and the one path of its actor-bound frames (:meth:`post`)."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        # the runtime's router, never replaced: one lookup less on every post
        self._router = runtime.router
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        #: destination -> its place in ``_last``, the last sequence number sent there (0: none yet)
        self._slots: dict[Addr, int] = {}
        self._last: np.ndarray[Any, Any] | None = None
        #: whether any destination has had a cast down a tree from here (then direct frames are numbered)
        self.enrolled = False
        self._log: deque[_Logged] = deque()
        # the log's length at which it is pruned next (amortized: a pass per doubling)
        self._next_prune = 64
        self._casts_sent = self._resent = self._lost = 0
        #: (id of a view's address list, fan-out, dead count) -> (that list, its entries' table)
        self._tables: dict[tuple[int, int, int], tuple[Sequence[Addr], Table]] = {}

    # --- caller -------------------------------------------------------------------------------------

    def cast(
        self, key: Key, method: str, payload: Any, sizes: tuple[int, ...] | None, buffers: list[Any],
        port: PortRef | None, ranks: Sequence[int], addrs: Sequence[Addr], labels: tuple[str, ...],
        extent: tuple[int, ...], waiting: Receiver | None, gather: int | bytes, whole: bool = False,
    ) -> list[tuple[Addr, str]]:
        """Send one call to the actors at ``addrs`` (ranks ``ranks`` of the view) down a tree.

        ``whole``: ``addrs`` is the view's own list of addresses, kept by its
        ``MeshRef`` for every call to the whole view, and ``ranks`` is
        ``range(len(addrs))``: the entries' layout is reused (``_table``).

        ``gather``: ``GATHER``: the replies come up the tree
        (``_core.relays``), at most one message per child of this process;
        a pickled fold: they are folded on the way (``_core.folds``);
        ``DIRECT``: each comes straight here.

        Returns:
            The ``(address, report)`` of each child that could not be reached
            and whose subtree could not be reached either (its part of the
            wait is failed by the caller).
        """
        rt = self.rt
        dead = rt.dead
        nbytes = sum(memoryview(b).nbytes for b in buffers) if buffers else 0
        # A large argument goes down a binary tree in pieces: each process
        # forwards a piece while the next arrives (pipelined chains).
        streamed = nbytes >= STREAM_MIN
        fanout = 2 if streamed else settings.cast_fanout
        me = rt.addr
        frame = protocol.cast(sizes, me, key, method, payload, port, labels, extent, fanout, gather, None, b"")
        root = 2 if streamed else settings.cast_root_fanout
        with self._lock:
            cached = self._tables.get((id(addrs), root, len(dead))) if whole else None
            table = cached[1] if cached is not None and cached[0] is addrs else self._table(
                ranks, addrs, whole, root, dead)
            assert self._last is not None
            wires = table.number(self._last)
            self.enrolled = True
            # tuple.__new__: the NamedTuple's own __new__ is a Python call, on every cast
            self._log.append(_new_logged(_Logged, (frame, buffers, nbytes, addrs, wires, waiting,
                                                   time.monotonic())))
            self._casts_sent += 1
            if len(self._log) >= self._next_prune:
                self._prune()
        failed = [(addr, dead[addr]) for addr in addrs if addr in dead] if dead else []
        if not streamed:
            send = rt.router.send
            subtree = protocol.subtree
            for child, wire in zip(table.heads, wires, strict=True):
                report = dead.get(child) if dead else None
                if report is None:
                    try:
                        send(child, subtree(frame, wire), buffers)
                        continue
                    except ConnectionError as exc:
                        report = str(exc)
                # around the child
                failed.extend(send_subtree(rt, frame, Entries(wire), buffers, unreachable=report))
            return failed
        cid = next(self._ids)
        stream = (cid, tuple(memoryview(b).nbytes for b in buffers))
        frame = protocol.cast(None, me, key, method, payload, port, labels, extent, fanout, gather, stream, b"")
        children: list[Addr] = []
        for wire in wires:
            failed.extend(send_subtree(rt, frame, Entries(wire), [], children))
        self._stream(me, cid, buffers, children)
        return failed

    def _table(self, ranks: Sequence[int], addrs: Sequence[Addr], whole: bool, fanout: int,
               dead: dict[Addr, str]) -> Table:
        """Under the lock: the entries' layout of a cast to ``addrs``, and its subtrees (``plan``) as positions.

        A view's tree changes only with the fan-out and the dead, so the
        table of the whole of one view (its list of addresses, kept by its
        ``MeshRef``) is kept, keyed ``(id(addrs), fanout, len(dead))``: a
        call to it finds it in ``cast`` and numbers its destinations with a
        few array operations (``Table.number``).
        """
        key = (id(addrs), fanout, len(dead))
        places = [(i, addr, 0) for i, addr in enumerate(addrs) if addr not in dead]
        parts: list[slice | list[int]] = []
        for part in plan(places, fanout):
            idx = [e[0] for e in part]
            parts.append(slice(idx[0], idx[-1] + 1) if idx[-1] - idx[0] + 1 == len(idx) else idx)
        table = Table(ranks, addrs, [self._slot(addr) for addr in addrs], parts)
        if whole:
            if len(self._tables) >= 64:
                self._tables.clear()
            self._tables[key] = (addrs, table)
        return table

    def _slot(self, addr: Addr) -> int:
        # Under the lock: addr's place in the array of last sequence numbers.
        slot = self._slots.get(addr)
        if slot is not None:
            return slot
        import numpy as np

        slot = self._slots[addr] = len(self._slots)
        last = self._last
        if last is None:
            self._last = np.zeros(64, dtype=np.int64)
        elif slot >= len(last):
            grown = np.zeros(2 * len(last), dtype=np.int64)
            grown[:len(last)] = last
            self._last = grown
        return slot

    def _stream(self, sender: Addr, cid: int, buffers: list[Any], children: list[Addr]) -> None:
        """Send cast ``cid``'s raw buffers to ``children`` in PART frames of at most ``PIECE`` bytes."""
        send = self.rt.router.send
        for index, buf in enumerate(buffers):
            view = memoryview(buf).cast("B")
            for offset in range(0, view.nbytes, PIECE):
                piece = view[offset:offset + PIECE]
                frame = protocol.part((piece.nbytes,), sender, cid, index, offset)
                for child in children:
                    try:
                        send(child, frame, [piece])
                    except ConnectionError:
                        pass  # a child that died: the caller resends to its subtree

    def post(self, addr: Addr, frame: Frame, buffers: list[Any] | tuple[Any, ...] = ()) -> None:
        """Send an actor-bound ``frame`` (a CALL, SITE_CALL, SPAWN or STOP) to ``addr``, in order with the casts.

        Once a cast down a tree has reached ``addr`` from here, the frame goes
        numbered, in a ``SEQ`` envelope, so that ``addr`` delivers it after
        the casts sent before it, whatever their path.

        Raises:
            ConnectionError: ``addr`` cannot be reached.
        """
        if self.enrolled:
            frame = self._numbered(addr, frame)
        self._router.send(addr, frame, buffers)

    def _numbered(self, addr: Addr, frame: Frame) -> Frame:
        # `frame` as it must travel to `addr`: in a SEQ envelope once a cast reached addr through a tree.
        with self._lock:
            slot = self._slots.get(addr)
            if slot is None:
                return frame
            assert self._last is not None
            number = int(self._last[slot]) + 1
            if number == 1:
                return frame  # no cast down a tree has reached addr yet
            self._last[slot] = number
        return protocol.sequenced(self.rt.addr, number, frame)

    def dead(self, addr: Addr) -> None:
        """``addr`` has died: resend the logged casts it was to forward; the forwarder forgets what it sent here."""
        self.rt.forwarder.dead(addr)
        with self._lock:
            self._prune()
            logged = list(self._log)
        for cast in logged:
            for wire in cast.wires:
                lost = _below(Entries(wire), addr, cast.frame[CAST_FANOUT])
                if lost:
                    self._resend(cast, lost)

    def _resend(self, cast: _Logged, entries: Sequence[Entry]) -> None:
        dead = self.rt.dead
        alive = [e for e in entries if e[1] not in dead]
        if not alive:
            return
        if cast.buffers or cast.nbytes == 0 or cast.waiting is not None:
            self._resent += 1
            frame = cast.frame
            if frame[CAST_GATHER]:
                # their relays may be gone with the dead one: answers come straight back
                frame = protocol.cast_again(frame, frame[CAST_REPLY_PORT], RESEND)
            for subtree in plan(alive, frame[CAST_FANOUT]):
                send_subtree(self.rt, frame, subtree, cast.buffers)
            return
        # A broadcast whose buffers the log dropped: skip its numbers, say so.
        self._lost += 1
        method = cast.frame[CAST_METHOD]
        ranks = sorted(e[0] for e in alive)
        warn(f"a broadcast of {method}() to ranks {ranks} was lost with the process that was to relay it")
        for _, addr, number in alive:
            try:
                self.rt.router.send(addr, protocol.seq(None, self.rt.addr, number, None))
            except ConnectionError:
                pass

    def _prune(self) -> None:
        # Under the lock: drop calls answered, and broadcasts past _RETAIN or
        # known delivered: a destination delivers in order, so its answer to
        # a later call means it had every earlier cast.  Broadcasts beyond
        # the byte budget keep their tree, not their buffers.
        log = self._log
        horizon = time.monotonic() - _RETAIN
        kept: deque[_Logged] = deque()
        answered: set[Addr] = set()
        # the address lists already in `answered`: calls to one view share one list
        counted: set[int] = set()
        total = 0
        for cast in reversed(log):
            if cast.waiting is not None:
                if cast.waiting.owes():
                    kept.appendleft(cast)
                elif id(cast.addrs) not in counted:
                    counted.add(id(cast.addrs))
                    answered.update(cast.addrs)
                continue
            if cast.sent < horizon or answered.issuperset(cast.addrs):
                continue
            if cast.buffers and total + cast.nbytes > _RETAIN_BYTES:
                cast = cast._replace(buffers=[])
            if cast.buffers:
                total += cast.nbytes
            kept.appendleft(cast)
        self._log = kept
        self._next_prune = 2 * len(kept) + 64

    def statistics(self) -> Statistics:
        """Counters: casts sent, forwarded, frames held for order, casts resent, broadcasts lost."""
        forwarding = self.rt.forwarder.statistics()
        return Statistics(self._casts_sent, forwarding.casts_forwarded, forwarding.held, self._resent, self._lost)


def _below(subtree: Sequence[Entry], addr: Addr, fanout: int) -> Sequence[Entry]:
    """The entries that ``addr`` was to forward to in ``subtree`` (empty if it forwards nothing there)."""
    while subtree:
        if subtree[0][1] == addr:
            return subtree[1:]
        rest = subtree[1:]
        for part in split(rest, fanout):
            if any(e[1] == addr for e in part):
                subtree = part
                break
        else:
            return ()
    return ()

