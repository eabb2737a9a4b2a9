"""Replies up the tree: each process of a cast's tree sends its subtree's replies as one message.

A ``call()`` cast down a tree (``_core.multicast``) opens a :class:`Relay`
port in every process it reaches.  The process's own actor answers into its
relay; each child's relay answers into its parent's; once a relay has its
own reply and one message from each child (or the child's death), it sends
everything it holds to its parent as one ``REPLY`` of status ``MANY``: a
list of ``(index, status, body, buffer count, address)`` items and their
raw buffers, one after the other.  The caller's port unpacks the items
(``ports.unpack``), so its receiver sees one reply per actor, as from direct
calls, and the caller receives at most one message per child.

A relay that dies loses its subtree's replies.  The caller, told of the
death, casts the call again to that subtree with replies sent straight to
it (``_core.multicast``); a process that has run the call already answers
the resend from its relay, which keeps its own reply for :data:`KEEP`
seconds (:meth:`Relay.redirect`), and reports the reply lost after that.

Runs.  Replies of plain data (``Status.VALUE``, no raw buffers) whose ranks
follow one another travel as one *run* ``(first rank, [values])`` instead of
an item each: a subtree covers consecutive ranks of the view, so a relay
joins its own reply and its children's runs into one, and the caller takes
a whole subtree's values with one slice assignment (``ports.Gather``).  The
caller's work per call then hardly grows with the number of actors.

A relay of a fold (``_core.folds``) sends one partial value instead of the
replies: its subtree's replies combined as they arrive.
"""

from __future__ import annotations

import threading
import time
from operator import itemgetter
from typing import Any, Protocol

from . import protocol
from .folds import Fold, Partial
from .ports import PortTable, Receiver, unpack
from .protocol import Frame, PortRef, Status

__all__ = ["KEEP", "MANY", "Relay", "compact", "lost"]

Addr = tuple[int, int]
#: One reply as a relay passes it on: ``(index, status, body, buffer count, address)``,
#: or a run of plain values of consecutive ranks, ``(first rank, [values])``.
Item = tuple[int, int, Any, int, Addr] | tuple[int, list[Any]]

_VALUE = Status.VALUE
_first = itemgetter(0)

_reply = protocol.reply

#: REPLY status of a relay's message: the body is a list of items.
MANY = Status.MANY
#: Seconds a relay keeps its own process's reply, to answer a resend.
KEEP = 60.0


class _Sender(Protocol):
    def send(self, dest: Addr, frame: Frame, buffers: list[Any] = ...) -> None: ...


class Runtime(Protocol):
    """What a relay needs of its process's runtime (``_core.runtime.Runtime``)."""

    addr: Addr
    host: str
    dead: dict[Addr, str]
    ports: PortTable

    @property
    def router(self) -> _Sender: ...

    def reply(self, port: PortRef, index: int, status: int, value: Any) -> None: ...


class Relay(Receiver):
    """The replies of one process's subtree of a cast, on their way to the parent.

    It waits for its own process's reply and one message from each child
    that the cast reached, given by :meth:`arm` once the cast is forwarded
    (until then it sends nothing up): a child found dead while forwarding
    is not waited for, its parts' first processes are.

    Args:
        rt: this process's runtime.
        what: what it gathers, for errors.
        parent: the port the subtree's replies go to (the parent's relay, or the caller's port).
        fold: combine the replies into one partial on the way (None: pass them on).
    """

    __slots__ = ("rt", "what", "pending", "parent", "items", "buffers", "own", "direct", "opened", "pid", "done",
                 "partial", "armed", "heard", "lock")

    def __init__(self, rt: Runtime, what: str, parent: PortRef, fold: Fold | None = None) -> None:
        self.rt = rt
        self.what = what
        # its own reply (from this process) and, once armed, one message per child
        self.pending: set[Addr] = {rt.addr}
        self.parent = parent
        self.items: list[Item] = []
        self.buffers: list[Any] = []
        self.own: tuple[Item, list[Any]] | None = None
        #: where a resend asked this process's own reply to go as well
        self.direct: PortRef | None = None
        self.opened = time.monotonic()
        self.pid = 0
        self.done = False
        self.partial = None if fold is None else Partial(fold, what.partition(" ")[0], rt.host)
        self.armed = False
        #: who was heard from before the relay was armed
        self.heard: set[Addr] = set()
        self.lock = threading.Lock()

    def arm(self, children: list[Addr]) -> None:
        """The cast reached ``children``: wait for one message from each (not from one known dead)."""
        with self.lock:
            self.pending.update(a for a in children if a not in self.heard)
            self.armed = True
        # A child declared dead before it was added above was never failed here
        # (``PortTable.fail_source`` looks in ``pending``): drop it now.
        dead = self.rt.dead
        with self.lock:
            self.pending.difference_update([a for a in children if a in dead])
        if self._settle(None):
            self.rt.ports.close(self.pid)

    def deliver(self, index: int, status: int, body: Any, buffers: list[Any], src: Addr) -> bool:
        """This process's actor answered: its reply joins the subtree's."""
        item = (index, status, body, len(buffers), src)
        with self.lock:
            self.own = (item, buffers)
            if self.partial is not None:
                self.partial.add(item, buffers)
            else:
                self.items.append(item)
                self.buffers.extend(buffers)
        if self.direct is not None:
            self._send_own(self.direct)
        return self._settle(src)

    def deliver_many(self, src: Addr, body: list[Item], buffers: list[Any]) -> bool:
        """A child's message: its subtree's replies (or their partial)."""
        with self.lock:
            partial = self.partial
            if partial is not None:
                for item, parts in unpack(body, buffers):
                    partial.add(item, parts)
            else:
                self.items.extend(body)
                self.buffers.extend(buffers)
        return self._settle(src)

    def fail(self, addr: Addr, report: str) -> bool:
        """A child died: its subtree answers the caller directly (the caller resends to it)."""
        return self._settle(addr)

    def disown(self) -> None:
        """This process runs the call from another copy of the cast (a resend): send the children's replies alone.

        The copy delivered answers the caller straight away, or through the
        relay of the copy that came first; this one waits only for its children.
        """
        if self._settle(self.rt.addr):
            self.rt.ports.close(self.pid)

    def _settle(self, src: Addr | None) -> bool:
        with self.lock:
            if src is not None:
                self.pending.discard(src)
                if not self.armed:
                    self.heard.add(src)
            if self.pending or self.done or not self.armed:
                return False
            self.done = True
            if self.partial is not None:
                item, parts = self.partial.item(self.rt.addr)
                self.items, self.buffers = [item], parts
                self.partial = None
            items, buffers = compact(self.items), self.buffers
            self.items, self.buffers = [], []
        frame = _reply(tuple(memoryview(b).nbytes for b in buffers) or None, self.parent[1], -1, MANY, items)
        self._send(self.parent[0], frame, buffers)
        return True

    def redirect(self, port: PortRef) -> None:
        """A resend: this process's own reply goes to ``port`` too (now if it is in, else when it comes)."""
        self.direct = port
        if self.own is not None:
            self._send_own(port)

    def _send_own(self, port: PortRef) -> None:
        (item, buffers) = self.own  # type: ignore[misc]
        frame = _reply(tuple(b.nbytes for b in buffers) or None, port[1], -1, MANY, [item])
        self._send(port[0], frame, buffers)

    def _send(self, dest: Addr, frame: Frame, buffers: list[Any]) -> None:
        if dest in self.rt.dead:
            return
        try:
            self.rt.router.send(dest, frame, buffers)
        except ConnectionError:
            pass  # the parent died: the caller resends to this subtree


def compact(items: list[Item]) -> list[Item]:
    """``items`` with every plain value (``Status.VALUE``) joined into runs of consecutive ranks.

    The other items keep their order, and so their raw buffers' (only they
    have any), and come first.  A run stays a run; runs that meet are joined
    (the first run's list grows: the lists are this relay's own).
    """
    runs: list[tuple[int, list[Any]]] = []
    others: list[Item] = []
    for item in items:
        if len(item) == 2:
            runs.append(item)
        elif item[1] == _VALUE:
            runs.append((item[0], [item[2]]))
        else:
            others.append(item)
    if len(runs) < 2:
        return others + runs
    runs.sort(key=_first)
    start, values = runs[0]
    end = start + len(values)
    joined: list[Item] = [(start, values)]
    for first, more in runs[1:]:
        if first == end:
            values.extend(more)
        else:
            values = list(more)
            joined.append((first, values))
        end = first + len(more)
    return others + joined


def lost(rt: Runtime, port: PortRef, index: int, what: str) -> None:
    """Answer a resend whose reply this process no longer keeps: the reply is reported lost."""
    report = (f"the reply of {what}() at rank {index} was lost with the process that relayed it "
              f"(kept {KEEP:g} s); call again")
    rt.reply(port, index, Status.FAILED, report)

