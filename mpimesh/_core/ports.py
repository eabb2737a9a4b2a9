"""Reply ports: where answers land in the process that asked.

A port is ``(address, port id)``; the id indexes this process's
:class:`PortTable`.  Each open port has a receiver that turns arriving REPLY
frames into future results: one reply (``call_one``, ``choose``), one per
point gathered into a ValueMesh (``call``), one future per reply in arrival
order (``stream``), or a queue (``Channel``).  Receivers also record which
processes still owe them an answer, so that a failed process can fail exactly
the waits that depend on it.

:class:`Port` and :class:`PortReceiver` are the public faces of a port
(re-exported by ``mpimesh.channel``): value types that actors create and
receive as well as the controller script, so they live here, below the
public modules.
"""

from __future__ import annotations

import itertools
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Generic, Protocol, TypeVar

from ..errors import ActorError, MeshInternalError, RemoteException, SupervisionError
from ..future import Future
from ..shape import Shape
from . import serialize as _serialize
from .protocol import Frame, PortRef, Status

__all__ = ["PortTable", "Receiver", "OneReply", "Gather", "Stream", "Queue", "decode", "Port", "PortReceiver"]

Addr = tuple[int, int]
R = TypeVar("R")

_VALUE = Status.VALUE
_MANY = Status.MANY
# concurrent.futures' name of the state of a future nobody settled or cancelled
_PENDING = "PENDING"


def decode(status: int, body: Any, buffers: list[Any], what: str) -> Any:
    """Turn a REPLY body into a value, or raise what it carries."""
    if status == _VALUE:
        return body
    if status == Status.OK:
        try:
            return _serialize.loads(body, buffers)
        except Exception as exc:
            raise ActorError(
                RemoteException(type(exc).__name__, f"cannot unpickle the result of {what}: {exc}"),
                header=f"### result of {what}",
            ) from None
    if status == Status.ERROR:
        raise _serialize.raise_payload(_serialize.loads(body))
    raise SupervisionError(str(body), endpoint=what)


def unpack(body: list[Any], buffers: list[Any]) -> list[tuple[Any, list[Any]]]:
    """A ``Status.MANY`` reply's items ``(index, status, body, buffer count, address)``, each with its buffers.

    A run of plain values ``(first index, [values])`` (``relays.compact``)
    becomes an item per value, with no address.
    """
    out: list[tuple[Any, list[Any]]] = []
    at = 0
    for item in body:
        if len(item) == 2:
            first, values = item
            out.extend(((first + i, _VALUE, value, 0, None), []) for i, value in enumerate(values))
            continue
        n = item[3]
        out.append((item, buffers[at:at + n]))
        at += n
    return out


class Receiver:
    """Something waiting for replies on a port."""

    what: str
    #: processes that still owe a reply (for failure propagation); each
    #: receiver removes the ones that answered or failed
    pending: set[Addr] | tuple[Addr]
    #: how the replies of a cast down a tree travel to it (``_core.multicast``):
    #: 0 each straight here, 1 gathered up the tree, bytes: folded on the way (``_core.folds``)
    gather: int | bytes = 0
    #: the called actors' class (``module.Class``) when known, for error texts (Monarch's ``The actor Class mesh``)
    actor: str = ""

    def owes(self) -> bool:
        """Whether some process still owes a reply."""
        return bool(self.pending)

    def deliver(self, index: int, status: int, body: Any, buffers: list[Any], src: Addr) -> bool:
        """Take one reply; return True when the port can close."""
        raise NotImplementedError

    def fail(self, addr: Addr, report: str) -> bool:
        """``addr`` will never answer (``report`` says why); return True when the port can close."""
        raise NotImplementedError

    def error(self, report: str, where: str = "") -> SupervisionError:
        """The SupervisionError a waiter on this port gets."""
        return SupervisionError(gone(self.what, where, report, self.actor), endpoint=self.what)


def point_text(shape: Shape, rank: int) -> str:
    # the rank as Monarch prints a point: {'gpus': 1/2}; nothing for a mesh of no dimension
    return str(shape.point(rank)) if shape.labels else ""


def gone(what: str, where: str, cause: str, actor: str = "") -> str:
    """What a call to a failed actor raises: Monarch's phrases, which its users match on, then the cause.

    ``what``: ``mesh.method``; ``where``: the actor's point (``{'gpus': 1/2}``);
    ``actor``: its class, when known.
    """
    mesh = what.rpartition(".")[0] or what
    who = f"{actor} {mesh}{where}" if actor else f"{mesh}{where}"
    return f"Endpoint call {what}() failed, The actor {who} and all its descendants have failed: {cause}"


def _settle(fut: Future[Any], fn: Callable[[], Any]) -> None:
    if fut.done():
        return
    try:
        value = fn()
    except BaseException as exc:  # every failure goes to the waiter
        fut.set_exception(exc)
    else:
        fut.set_result(value)


class _Info:
    """An attribute of a OneReply that a native call site made: an item of its ``_info`` tuple.

    ``CallSite.call`` (native/call.c) sets one attribute, ``_info`` (the
    name, what, pending, shape, rank and actor that ``__init__`` would set
    one by one, shared by the calls of one endpoint object), where six
    attribute sets cost more than the rest of making the future.  A
    non-data descriptor: what ``__init__`` sets hides it.
    """

    def __init__(self, index: int) -> None:
        self.index = index

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        info = obj._info
        if info is None:
            raise AttributeError(f"{type(obj).__name__!r} object has no attribute {self.name!r}")
        return info[self.index]


class OneReply(Future[Any], Receiver):
    """A future that exactly one reply settles: its own receiver.

    Args:
        name: the future's name in its repr (``"mesh.method.call_one()"``).
        what: the endpoint or request, for error messages.
        source: the process that will answer.
        shape, rank: the mesh and rank called, to say where a failure happened.
    """

    # A native call site's future (native/call.c) has only ``_info``; these read it.
    _info: tuple[str, str, tuple[Addr], Shape | None, int, str] | None = None
    _what = _Info(0)
    what = _Info(1)
    pending = _Info(2)
    shape = _Info(3)
    rank = _Info(4)
    actor = _Info(5)

    def __init__(self, name: str, what: str, source: Addr, shape: Shape | None = None, rank: int = 0) -> None:
        self._what = name  # Future's own name (see Future.__init__)
        self.what = what
        # never changes: the port closes at the one reply or failure
        self.pending = (source,)
        self.shape = shape
        self.rank = rank

    def deliver(self, index: int, status: int, body: Any, buffers: list[Any], src: Addr) -> bool:
        if status == _VALUE:
            if self._state == _PENDING:
                self.set_result(body)
            return True
        _settle(self, lambda: decode(status, body, buffers, self.what))
        return True

    def fail(self, addr: Addr, report: str) -> bool:
        if not self.done():
            where = point_text(self.shape, self.rank) if self.shape is not None else ""
            self.set_exception(self.error(report, where))
        return True


class Gather(Receiver):
    """One reply per point, gathered into a ValueMesh (or ``None`` for acks).

    When every point has answered, the future gets the ValueMesh, or the
    exception of the lowest failing rank (Monarch's rule).
    """

    gather = 1

    def __init__(
        self, future: Future[Any], what: str, shape: Shape, sources: Iterable[Addr], *, values: bool = True
    ) -> None:
        self.future = future
        self.what = what
        self.shape = shape
        self.n = len(shape)
        self.results: list[Any] = [None] * self.n
        self.errors: dict[int, BaseException] = {}
        self.count = 0
        self.values = values
        # point i's process; not copied: callers hand over lists they no longer change
        self._sources = sources if type(sources) is list else list(sources)
        #: per point: 1 once it has answered or failed
        self.seen = bytearray(self.n)

    @property
    def pending(self) -> set[Addr]:  # type: ignore[override]
        """The processes of the points that have neither answered nor failed (made on demand: deaths, pruning)."""
        seen = self.seen
        return {source for index, source in enumerate(self._sources) if not seen[index]}

    def owes(self) -> bool:
        return self.count < self.n

    def skip(self, indices: Iterable[int]) -> None:
        """Points that will not answer this time, taken as answered ``None`` (a heal re-creates some actors only)."""
        for index in indices:
            if not self.seen[index]:
                self.seen[index] = 1
                self.count += 1

    def deliver(self, index: int, status: int, body: Any, buffers: list[Any], src: Addr) -> bool:
        if self.seen[index]:
            return False  # twice: once up a cast's tree, once from a resend (``relays``)
        self.seen[index] = 1
        self._take(index, status, body, buffers)
        if self.count >= self.n:
            self._finish()
            return True
        return False

    def deliver_many(self, src: Addr, body: list[Any], buffers: list[Any]) -> bool:
        """A relay's message: the replies of a subtree, taken in one pass (``relays``).

        A run of plain values of consecutive points (``relays.compact``) is
        taken whole: one slice of the results, one of the points seen.
        """
        seen = self.seen
        at = 0
        for item in body:
            if len(item) == 2:
                if self._take_run(*item):
                    continue
                # some of them came already (a resend): one at a time
                first, values = item
                items = [(first + i, _VALUE, value, 0, None) for i, value in enumerate(values)]
            else:
                items = [item]
            for index, status, one, n, _ in items:
                parts = buffers[at:at + n] if n else []
                at += n
                if seen[index]:
                    continue  # twice: once up a cast's tree, once from a resend
                seen[index] = 1
                self._take(index, status, one, parts)
        if self.count >= self.n:
            self._finish()
            return True
        return False

    def _take_run(self, first: int, values: list[Any]) -> bool:
        # Points first.. answered with plain values: taken whole unless one of them was seen already.
        end = first + len(values)
        if end > self.n or self.seen.find(1, first, end) >= 0:
            return False
        self.seen[first:end] = b"\x01" * len(values)
        self.results[first:end] = values
        self.count += len(values)
        return True

    def _take(self, index: int, status: int, one: Any, parts: list[Any]) -> None:
        # Point `index`'s reply, not seen before.
        if status == _VALUE:
            self.results[index] = one
        else:
            try:
                self.results[index] = decode(status, one, parts, self.what)
            except BaseException as exc:
                self.errors[index] = exc
        self.count += 1

    def fail(self, addr: Addr, report: str) -> bool:
        seen = self.seen
        for index, source in enumerate(self._sources):
            if source == addr and not seen[index]:
                seen[index] = 1
                self.errors[index] = self.error(report, point_text(self.shape, index))
                self.count += 1
        if self.count >= self.n:
            self._finish()
            return True
        return False

    def _finish(self) -> None:
        if self.future.done():
            return
        if self.errors:
            self.future.set_exception(self.errors[min(self.errors)])
            return
        if not self.values:
            self.future.set_result(None)
            return
        from ..value_mesh import ValueMesh

        # the results are this receiver's own, in the order of its (dense) shape: no copy
        self.future.set_result(ValueMesh._view(self.shape.dense(), self.results))


class Stream(Receiver):
    """One future per reply, in arrival order."""

    def __init__(
        self, futures: list[Future[Any]], what: str, sources: Iterable[Addr], shape: Shape | None = None
    ) -> None:
        self.futures = futures
        self.what = what
        self.next = 0
        self._sources = list(sources)
        self.pending: set[Addr] = set(self._sources)
        self.shape = shape

    def deliver(self, index: int, status: int, body: Any, buffers: list[Any], src: Addr) -> bool:
        self.pending.discard(src)
        fut = self.futures[self.next]
        self.next += 1
        _settle(fut, lambda: decode(status, body, buffers, self.what))
        return self.next >= len(self.futures)

    def fail(self, addr: Addr, report: str) -> bool:
        self.pending.discard(addr)
        fut = self.futures[self.next]
        self.next += 1
        where = ""
        if self.shape is not None and addr in self._sources:
            where = point_text(self.shape, self._sources.index(addr))
        fut.set_exception(self.error(report, where))
        return self.next >= len(self.futures)


class Queue(Receiver):
    """Values sent to a Channel port, received in order with ``recv()``."""

    def __init__(self, what: str, *, once: bool = False, ranked: bool = False) -> None:
        self.what = what
        self.once = once
        self.ranked = ranked
        self.pending = set()
        self._lock = threading.Lock()
        self._items: deque[tuple[int, int, Any, list[Any]]] = deque()
        self._waiters: deque[Future[Any]] = deque()
        self.closed = False

    def _settle(self, fut: Future[Any], index: int, status: int, body: Any, buffers: list[Any]) -> None:
        if self.ranked:
            _settle(fut, lambda: (index, decode(status, body, buffers, self.what)))
        else:
            _settle(fut, lambda: decode(status, body, buffers, self.what))

    def deliver(self, index: int, status: int, body: Any, buffers: list[Any], src: Addr) -> bool:
        with self._lock:
            waiter = self._waiters.popleft() if self._waiters else None
            if waiter is None:
                self._items.append((index, status, body, buffers))
        if waiter is not None:
            self._settle(waiter, index, status, body, buffers)
        return self.once

    def fail(self, addr: Addr, report: str) -> bool:
        return False

    def recv(self) -> Future[Any]:
        fut: Future[Any] = Future(f"{self.what}.recv()")
        with self._lock:
            item = self._items.popleft() if self._items else None
            if item is None:
                self._waiters.append(fut)
        if item is not None:
            self._settle(fut, *item)
        return fut


class PortTable:
    """This process's open ports."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._open: dict[int, Receiver] = {}
        #: The REPLY frame handler (see ``protocol.reply``): :meth:`take_reply`, or with the
        #: native wire its C front (``_native.Replies``, native/call.c), which settles a plain
        #: value for a :class:`OneReply` nobody sleeps on itself and hands it the rest.
        self.on_reply: Callable[[Addr, Frame, list[Any]], None] = _native_replies(self) or self.take_reply

    def table(self) -> tuple[dict[int, Receiver], Iterator[int]]:
        """The open ports by id and the id counter, for a sender that opens ports in C (``_native.CallSite``)."""
        return self._open, self._ids

    def open(self, receiver: Receiver) -> int:
        """Register ``receiver``; returns its port id."""
        # No lock: next() on a count and a dict store are atomic under the
        # GIL, and fail_source() iterates over a snapshot.
        pid = next(self._ids)
        self._open[pid] = receiver
        return pid

    def close(self, pid: int) -> None:
        """Forget a port (late replies to it are dropped)."""
        self._open.pop(pid, None)

    def take_reply(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """The REPLY frame handler in Python (see ``protocol.reply``, and :attr:`on_reply`).

        A reply to a closed port (a late one, after a failure) is dropped.
        """
        _, _, pid, index, status, body = frame
        receiver = self._open.get(pid)
        if receiver is None:
            return
        if status == _MANY:
            # a relay's message: the replies of a subtree of a cast (``relays``)
            many = getattr(receiver, "deliver_many", None)
            if many is not None:
                done = many(src, body, buffers)
            else:
                done = False
                for (i, st, one, _, source), parts in unpack(body, buffers):
                    if receiver.deliver(i, st, one, parts, source):
                        done = True
                        break
        else:
            done = receiver.deliver(index, status, body, buffers, src)
        if done:
            self._open.pop(pid, None)

    def fail_source(self, addr: Addr, report: str) -> int:
        """Fail every wait that still expects a reply from ``addr``; returns how many."""
        victims = [(pid, r) for pid, r in list(self._open.items()) if addr in r.pending]
        for pid, receiver in victims:
            if receiver.fail(addr, report):
                self.close(pid)
        return len(victims)

    def __len__(self) -> int:
        return len(self._open)


def _native_replies(table: PortTable) -> Callable[[Addr, Frame, list[Any]], None] | None:
    # The C REPLY handler, where the native wire is in use (bound by make_router, before the
    # runtime makes its PortTable) and the native part has it.
    from .._transport import native

    if native.why_not:
        return None
    from .. import _native
    from .. import future as _future

    if not hasattr(_native, "Replies"):
        return None
    replies: Callable[[Addr, Frame, list[Any]], None] = _native.Replies(
        table._open, table.take_reply, _future._lazy_lock, OneReply, _VALUE, _future._FINISHED
    )
    return replies


# --- the public faces of a port -------------------------------------------------------------------


class _Replier(Protocol):
    """What a :class:`Port` needs of this process's runtime."""

    @property
    def host(self) -> str: ...

    def reply(self, port: PortRef, index: int, status: int, value: Any) -> None: ...


# This process's runtime (``_core.current.current``), set by set_runtime_lookup
# when a runtime is installed.  The runtime imports this module, so this module
# cannot import it back; a Port, which may have arrived in a message, finds the
# runtime through this.
_current: Callable[[], _Replier] | None = None


def set_runtime_lookup(current: Callable[[], _Replier]) -> None:
    """Make Ports find this process's runtime with ``current()`` (``_core.current.install``, at boot)."""
    global _current
    _current = current


def _runtime(port: Port[Any]) -> _Replier:
    if _current is None:
        raise MeshInternalError(f"{port!r} used before this process's runtime was installed")
    return _current()


class Port(Generic[R]):
    """The sending end of a channel; pickles, so it can be passed to actors.

    Messages from one sender arrive in the order they were sent.
    """

    def __init__(self, port: PortRef, index: int = -1) -> None:
        self._port = port
        self._index = index

    def __repr__(self) -> str:
        (island, rank), pid = self._port
        return f"Port({island}.{rank}#{pid})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Port, (self._port, self._index))

    def send(self, obj: R) -> None:
        """Send ``obj`` to the receiver; returns at once.

        Raises:
            TypeError: ``obj`` cannot be pickled.
        """
        rt = _runtime(self)
        try:
            rt.reply(self._port, self._index, Status.OK, obj)
        except Exception as exc:
            raise TypeError(
                f"cannot send {_serialize.describe(obj)} on {self!r}: {exc}; send data that pickles"
            ) from exc

    def exception(self, exc: Exception) -> None:
        """Make the receiver's next ``recv()`` raise ``exc`` (as an ActorError)."""
        rt = _runtime(self)
        payload = _serialize.error_payload(exc, f"### port sender on {rt.host}", -1, {}, rt.host)
        rt.reply(self._port, self._index, Status.ERROR, payload)


class PortReceiver(Generic[R]):
    """The receiving end of a channel; lives in the process that opened it."""

    def __init__(self, queue: Queue, port: Port[R]) -> None:
        self._queue = queue
        self._port = port

    def __repr__(self) -> str:
        return f"PortReceiver({self._port!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        raise TypeError(f"cannot pickle {self!r}: a receiver stays in its process; send its Port instead")

    def recv(self) -> Future[R]:
        """The next message, as a future (in arrival order)."""
        return self._queue.recv()
