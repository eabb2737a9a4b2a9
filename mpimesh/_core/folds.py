"""Folds in the tree: a call's replies combined on their way up, so the caller receives one value.

``Accumulator(endpoint, identity, combine, merge=...)`` and
``endpoint.reduce(op)`` cast their call down a tree (``_core.multicast``)
with a :class:`Fold` in place of the plain gathering.  Each relay of the
tree (``_core.relays``) turns its own actor's reply into a partial value
(``combine(identity, reply)``), merges its children's partials into it
(``merge(a, b)``) and sends one ``PARTIAL`` item up: the indices it covers,
the value, and the errors met (an endpoint's exception, or one raised by
``combine``/``merge``), kept apart with their indices.

The caller (:class:`Folded`) takes partials and single replies (a call to
fewer actors than ``MPIMESH_CAST_TREE_MIN`` goes direct and folds here; a
resend around a dead forwarder answers directly).  A reply can arrive twice,
once in a partial and once alone (a relay's partial left before it died,
and the caller resent to its subtree): the partials of one tree nest or are
disjoint, so the caller takes the largest first and every other piece only
where it covers indices nothing taken covers.  The result is the merge of
the pieces taken, or the error of the lowest failing rank, as ``call()``.
An exception raised by ``combine`` or ``merge`` reaches the caller as an
``ActorError`` of the rank whose reply was being folded in, wherever in the
tree that happened.
"""

from __future__ import annotations

import platform
from collections.abc import Callable, Iterable
from typing import Any, Final

import cloudpickle

from ..future import Future
from ..shape import Shape
from . import serialize as _serialize
from .ports import Receiver, decode, point_text, unpack
from .protocol import Status

__all__ = ["Fold", "Folded", "Partial", "PARTIAL"]

Addr = tuple[int, int]

#: The status of a relay's partial in a ``MANY`` reply: body ``(covered, status, value, errors)``.
PARTIAL: Final = 5
_OK, _VALUE, _ERROR = Status.OK, Status.VALUE, Status.ERROR
#: The status of a partial's value when its subtree had no value to fold (all failed).
_EMPTY: Final = -1


class _Nothing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<nothing>"


_NOTHING: Final = _Nothing()


class Fold:
    """How replies combine: ``combine(identity, reply)`` for each, ``merge(a, b)`` for two partials.

    Without ``combine`` a reply is its own partial (``endpoint.reduce(op)``,
    where ``merge`` is ``op``).
    """

    __slots__ = ("identity", "combine", "merge", "_pickled")

    def __init__(self, identity: Any, combine: Callable[[Any, Any], Any] | None,
                 merge: Callable[[Any, Any], Any], what: str) -> None:
        self.identity = identity
        self.combine = combine
        self.merge = merge
        try:
            self._pickled: bytes = cloudpickle.dumps((identity, combine, merge))
        except Exception as exc:
            raise TypeError(
                f"{what}: the fold cannot be pickled to run in the tree ({exc}); "
                "use module-level functions such as operator.add"
            ) from exc

    @classmethod
    def load(cls, pickled: bytes) -> Fold:
        """The fold a cast carries (see :attr:`pickled`)."""
        identity, combine, merge = _serialize.loads(pickled)
        fold = cls.__new__(cls)
        fold.identity, fold.combine, fold.merge, fold._pickled = identity, combine, merge, pickled
        return fold

    @property
    def pickled(self) -> bytes:
        """The fold, pickled: what a cast carries in place of its ``gather`` mode."""
        return self._pickled

    def leaf(self, value: Any) -> Any:
        """One reply as a partial."""
        return value if self.combine is None else self.combine(self.identity, value)


class Partial:
    """The fold of one subtree's replies, in a relay.

    Args:
        fold: how to combine.
        what: the endpoint, for error headers.
        host: this process's host, for error headers.
    """

    __slots__ = ("fold", "what", "host", "value", "covered", "errors", "error_buffers")

    def __init__(self, fold: Fold, what: str, host: str) -> None:
        self.fold = fold
        self.what = what
        self.host = host
        self.value: Any = _NOTHING
        self.covered: list[int] = []
        #: ``(index, status, body, buffer count)`` of each error met
        self.errors: list[tuple[int, int, Any, int]] = []
        self.error_buffers: list[Any] = []

    def add(self, item: tuple[Any, ...], buffers: list[Any]) -> None:
        """Fold in one item of a ``MANY`` reply: a single reply, or a child's partial."""
        index, status, body = item[0], item[1], item[2]
        if status == PARTIAL:
            covered, vstatus, vbody, errors = body
            self.covered.extend(covered)
            at = 0
            if vstatus != _EMPTY:
                n = item[3] - sum(e[3] for e in errors)
                self._merge(covered[0], lambda: _value(vstatus, vbody, buffers[:n]), leaf=False)
                at = n
            for error in errors:
                self.errors.append(error)
                self.error_buffers.extend(buffers[at:at + error[3]])
                at += error[3]
            return
        self.covered.append(index)
        if status in (_OK, _VALUE):
            self._merge(index, lambda: _value(status, body, buffers), leaf=True)
        else:
            self.errors.append((index, status, body, len(buffers)))
            self.error_buffers.extend(buffers)

    def _merge(self, index: int, value: Callable[[], Any], *, leaf: bool) -> None:
        fold = self.fold
        try:
            piece = value()
            if leaf:
                piece = fold.leaf(piece)
            self.value = piece if self.value is _NOTHING else fold.merge(self.value, piece)
        except BaseException as exc:  # the caller gets it, as the error of this rank
            payload = _serialize.error_payload(exc, f"### folding the reply of {self.what}() at rank {index} "
                                               f"on {self.host}", index, {}, self.host)
            body, bufs = _serialize.dumps(payload)
            self.errors.append((index, _ERROR, body, len(bufs)))
            self.error_buffers.extend(bufs)

    def item(self, addr: Addr) -> tuple[tuple[Any, ...], list[Any]]:
        """The subtree's one ``PARTIAL`` item and its buffers."""
        vbody: Any
        buffers: list[Any]
        if self.value is _NOTHING:
            vstatus, vbody, buffers = _EMPTY, None, []
        elif _serialize.plain(self.value):
            vstatus, vbody, buffers = _VALUE, self.value, []
        else:
            vbody, buffers = _serialize.dumps(self.value)
            vstatus = _OK
        buffers = [*buffers, *self.error_buffers]
        body = (self.covered, vstatus, vbody, self.errors)
        return (-1, PARTIAL, body, len(buffers), addr), buffers


def _value(status: int, body: Any, buffers: list[Any]) -> Any:
    """A value as a reply or a partial carries it: in the frame (plain data), or pickled."""
    return body if status == _VALUE else _serialize.loads(body, buffers)


class Folded(Receiver):
    """The caller's side of a fold: partials and single replies, into one value.

    Args:
        future: what the result settles.
        what: the endpoint, for errors.
        shape: the mesh called, to say where a failure happened.
        sources: the address of each rank called, in rank order.
        fold: how to combine.
    """

    def __init__(self, future: Future[Any], what: str, shape: Shape, sources: Iterable[Addr], fold: Fold) -> None:
        self.future = future
        self.shape = shape
        self.what = what
        self.fold = fold
        self.gather = fold.pickled
        self._sources = list(sources)
        self.n = len(self._sources)
        self.pending: set[Addr] = set(self._sources)
        self.covered: set[int] = set()
        #: index -> (status, body, buffers) of a reply that came alone
        self.singles: dict[int, tuple[int, Any, list[Any]]] = {}
        #: (covered, value status, value body, value buffers, errors with their buffers)
        self.partials: list[tuple[frozenset[int], int, Any, list[Any], list[tuple[int, int, Any, list[Any]]]]] = []
        self.failed: dict[int, str] = {}

    def deliver(self, index: int, status: int, body: Any, buffers: list[Any], src: Addr) -> bool:
        self.pending.discard(src)
        if index not in self.singles:
            self.singles[index] = (status, body, buffers)
            self.covered.add(index)
        return self._check()

    def deliver_many(self, src: Addr, body: list[Any], buffers: list[Any]) -> bool:
        """A relay's message: its subtree's partial, or single replies."""
        for item, parts in unpack(body, buffers):
            if item[1] != PARTIAL:
                self.deliver(item[0], item[1], item[2], parts, item[4])
                continue
            covered, vstatus, vbody, errors = item[2]
            n = 0 if vstatus == _EMPTY else len(parts) - sum(e[3] for e in errors)
            at = n
            withbufs = []
            for index, status, ebody, count in errors:
                withbufs.append((index, status, ebody, parts[at:at + count]))
                at += count
            self.partials.append((frozenset(covered), vstatus, vbody, parts[:n], withbufs))
            self.covered.update(covered)
            sources = self._sources
            for index in covered:
                self.pending.discard(sources[index])
        return self._check()

    def fail(self, addr: Addr, report: str) -> bool:
        self.pending.discard(addr)
        for index, source in enumerate(self._sources):
            if source == addr and index not in self.covered:
                self.failed[index] = report
                self.covered.add(index)
        return self._check()

    def _check(self) -> bool:
        if len(self.covered) < self.n:
            return False
        if not self.future.done():
            try:
                self.future.set_result(self._result())
            except BaseException as exc:
                self.future.set_exception(exc)
        return True

    def _result(self) -> Any:
        # The pieces that cover every index once: the largest partials first (a
        # tree's partials nest or are disjoint), then what covers the rest.
        taken: set[int] = set()
        #: (lowest index, status, body, buffers, is a single reply)
        values: list[tuple[int, int, Any, list[Any], bool]] = []
        #: index -> (status, body, buffers) of an error, or the report of a failure
        errors: dict[int, tuple[int, Any, list[Any]] | str] = {}
        for covered, vstatus, vbody, vbufs, perrors in sorted(self.partials, key=lambda p: -len(p[0])):
            if covered & taken:
                continue
            taken |= covered
            if vstatus != _EMPTY:
                values.append((min(covered), vstatus, vbody, vbufs, False))
            for index, status, ebody, ebufs in perrors:
                errors[index] = (status, ebody, ebufs)
        for index, (status, body, buffers) in self.singles.items():
            if index in taken:
                continue
            taken.add(index)
            if status in (_OK, _VALUE):
                values.append((index, status, body, buffers, True))
            else:
                errors[index] = (status, body, buffers)
        for index, report in self.failed.items():
            if index not in taken:
                errors[index] = report
        what = self.what
        if errors:
            first = min(errors)
            error = errors[first]
            if isinstance(error, str):
                raise self.error(error, point_text(self.shape, first))
            decode(*error, what)  # raises what the actor raised
        fold = self.fold
        acc: Any = _NOTHING
        for index, status, body, buffers, single in sorted(values, key=lambda v: v[0]):
            piece = _value(status, body, buffers)
            try:
                if single:
                    piece = fold.leaf(piece)
                acc = piece if acc is _NOTHING else fold.merge(acc, piece)
            except BaseException as exc:
                # as from a relay: an ActorError, whichever process of the tree folded it
                host = platform.node()
                payload = _serialize.error_payload(exc, f"### folding the reply of {what}() at rank {index} "
                                                   f"on {host}", index, {}, host)
                raise _serialize.raise_payload(payload) from None
        return acc  # a mesh has at least one actor, and with no value there was an error
