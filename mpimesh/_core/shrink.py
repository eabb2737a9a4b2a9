"""Shrinking a process mesh to its survivors (elastic): coordinates renumbered, actors and their state kept.

``ProcMesh.shrink()`` hands the live processes of a mesh with dead ones to
a new, smaller mesh.  Its shape comes from :func:`plan`: when the dead ranks
make up whole slices along one dimension (a lost host of a ``(hosts=2,
gpus=4)`` mesh), that dimension is made smaller (``hosts=1, gpus=4``);
otherwise the survivors are laid out in one dimension, ``rank`` (as
``ProcMesh.base_mesh()`` names it).  Survivors keep their order.

Every actor mesh this process spawned on the old mesh follows in place
(:func:`follow`): the same rule, applied to that actor mesh's own shape,
gives its new shape, and the spawner's handle on the whole actor mesh (what
``spawn`` returned) is re-pointed to it, so that calls made after the
shrink carry the new coordinates (``current_rank()``).  The surviving
actors are the same objects, with their state.  Views (slices) taken before
the shrink keep the old coordinates: slice the shrunk mesh again.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..config import settings
from ..shape import Shape
from . import current as _current
from . import journal
from .heal import shrink_world
from .logs import warn
from .owners import Kind

__all__ = ["Plan", "Shrunk", "plan", "shrink"]

Addr = tuple[int, int]


class Plan(NamedTuple):
    """A shrunk shape: its labels and sizes (row-major), and the old rank of each of its ranks."""

    labels: tuple[str, ...]
    sizes: tuple[int, ...]
    survivors: tuple[int, ...]


class Shrunk(NamedTuple):
    """The new process mesh of a shrink: its key, shape, processes and hosts; what follows it.

    ``followers``: each attached object that goes on with the survivors,
    by name, as the function that moves it to the new mesh, given the old
    and the new ``ProcMesh`` (the tensor engine's client: ``follow_shrink``).
    """

    key: Any
    shape: Shape
    addrs: tuple[Addr, ...]
    hosts: tuple[str, ...]
    followers: tuple[tuple[str, Any], ...] = ()


def plan(labels: tuple[str, ...], sizes: tuple[int, ...], dead: set[int]) -> Plan:
    """The shape left of the row-major mesh ``labels``/``sizes`` once its ranks ``dead`` are dropped.

    When the dead ranks are exactly the ranks of some indices of one
    dimension, that dimension keeps its name with those indices removed;
    else the survivors form one dimension ``rank``.  No dead rank: the same
    shape.  Every rank dead: no survivor (``survivors`` is empty, sizes
    ``(0,)``).

    Example:
        >>> plan(("hosts", "gpus"), (2, 2), {2, 3})
        Plan(labels=('hosts', 'gpus'), sizes=(1, 2), survivors=(0, 1))
        >>> plan(("hosts", "gpus"), (2, 2), {1})
        Plan(labels=('rank',), sizes=(3,), survivors=(0, 2, 3))
    """
    shape = Shape.row_major(labels, sizes)
    n = len(shape)
    survivors = tuple(r for r in range(n) if r not in dead)
    if len(survivors) == n:
        return Plan(labels, sizes, survivors)
    if not survivors:
        return Plan(("rank",), (0,), ())
    for d, label in enumerate(labels):
        lost = {shape.coordinates(r)[label] for r in dead if 0 <= r < n}
        if all((shape.coordinates(r)[label] in lost) == (r in dead) for r in range(n)):
            smaller = sizes[:d] + (sizes[d] - len(lost),) + sizes[d + 1:]
            return Plan(labels, smaller, survivors)
    return Plan(("rank",), (len(survivors),), survivors)


def shrink(key: Any, shape: Shape, addrs: tuple[Addr, ...], hosts: tuple[str, ...], what: str) -> Shrunk:
    """Hand the live processes of the owned process mesh ``key`` (dense ``shape``, named ``what``) to a new mesh.

    What was attached to the old mesh is closed, but for what follows a
    shrink (``follow_shrink``: the tensor engine's client), which is handed
    on in ``Shrunk.followers``; the old mesh leaves the ownership tree (its processes are not
    stopped), the dead processes are given back (the role forgets them),
    and every actor mesh of this process on the old mesh follows the new
    coordinates (:func:`follow`).

    Raises:
        RuntimeError: every process of the mesh has died.
    """
    rt = _current.current()
    dead = rt.dead
    lost = {r for r, a in enumerate(addrs) if a in dead}
    p = plan(shape.labels, shape.sizes, lost)
    if not p.survivors:
        raise RuntimeError(
            f"cannot shrink {what}: every one of its {len(addrs)} processes has died; "
            "create new processes with spawn_procs()"
        )
    node = rt.owners.take(key)
    followers: list[tuple[str, Any]] = []
    if node is not None:
        for child in list(node.children):
            told: Any = getattr(child.payload, "follow_shrink", None) if child.kind is Kind.ATTACHED else None
            if told is not None:  # told before its actors follow; not closed
                rt.owners.forget(child)
                followers.append((child.name, told(p.survivors)))
        for error in node.close("the process mesh was shrunk", settings.cleanup_timeout, itself=False):
            warn(f"closing what {node.name} owns: {error}")
    on_mesh = set(addrs)
    for mesh in rt.owners.of_kind(Kind.ACTOR_MESH):
        if mesh.payload.addrs and on_mesh.issuperset(mesh.payload.addrs):
            follow(mesh.payload, dead)
    # The dead processes are given up: the role stops counting them as held (its stop skips the dead).
    rt.role.release([addrs[r] for r in sorted(lost)], "given up by ProcMesh.shrink()")
    shrink_world(rt)  # for the survivors' communicators where they cannot be made from the group alone
    new_shape = Shape.row_major(p.labels, p.sizes)
    journal.event("shrink", f"{what} shrunk to {new_shape} ({len(lost)} dead process(es) given up)", key=key)
    return Shrunk(rt.new_id(), new_shape, tuple(addrs[r] for r in p.survivors),
                  tuple(hosts[r] for r in p.survivors), tuple(followers))


def follow(owned: Any, dead: dict[Addr, str]) -> None:
    """Re-point the actor mesh ``owned`` (``failures.Owned``) at its live actors, in its shrunk shape.

    The spawner's handles on the whole mesh are re-pointed; views of part
    of it keep their old coordinates.  A mesh whose every actor died is
    left as it is (its calls raise the death's ``SupervisionError``).
    """
    old: Shape = owned.shape.dense()
    lost = {r for r, a in enumerate(owned.addrs) if a in dead}
    if not lost:
        return
    p = plan(old.labels, old.sizes, lost)
    if not p.survivors:
        return
    shape = Shape.row_major(p.labels, p.sizes)
    addrs = tuple(owned.addrs[r] for r in p.survivors)
    for ref in list(owned.handles):
        if ref.shape == old:
            ref.shape = shape
            ref.repoint(addrs)
    owned.shape, owned.addrs = shape, addrs
