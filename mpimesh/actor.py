"""The Actor base class and the ``@endpoint`` decorator."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, overload

__all__ = ["Actor", "EndpointInfo", "concurrent_endpoint", "endpoint", "endpoint_table"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class EndpointInfo:
    """What a caller needs to know about one endpoint of an actor class."""

    name: str
    is_async: bool
    explicit_response_port: bool
    signature: inspect.Signature | None

    @functools.cached_property
    def check(self) -> Callable[..., None] | None:
        """A function with the endpoint's parameters: calling it raises TypeError on a bad call.

        A real Python call with the same parameter list checks what
        ``Signature.bind`` checks, an order of magnitude faster (figures in
        ``docs/design/calls.md``).
        """
        if self.signature is None:
            return None
        return _compile_checker(self.signature)


def _compile_checker(sig: inspect.Signature) -> Callable[..., None] | None:
    parts: list[str] = []
    star = False
    previous = None
    for p in sig.parameters.values():
        if not p.name.isidentifier():
            return None
        if previous == p.POSITIONAL_ONLY and p.kind != p.POSITIONAL_ONLY:
            parts.append("/")
        default = "=_d" if p.default is not p.empty else ""
        if p.kind == p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star = True
        elif p.kind == p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
        elif p.kind == p.KEYWORD_ONLY:
            if not star:
                parts.append("*")
                star = True
            parts.append(p.name + default)
        else:
            parts.append(p.name + default)
        previous = p.kind
    if previous == inspect.Parameter.POSITIONAL_ONLY:
        parts.append("/")
    namespace: dict[str, Any] = {"_d": None}
    try:
        exec(f"def check({', '.join(parts)}): pass", namespace)
    except SyntaxError:
        return None
    return namespace["check"]  # type: ignore[no-any-return]


_MARK = "_mpimesh_endpoint"


@overload
def endpoint(fn: F, /) -> F: ...
@overload
def endpoint(
    *, propagate: Any = None, explicit_response_port: bool = False, instrument: bool = True
) -> Callable[[F], F]: ...


def endpoint(
    fn: F | None = None,
    /,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> F | Callable[[F], F]:
    """Mark a method of an :class:`Actor` as callable from other processes.

    The method stays an ordinary method for code inside the actor.  Through a
    mesh it gains the adverbs ``call``, ``call_one``, ``choose``, ``stream``
    and ``broadcast``.  ``def`` and ``async def`` endpoints both work, but one
    actor class uses only one kind.

    Args:
        fn: the method, when used bare as ``@endpoint``.
        propagate: accepted for Monarch compatibility (tensor-engine shape
            propagation); unused.
        explicit_response_port: the method receives a :class:`Port` as its
            first argument after ``self`` and answers with ``port.send(v)``,
            possibly later or from another thread.
        instrument: accepted for Monarch compatibility; unused.
    """

    def mark(method: F) -> F:
        if not callable(method):
            raise TypeError(f"@endpoint expects a function, got {method!r}; put it directly above a def")
        if getattr(method, _MARK, {}).get("concurrent"):
            raise ValueError(f"@endpoint does not wrap @concurrent_endpoint {_name(method)}; use one of the two")
        setattr(method, _MARK, {"explicit_response_port": explicit_response_port, "concurrent": False})
        method._explicit_response_port = explicit_response_port  # type: ignore[attr-defined]  # Monarch's
        return method

    if fn is not None:
        return mark(fn)
    return mark


@overload
def concurrent_endpoint(fn: F, /) -> F: ...
@overload
def concurrent_endpoint(
    *, propagate: Any = None, explicit_response_port: bool = False, instrument: bool = True
) -> Callable[[F], F]: ...


def concurrent_endpoint(
    fn: F | None = None,
    /,
    *,
    propagate: Any = None,
    explicit_response_port: bool = False,
    instrument: bool = True,
) -> F | Callable[[F], F]:
    """Mark an ``async def`` method of an :class:`Actor` as an endpoint whose calls overlap.

    Each call runs as an asyncio task on the actor's loop, so the actor takes
    its next message while the body awaits; calls start in arrival order,
    with no guarantee on the order they finish in.  When the actor stops,
    outstanding calls are cancelled (their callers get
    :class:`~mpimesh.SupervisionError`) before ``__cleanup__`` runs.  An exception escaping the body reaches
    the caller as an :class:`~mpimesh.ActorError` and the actor lives on, as
    for ``@endpoint``; with ``explicit_response_port=True`` it fails the actor
    (the caller gets ``SupervisionError``, the owner a ``MeshFailure``).  Do
    not stack it with ``@endpoint``.

    Args:
        fn: the method, when used bare as ``@concurrent_endpoint``.
        propagate: accepted for Monarch compatibility; unused.
        explicit_response_port: as for :func:`endpoint`.
        instrument: accepted for Monarch compatibility; unused.

    Raises:
        ValueError: the method is not ``async def``, or is already an ``@endpoint``.
    """

    def mark(method: F) -> F:
        if hasattr(method, _MARK):
            raise ValueError(f"@concurrent_endpoint does not wrap @endpoint {_name(method)}; use one of the two")
        if not inspect.iscoroutinefunction(method):
            raise ValueError(
                f"@concurrent_endpoint can only wrap async endpoints, got {_name(method)}; "
                "declare it async def, or use @endpoint"
            )
        setattr(method, _MARK, {"explicit_response_port": explicit_response_port, "concurrent": True})
        # Monarch's concurrent endpoints answer through a port of their own
        method._explicit_response_port = True  # type: ignore[attr-defined]
        return method

    if fn is not None:
        return mark(fn)
    return mark


def _name(method: Any) -> str:
    return str(getattr(method, "__qualname__", None) or repr(method))


@functools.cache
def endpoint_table(cls: type) -> dict[str, EndpointInfo]:
    """The endpoints of an actor class, by name.

    Raises:
        ValueError: the class mixes ``def`` and ``async def`` endpoints.
    """
    table: dict[str, EndpointInfo] = {}
    for name in dir(cls):
        method = getattr(cls, name, None)
        mark = getattr(method, _MARK, None)
        if mark is None:
            continue
        assert method is not None  # it carries the mark
        try:
            sig: inspect.Signature | None = inspect.signature(method)
        except (TypeError, ValueError):
            sig = None
        table[name] = EndpointInfo(
            name, inspect.iscoroutinefunction(method), bool(mark["explicit_response_port"]), sig
        )
    kinds = {info.is_async for info in table.values()}
    if len(kinds) > 1:
        sync = sorted(n for n, i in table.items() if not i.is_async)
        asyn = sorted(n for n, i in table.items() if i.is_async)
        raise ValueError(
            f"actor class {cls.__qualname__} mixes both async and sync endpoints (def {sync}, async def {asyn}); "
            "make them all def or all async def"
        )
    return table


class Actor:
    """Base class of user actors.

    Subclass it, mark methods with ``@endpoint`` and spawn it on a process
    mesh with ``procs.spawn("name", MyActor, *args)``.  Each actor handles its
    messages one at a time, in arrival order, on a thread of its own; actors
    in the same process run concurrently.

    Hooks a subclass may define:
        ``__cleanup__(self, exc)``: runs when the actor stops (``stop()`` or
        the end of the job), with ``exc`` the failure or ``None``.
        ``__supervise__(self, failure)``: called on the actor that spawned a
        mesh when part of that mesh fails; a truthy return handles it.
    """

    @functools.cached_property
    def logger(self) -> logging.Logger:
        """A logger named after the actor class."""
        return logging.getLogger(type(self).__qualname__)
