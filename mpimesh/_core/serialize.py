"""Turning arguments, results and exceptions into bytes and back.

User payloads go through cloudpickle, so functions and classes defined in
``__main__`` travel by value.  Large buffers (numpy arrays, and with the data
plane torch tensors) are taken out of band with pickle protocol 5: they travel
as raw MPI messages instead of being copied into the pickle.
"""

from __future__ import annotations

import io
import pickle
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from .._data import buffers as _buffers
from ..config import settings
from ..errors import ActorError, RemoteException, RemoteTraceback

__all__ = ["ATOMS", "dumps", "loads", "plain", "ErrorPayload", "error_payload", "raise_payload", "describe"]

_PROTOCOL = 5


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]
    """cloudpickle's pickler, plus the data plane's reducer for torch tensors.

    A tensor of at least ``MPIMESH_OOB_THRESHOLD`` bytes pickles as a small
    header and a ``PickleBuffer`` over its bytes, which ``dumps`` takes out of
    band (numpy arrays do this by themselves).
    """

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            reduced = _buffers.reduce_tensor(obj, settings.oob_threshold)
            if reduced is not NotImplemented:
                return reduced
        return super().reducer_override(obj)


#: The builtin scalars: plain data by themselves.
ATOMS = frozenset((int, float, str, bool, type(None), complex))
_PLAIN_ATOMS = ATOMS


def plain(obj: Any, depth: int = 0) -> bool:
    """Whether ``obj`` is plain data: builtin scalars and small containers of them."""
    # Data made only of builtin scalars and containers pickles identically
    # with the C pickler, which is several times faster than cloudpickle's
    # for small calls (docs/design/calls.md).  Anything else (functions,
    # classes, user objects that may live in __main__) takes cloudpickle.
    kind = type(obj)
    if kind in _PLAIN_ATOMS:
        return True
    if kind is tuple and len(obj) <= 32 and _PLAIN_ATOMS.issuperset(map(type, obj)):
        return True  # the common case (call arguments), in one C call
    if kind is bytes:
        return len(obj) < settings.oob_threshold
    if depth > 3:
        return False
    if kind is tuple or kind is list:
        if len(obj) > 32:
            return False
        for item in obj:
            if type(item) not in _PLAIN_ATOMS and not plain(item, depth + 1):
                return False
        return True
    if kind is dict:
        if len(obj) > 32:
            return False
        for key, value in obj.items():
            if type(key) is not str or (type(value) not in _PLAIN_ATOMS and not plain(value, depth + 1)):
                return False
        return True
    return False


def dumps(obj: Any) -> tuple[bytes, list[memoryview]]:
    """Pickle ``obj``; buffers of at least ``MPIMESH_OOB_THRESHOLD`` bytes go out of band.

    Returns:
        The pickle and the out-of-band buffers (flat byte views), in the order
        ``loads`` needs them.
    """
    if plain(obj):
        return pickle.dumps(obj, _PROTOCOL), []
    buffers: list[pickle.PickleBuffer] = []
    threshold = settings.oob_threshold

    def take(buf: pickle.PickleBuffer) -> bool:
        # Returning a true value keeps the buffer in band.
        if buf.raw().nbytes >= threshold:
            buffers.append(buf)
            return False
        return True

    out = io.BytesIO()
    pickler = _Pickler(out, protocol=_PROTOCOL, buffer_callback=take)
    if _dispatch_modes():
        _without_modes(pickler.dump, obj)
    else:
        pickler.dump(obj)
    return out.getvalue(), [b.raw() for b in buffers]


def loads(data: bytes | bytearray | memoryview, buffers: Sequence[Any] = ()) -> Any:
    """Inverse of :func:`dumps`."""
    if _dispatch_modes():
        return _without_modes(pickle.loads, data, buffers=buffers)
    return pickle.loads(data, buffers=buffers)


def _dispatch_modes() -> bool:
    """Whether a torch dispatch mode is active in this thread (``procs.activate()``, ``FakeTensorMode``)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch._C._len_torch_dispatch_stack())
    except AttributeError:  # torch is still being imported (by another thread): no mode yet
        return False


def _without_modes(fn: Any, *args: Any, **kwargs: Any) -> Any:
    # A payload is data, not operations: the tensors (un)pickling builds or copies must be plain
    # tensors of this process, not operations of the active mode (inside a mesh's activate(), a
    # fetched result would otherwise become a mesh tensor and fail to unpickle).
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return fn(*args, **kwargs)


def describe(obj: Any) -> str:
    """A short description of an object for error messages."""
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."


# ---------------------------------------------------------------------------
# exceptions that cross processes


@dataclass
class ErrorPayload:
    """An exception on its way from an actor to the caller.

    ``exception`` holds the pickled exception or ``None`` when it could not be
    pickled; ``type_name`` and ``message`` are the text fallback (execnet's
    ``RemoteError`` does the same).
    """

    exception: bytes | None
    type_name: str
    message: str
    traceback: str
    header: str
    rank: int
    coords: dict[str, int]
    host: str
    #: ``Type: message`` of each exception it was raised from or during, innermost last
    causes: tuple[str, ...] = ()
    #: the failing actor's id (``name[rank]@island.rank``), for ``mpimesh.debug.pm``
    actor_id: str = ""
    #: ``mesh.method`` that failed, for Monarch's "Actor call mesh.method failed" (issue #14)
    endpoint: str = ""


def error_payload(
    exc: BaseException, header: str, rank: int, coords: dict[str, int], host: str, actor_id: str = "",
    endpoint: str = "",
) -> ErrorPayload:
    """Capture ``exc`` (with its traceback) for the caller.

    ``actor_id`` names the failing actor and ``endpoint`` its ``mesh.method``, if any.
    """
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    data: bytes | None
    try:
        data = cloudpickle.dumps(exc, protocol=_PROTOCOL)
        pickle.loads(data)  # it must also come back, or the caller gets nothing
    except Exception:
        data = None
    kind = type(exc)
    return ErrorPayload(data, f"{kind.__module__}.{kind.__qualname__}", str(exc), tb, header, rank, coords, host,
                        _causes(exc), actor_id, endpoint)


def _causes(exc: BaseException) -> tuple[str, ...]:
    # The chain Python prints: __cause__, else an unsuppressed __context__
    # (a pickled exception loses both, so they travel as text too).
    found: list[str] = []
    seen = {id(exc)}
    while True:
        nxt = exc.__cause__ if exc.__cause__ is not None else (None if exc.__suppress_context__ else exc.__context__)
        if nxt is None or id(nxt) in seen:
            return tuple(found)
        seen.add(id(nxt))
        found.append(f"{type(nxt).__name__}: {nxt}")
        exc = nxt


def raise_payload(payload: ErrorPayload) -> ActorError:
    """Rebuild the :class:`ActorError` that the caller raises."""
    exc: BaseException
    if payload.exception is not None:
        try:
            exc = pickle.loads(payload.exception)
        except Exception:
            exc = RemoteException(payload.type_name, payload.message)
    else:
        exc = RemoteException(payload.type_name, payload.message)
    # The traceback itself is in the ActorError's text (as Monarch prints it);
    # the cause names where it ran, so an uncaught error prints it once.
    exc.__cause__ = RemoteTraceback(f"\n{payload.header}")
    return ActorError(
        exc, payload.traceback, payload.header, rank=payload.rank, coords=payload.coords, host=payload.host,
        causes=payload.causes, actor_id=payload.actor_id, endpoint=payload.endpoint,
    )
