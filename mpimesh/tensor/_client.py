"""Controller side of the tensor engine: one client per process mesh, batching commands to its engine.

Commands are appended to a batch and leave as one ``broadcast`` to the
engine actors of the mesh view they target when the batch is full, when the
script asks for a value (``fetch_shard``), when it leaves ``activate()``, or
when the next command targets another view.  The controller never waits for
a worker to issue a command: what it needs to know (shapes, dtypes) it
computes itself (:mod:`._handle`).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Any, cast

from ..config import settings
from ..errors import SupervisionError
from ..shape import Shape
from ._commands import DEL, REDUCE

if TYPE_CHECKING:
    from ..actor_mesh import ActorMesh
    from ._mesh import ProcMesh

Addr = tuple[int, int]

__all__ = ["MeshClient", "client_of", "next_id"]

#: Commands per message at most; a batch leaves earlier when a value is needed.
BATCH = 256

_ids = itertools.count(1)


def next_id() -> int:
    """A new tensor id, unique in this controller."""
    return next(_ids)


class MeshClient:
    """The engine of one process mesh (all its views), seen from the controller."""

    def __init__(self, procs: ProcMesh) -> None:
        from ._engine import Engine

        # every process of the mesh, rank i the process at base index i of each view's Shape
        self.base = procs.base_mesh()
        self.addrs = tuple(self.base.addresses)
        self.engine: ActorMesh[Any] = cast("ActorMesh[Any]", self.base.spawn("tensor_engine", Engine))
        self._views: dict[Shape, ActorMesh[Any]] = {}
        self._pending: list[tuple[Any, ...]] = []
        self._pending_shape: Shape | None = None
        self._deleted: list[int] = []
        self._watched: dict[int, tuple[weakref.ref[Any], int]] = {}  # id(ref) -> (ref, tensor id)
        self._on_collect = self._collected
        self._groups: dict[tuple[Shape, tuple[str, ...]], int] = {}
        self._lock = threading.RLock()

    def view(self, shape: Shape) -> ActorMesh[Any]:
        """The engine actors of the processes of ``shape`` (the ``view_shape`` of a view of this mesh)."""
        view = self._views.get(shape)
        if view is None:
            view = self._views[shape] = self.engine.with_shape(shape)
        return view

    def issue(self, shape: Shape, command: tuple[Any, ...]) -> None:
        """Queue ``command`` for every process of ``shape`` (the ``view_shape`` of a view of this mesh)."""
        with self._lock:
            if self._pending_shape is not None and self._pending_shape is not shape and self._pending_shape != shape:
                self._flush_locked()
            self._pending_shape = shape
            self._pending.append(command)
            if len(self._pending) >= BATCH:
                self._flush_locked()

    def watch(self, handle: Any, tensor_id: int) -> None:
        """Free tensor ``tensor_id`` on the workers once ``handle`` (its controller handle) is collected."""
        # keyed by the ref's id: a weakref hashes as its referent, and a tensor hashes in Python
        ref = weakref.ref(handle, self._on_collect)
        self._watched[id(ref)] = (ref, tensor_id)

    def _collected(self, ref: weakref.ref[Any]) -> None:
        # The handle is gone: free its tensor with the next batch.  Runs in whatever thread
        # collects the handle: a dict pop and an append, each atomic under the GIL.
        self._deleted.append(self._watched.pop(id(ref))[1])

    def flush(self) -> None:
        """Send what is queued now."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._deleted:
            deleted, self._deleted = self._deleted, []
            # Deletions go to every process (a tensor of any view is in the table of its processes
            # only): with the pending batch when that goes to every process too (the mesh itself
            # rather than a slice: the usual case), else in a batch of their own.
            pending = self._pending_shape
            if pending is None or (pending is not self.base.view_shape and pending.nelements != len(self.addrs)):
                self._send(pending, self._pending)
                self._pending, self._pending_shape = [], self.base.view_shape
            self._pending.append((DEL, tuple(deleted)))
        if self._pending and self._pending_shape is not None:
            self._send(self._pending_shape, self._pending)
        self._pending, self._pending_shape = [], None

    def _send(self, shape: Shape | None, batch: list[tuple[Any, ...]]) -> None:
        if shape is None or not batch:
            return
        # Every live process of the view gets the batch exactly once (a batch run twice would run
        # its deletions before its own operations the second time); a dead process's tensors are
        # gone (fetching them raises SupervisionError), and the others' stream goes on.
        self.view(shape).run.broadcast_live(batch)

    def check_alive(self, procs: ProcMesh, dims: tuple[str, ...]) -> None:
        """Raise if a process of ``procs`` is dead: a collective with it would hang the others.

        Raises:
            SupervisionError: naming the dead process.
        """
        dead = procs.dead()
        if dead:
            cause = dead[min(dead)]  # the first in rank order, as a walk of the ranks finds it
            raise SupervisionError(f"tensor engine: cannot reduce over {dims}: {cause}", endpoint="reduce")

    # --- reductions

    def reduce_command(self, procs: ProcMesh, dims: tuple[str, ...], in_ids: tuple[int, ...],
                       out_ids: tuple[int, ...], reduction: str, scatter: bool, site: str) -> tuple[Any, ...]:
        """The command reducing ``in_ids`` over ``dims`` of ``procs``; its groups travel the first time only.

        A group whose processes are in several MPI worlds is joined into one
        communicator the first time: its first process opens the ports for
        that, which this call waits for (once per mesh view and dims).
        """
        self.check_alive(procs, dims)
        shape = procs.view_shape
        key = self._groups.get((shape, dims))
        groups: dict[int, tuple[tuple[Addr, ...], tuple[str, ...]]] | None = None
        if key is None:
            groups = self._make_groups(shape, dims)
            key = self._groups[(shape, dims)] = len(self._groups) + 1
        return (REDUCE, in_ids, out_ids, reduction, scatter, key, groups, site)

    def _make_groups(self, shape: Shape, dims: tuple[str, ...]) -> dict[int, tuple[tuple[Addr, ...], tuple[str, ...]]]:
        labels = shape.labels
        others = [label for label in labels if label not in dims]
        members: dict[tuple[int, ...], list[int]] = {}
        for rank, base in enumerate(shape.ranks()):
            coords = shape.coordinates(rank)
            members.setdefault(tuple(coords[o] for o in others), []).append(base)
        groups: dict[int, tuple[tuple[Addr, ...], tuple[str, ...]]] = {}
        for bases in members.values():
            addrs = tuple(self.addrs[b] for b in bases)
            islands = len({island for island, _ in addrs})
            ports: tuple[str, ...] = ()
            if islands > 1:
                self.flush()
                leader = self.engine.slice(rank=bases[0])
                ports = tuple(leader.open_ports.call_one(islands - 1).get(settings.spawn_timeout))
            for b in bases:
                groups[b] = (addrs, ports)
        return groups


def client_of(procs: ProcMesh) -> MeshClient:
    """The engine client of ``procs``'s mesh, spawning the engine actors on first use; ``procs.stop()`` frees it."""
    return procs.attach("mpimesh.tensor", lambda: MeshClient(procs))
