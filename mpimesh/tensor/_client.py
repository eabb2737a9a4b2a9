"""Controller side of the tensor engine: one client per process mesh, batching commands to its engine.

Commands are appended to a batch and leave as one ``broadcast`` to the
engine actors of the mesh view they target when the batch is full, when the
script asks for a value (``fetch_shard``), when it leaves ``activate()``, or
when the next command targets another view.  The controller never waits for
a worker to issue a command: what it needs to know (shapes, dtypes) it
computes itself (:mod:`._handle`).

The client follows its mesh through a heal and a shrink (``follow_heal``,
``follow_shrink``: ``ProcMesh.heal`` and ``ProcMesh.shrink`` call them, see
docs/design/tensor.md, "Heal and shrink"): the engine actors of the
survivors keep their tensors, reductions get communicators over the new
members, and a tensor used on a process that lost it raises at the
controller (:meth:`MeshClient.check_use`).
"""

from __future__ import annotations

import itertools
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, cast

from ..config import settings
from ..errors import SupervisionError
from ..shape import Shape
from ._commands import DEL, INDEX, REDUCE

if TYPE_CHECKING:
    from ..actor_mesh import ActorMesh
    from ._mesh import ProcMesh

Addr = tuple[int, int]
#: a reduction group of each process, by base index: its members, the ports to join them, the tag to make it by
Groups = dict[int, tuple[tuple[Addr, ...], tuple[str, ...], str]]

__all__ = ["MeshClient", "client_of", "next_id"]

#: Commands per message at most; a batch leaves earlier when a value is needed.  Each send costs the
#: controller about as much again in its progress thread (T1 in docs/design/tensor.md, in a job
#: under load: 256 a batch, 2.1 us per operation in the send and 2-3 in the other threads; 1,024,
#: 1.0 and 1.1-1.7); a batch of 1,024 flat commands pickles to ~60 KB.
BATCH = 1024

_ids = itertools.count(1)


def _refs_when_unheld() -> int:
    # What sys.getrefcount reports in _sweep's loop for a handle held only by its entry in ``young``
    # (the entry, the loop's name, the call's argument), measured the same way: a handle counted at
    # most this is held by nobody else.
    young = [(object(), 0)]
    for handle, _ in young[:1]:
        return sys.getrefcount(handle)
    raise AssertionError("unreachable")


_UNHELD = _refs_when_unheld()


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
        #: handles made since the last flush, held until it looks at them (see watch)
        self.young: list[tuple[Any, int]] = []
        self._on_collect = self._collected
        self._groups: dict[tuple[Shape, tuple[str, ...]], int] = {}
        self._keys = itertools.count(1)  # group keys: never reused, the workers cache groups by key
        self._lock = threading.RLock()
        self.mesh_id = procs.mesh_id
        #: a heal or shrink happened: every use of a tensor is checked (:meth:`check_use`)
        self.changed = False
        #: bumped by each heal: what was sent once per client (remote functions) is sent again
        self.epoch = 0
        # base index -> (the first tensor id made after its process was replaced, the death's report)
        self._lost: dict[int, tuple[int, str]] = {}
        self._restored: dict[int, set[int]] = {}  # base index -> tensor ids copied there since (broadcast_)

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
        # Most handles die before the next flush (``a = a + 1`` drops the previous one).  The flush
        # finds them by their reference count: a tensor that dies with a weak reference to it costs
        # torch ~3 us more to free (T1 in docs/design/tensor.md: as much as a quarter of torch's floor
        # per operation), a weak reference with a callback more.  Held here until then (at most a
        # batch, and a handle holds no data); the flush watches the survivors with a callback (_sweep).
        self.young.append((handle, tensor_id))

    def _sweep(self) -> None:
        # The young handles nobody else holds now go with the next batch; the others are watched until
        # they die.  Taken by count, then cut, so that a handle made meanwhile by another thread stays young.
        young = self.young
        n = len(young)
        if not n:
            return
        deleted, watched, on_collect = self._deleted, self._watched, self._on_collect
        count, unheld = sys.getrefcount, _UNHELD
        for handle, tensor_id in young[:n]:
            if count(handle) <= unheld:
                deleted.append(tensor_id)
            else:
                # keyed by the ref's id: a weakref hashes as its referent, and a tensor hashes in Python
                alive = weakref.ref(handle, on_collect)
                watched[id(alive)] = (alive, tensor_id)
        del young[:n]

    def _collected(self, ref: weakref.ref[Any]) -> None:
        # The handle is gone: free its tensor with the next batch.  Runs in whatever thread
        # collects the handle: a dict pop and an append, each atomic under the GIL.
        self._deleted.append(self._watched.pop(id(ref))[1])

    def flush(self) -> None:
        """Send what is queued now."""
        with self._lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        self._sweep()
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
            # A view taken before a heal still names the dead processes; the client knows their replacements.
            ranks, addrs = procs.view_shape.ranks(), procs.addresses
            dead = {r: c for r, c in dead.items() if addrs[r] == self.addrs[ranks[r]]}
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
        key, groups = self.group(procs, dims)
        return (REDUCE, in_ids, out_ids, reduction, scatter, key, groups, site)

    def group(self, procs: ProcMesh, dims: tuple[str, ...]) -> tuple[int, Groups | None]:
        """The key of the groups over ``dims`` of ``procs``, and the groups if they are new (they travel once).

        Raises:
            SupervisionError: a process of ``procs`` is dead.
        """
        self.check_alive(procs, dims)
        shape = procs.view_shape
        key = self._groups.get((shape, dims))
        groups: Groups | None = None
        if key is None:
            key = next(self._keys)
            groups = self._make_groups(shape, dims, key)
            self._groups[(shape, dims)] = key
        return key, groups

    def _make_groups(self, shape: Shape, dims: tuple[str, ...], key: int) -> Groups:
        labels = shape.labels
        others = [label for label in labels if label not in dims]
        members: dict[tuple[int, ...], list[int]] = {}
        for rank, base in enumerate(shape.ranks()):
            coords = shape.coordinates(rank)
            members.setdefault(tuple(coords[o] for o in others), []).append(base)
        groups: Groups = {}
        for bases in members.values():
            addrs = tuple(self.addrs[b] for b in bases)
            islands = len({island for island, _ in addrs})
            ports: tuple[str, ...] = ()
            if islands > 1:
                self.flush()
                leader = self.engine.slice(rank=bases[0])
                ports = tuple(leader.open_ports.call_one(islands - 1).get(settings.spawn_timeout))
            # Once the mesh healed or shrank a process of the job is dead: the workers make the
            # communicator from the group alone (_collectives.Communicators.get).
            tag = f"mpimesh.tensor:{self.mesh_id}:{key}:{bases[0]}" if self.changed else ""
            for b in bases:
                groups[b] = (addrs, ports, tag)
        return groups


    # --- heal and shrink

    def follow_heal(self, reports: dict[int, str], addrs: tuple[Addr, ...]) -> None:
        """The mesh was healed: the processes at base indices ``reports`` (each death's report) now live at ``addrs``.

        Called by ``ProcMesh.heal`` before the replacements join the engine's
        actor mesh (what is queued goes to the survivors first).  The engine
        actor on each replacement is made anew (an empty table): every tensor
        made before now is lost there until :func:`~._broadcast.broadcast_`
        copies it from a survivor; reductions get communicators over the new
        members.
        """
        with self._lock:
            self._flush_locked()
            mark = next_id()
            for base, report in reports.items():
                self._lost[base] = (mark, report)
                self._restored[base] = set()
            self.addrs = tuple(addrs)
            self._groups.clear()
            self.epoch += 1
            self.changed = True

    def follow_shrink(self, survivors: tuple[int, ...]) -> Callable[[ProcMesh, ProcMesh], MeshClient]:
        """The mesh shrinks to the base indices ``survivors``; returns how to move to the new mesh object.

        Called by ``ProcMesh.shrink`` before the engine's actor mesh follows
        (what is queued goes out first).  ``ProcMesh.shrink`` then calls the
        returned function with the old and the new mesh: the client is
        attached to the new one, and every tensor handle made on the old
        mesh itself (not on a slice of it) now belongs to the new one, with
        its local tensors on the survivors.
        """
        with self._lock:
            self._flush_locked()

        def adopt(old: ProcMesh, new: ProcMesh) -> MeshClient:
            with self._lock:
                self._sweep()
                where = {b: i for i, b in enumerate(survivors)}
                self._lost = {where[b]: v for b, v in self._lost.items() if b in where}
                self._restored = {where[b]: v for b, v in self._restored.items() if b in where}
                self.base = new.base_mesh()
                self.addrs = tuple(self.base.addresses)
                self.mesh_id = new.mesh_id
                self._views.clear()
                self._groups.clear()
                self.changed = True
                for ref, _ in list(self._watched.values()):
                    handle = ref()
                    if handle is not None and handle.__dict__.get("_procs") is old:
                        handle.__dict__["_procs"] = new
                # The survivors are numbered anew: each engine actor learns its index before any command.
                self.issue(self.base.view_shape, (INDEX, {addr: i for i, addr in enumerate(self.addrs)}))
            return self

        return adopt

    def check_use(self, procs: ProcMesh, tensors: Iterable[Any], what: str, at: int | None = None) -> None:
        """Raise if ``tensors`` (of view ``procs``) cannot be used there since a heal or shrink.

        ``at``: check only rank ``at`` of the view (a fetch).  Only called
        once :attr:`changed` is set, so the common path pays one test.

        Raises:
            ValueError: the view was taken before the mesh shrank.
            SupervisionError: a tensor lost its value on a replaced process.
        """
        if procs.mesh_id != self.mesh_id:
            raise ValueError(
                f"tensor engine: {what} on {procs!r}, a view taken before its mesh shrank (ProcMesh.shrink()); "
                "tensors of the mesh itself moved to the shrunk mesh, views did not: take the view again "
                "from the shrunk mesh (procs.slice(...), t.slice_mesh(...))"
            )
        if not self._lost:
            return
        ranks = procs.view_shape.ranks()
        for rank, base in enumerate(ranks):
            lost = self._lost.get(base)
            if lost is None or (at is not None and rank != at):
                continue
            mark, report = lost
            restored = self._restored[base]
            for t in tensors:
                if t._id < mark and t._id not in restored:
                    coords = ", ".join(f"{k}={v}" for k, v in procs.view_shape.coordinates(rank).items())
                    raise SupervisionError(
                        f"tensor engine: {what}: {t!r} has no value on rank {rank} ({coords}), which replaced a "
                        f"dead process when the mesh was healed ({report}); copy it there from a survivor "
                        "first: mpimesh.tensor.broadcast_(t), or make it again", endpoint=what)

    def restored(self, procs: ProcMesh, ids: Iterable[int]) -> None:
        """``broadcast_`` copied tensors ``ids`` to every process of ``procs``: they are whole again."""
        if not self._lost:
            return
        ids = list(ids)
        for base in procs.view_shape.ranks():
            if base in self._lost:
                self._restored[base].update(ids)


def client_of(procs: ProcMesh) -> MeshClient:
    """The engine client of ``procs``'s mesh, spawning the engine actors on first use; ``procs.stop()`` frees it."""
    return procs.attach("mpimesh.tensor", lambda: MeshClient(procs))
