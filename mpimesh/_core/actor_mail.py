"""What an actor's mailbox holds: small typed items, and the call sites they may name.

Items come from frames (SPAWN, CALL, SITE_CALL, STOP) or from the actor's
own process (``Instance.stop``, a failure of a mesh it owns).  Each actor's
runner hands each item to the handler its cell registered for the item's
type (see ``actor_cell.ActorCell.start``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..shape import Extent, Point
from .protocol import Frame, Key, PortRef

if TYPE_CHECKING:
    from ..context import Context
    from ..supervision import MeshFailure

__all__ = ["Addr", "Call", "Init", "Item", "RawPoint", "Site", "SiteCall", "Stop", "Supervise", "as_point"]

Addr = tuple[int, int]
#: A message point as it travels: ``(rank, labels, sizes)``.
RawPoint = tuple[int, tuple[str, ...], tuple[int, ...]]


def as_point(raw: RawPoint) -> Point:
    """The :class:`~mpimesh.shape.Point` a travelling point stands for."""
    rank, labels, sizes = raw
    return Point(rank, Extent(labels, sizes))


class Site:
    """A registered call site (see ``protocol.site_call``): actor, method, caller and point.

    The actor's thread fills in, on first use, what every call through the
    site needs: the bound endpoint and the context.
    """

    __slots__ = ("key", "method", "caller", "point", "fn", "ctx")

    def __init__(self, key: Key, method: str, caller: Addr, point: RawPoint) -> None:
        self.key = key
        self.method = method
        self.caller = caller
        self.point = point
        self.fn: Callable[..., Any] | None = None
        self.ctx: Context | None = None


class Init:
    """Create the actor from the pickled class and arguments; always the first item."""

    __slots__ = ("body", "buffers", "port")

    def __init__(self, body: bytes, buffers: list[Any], port: PortRef) -> None:
        self.body = body
        self.buffers = buffers
        self.port = port


class Call:
    """A CALL frame (see ``protocol.call``) and its out-of-band buffers."""

    __slots__ = ("frame", "buffers")

    def __init__(self, frame: Frame, buffers: list[Any]) -> None:
        self.frame = frame
        self.buffers = buffers


class SiteCall:
    """A call through a registered site, to a sync actor (see ``protocol.site_call``)."""

    __slots__ = ("site", "pid", "args")

    def __init__(self, site: Site, pid: int, args: tuple[Any, ...]) -> None:
        self.site = site
        self.pid = pid
        self.args = args


class Supervise:
    """A mesh this actor owns has failed."""

    __slots__ = ("failure",)

    def __init__(self, failure: MeshFailure) -> None:
        self.failure = failure


class Stop:
    """Stop after the items before this one; ``done()`` runs once the actor has stopped."""

    __slots__ = ("reason", "done", "owned")

    def __init__(self, reason: str, done: Callable[[], None] | None, owned: bool = True) -> None:
        self.reason = reason
        self.done = done
        #: stop the meshes the actor spawned first (not when the whole job ends: they stop anyway)
        self.owned = owned


Item = Init | Call | SiteCall | Supervise | Stop
