"""Where am I: the calling actor, its rank, and the message being handled."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import MeshInternalError
from .shape import Extent, Point

__all__ = ["Context", "Instance", "context", "current_rank", "current_size", "current_actor_name"]

# The calling process as a 0-dimensional ProcMesh: registered by ``proc_mesh``
# when the package is imported (this module imports nothing above the value leaves).
_this_proc: Callable[[], Any] | None = None


def register_this_proc(fn: Callable[[], Any]) -> None:
    """Set what :attr:`Instance.proc` gives (``mpimesh.proc_mesh.this_proc``).

    A function, not an attribute set from outside (``tests/layers`` forbids
    that): ``from . import context`` in a sibling may give the package's
    ``context`` function, which has the module's name, instead of this module.
    """
    global _this_proc
    _this_proc = fn


@dataclass
class Instance:
    """The actor whose code is running.

    Attributes:
        rank: this actor's point in the mesh it was spawned as.
        name: the actor mesh's name (``"client"`` for the controller script).
        class_name: the actor class's qualified name.
        actor_id: a unique id, ``name[rank]@island.rank``.
        proc_mesh: the :class:`ProcMesh` the actor was spawned on (a reference).
        creator: the actor id of whoever spawned it.

    ``stop(reason)`` ends the actor cleanly after the current message;
    ``abort(reason)`` fails it, and its owner hears of the failure.
    """

    rank: Point
    name: str
    class_name: str
    actor_id: str
    proc_mesh: Any = None
    creator: str | None = None
    _actor: Any = field(default=None, repr=False)

    @property
    def proc(self) -> Any:
        """The singleton :class:`ProcMesh` of this actor's process."""
        if _this_proc is None:
            raise MeshInternalError("mpimesh.context is in use but mpimesh.proc_mesh was never imported")
        return _this_proc()

    def stop(self, reason: str = "stopped by itself") -> None:
        """Stop this actor after the current message (``__cleanup__`` runs)."""
        if self._actor is None:
            raise RuntimeError(f"cannot stop {self.actor_id}: it is the controller script, not an actor")
        self._actor.request_stop(reason)

    def abort(self, reason: str | None = None) -> None:
        """Fail this actor now: later calls raise ``SupervisionError`` and its owner is told.

        The owner's ``__supervise__`` (or ``unhandled_fault_hook``) receives a
        :class:`MeshFailure` naming ``reason`` ("no reason provided" without
        one, as in Monarch); the current message still finishes and answers.
        """
        if self._actor is None:
            raise RuntimeError(f"cannot abort {self.actor_id}: it is the controller script, not an actor")
        self._actor.abort(reason if reason is not None else "no reason provided")


@dataclass
class Context:
    """The context of the running code; see :func:`context`."""

    actor_instance: Instance
    message_rank: Point


_UNITY = Point(0, Extent((), ()))
_ROOT = Context(Instance(_UNITY, "client", "client", "client"), _UNITY)
#: Set by the actor host around each message (``mpimesh._core.actors``).
_context_var: contextvars.ContextVar[Context] = contextvars.ContextVar("mpimesh_context", default=_ROOT)


def context() -> Context:
    """The calling actor and the message it is handling.

    Outside any actor (the controller script, a worker's own threads) this is
    the root client context, whose rank is the 0-dimensional point.
    """
    return _context_var.get()


def current_rank() -> Point:
    """The caller's point in the mesh slice the current message was sent to."""
    return _context_var.get().message_rank


def current_size() -> dict[str, int]:
    """Sizes of the mesh slice the current message was sent to."""
    return dict(_context_var.get().message_rank.extent)


def current_actor_name() -> str:
    """The running actor's unique id, ``name[rank]@island.rank`` (``"client"`` outside actors), as in Monarch.

    It differs per rank of a mesh; the mesh's own name is
    ``context().actor_instance.name``.
    """
    return _context_var.get().actor_instance.actor_id
