"""Healing a process mesh in place: its dead processes replaced, their actors made again.

``ProcMesh.heal()`` (``mpimesh.heal_mesh``) asks the controller's role for
one process per dead rank (a spare of the launch pool on the dead process's
host first, then a spare of any host, then a spawn: ``Controller.replace``),
then, for every actor mesh of this process that had an actor on a dead
process, makes that actor again on its replacement from the mesh's
:class:`Recipe` (the pickled class and constructor arguments of the spawn,
with the same key, name and point), and re-points this process's handles on
the mesh (``MeshRef.repoint``).  Actors on healthy processes are not
touched: their state and their calls go on.

What a heal does not carry over: the dead actors' state (their constructor
runs again; restore it from a survivor or a checkpoint), handles on the mesh
held by other processes (an actor that was handed the mesh still addresses
the dead process: hand it the healed mesh again), and objects attached to
the process mesh (closed and made anew on their next use, except those that
follow a heal: the tensor engine's client keeps the survivors' tensors).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, NamedTuple

from .._transport import live
from ..config import settings
from ..errors import ActorError, SupervisionError
from ..future import Future
from ..shape import Shape
from . import current as _current
from . import journal, protocol
from .logs import warn
from .owners import Kind
from .ports import Gather

if TYPE_CHECKING:
    from .failures import Owned

__all__ = ["Healed", "Recipe", "heal", "shrink_world"]

Addr = tuple[int, int]


class Recipe(NamedTuple):
    """How the actors of a mesh were made, kept with the mesh so that a heal can make one again."""

    is_async: bool
    body: bytes
    buffers: list[Any]
    creator: tuple[str, Addr]
    path: list[str]


class Healed(NamedTuple):
    """What a heal did: the base indices it replaced, the mesh's new processes and hosts."""

    ranks: list[int]
    addrs: tuple[Addr, ...]
    hosts: tuple[str, ...]


def heal(key: Any, ranks: list[int], addrs: tuple[Addr, ...], hosts: tuple[str, ...], *,
         timeout: float | None = None) -> Healed:
    """Replace the dead processes among ``ranks`` (base indices) of the process mesh ``key``; blocks.

    All or nothing: the actors are made on the replacements first, and only
    once every ``__init__`` has returned are this process's actor meshes
    re-pointed (and the caller re-points the process mesh from the result).
    If any step fails, nothing moves: the replacements are given back, their
    new actors stopped, and the meshes still name the dead processes.

    Returns once every re-made actor's ``__init__`` has run.

    Raises:
        RuntimeError: there is no spare and no process could be spawned, a
            replacement died, or a re-made actor's ``__init__`` raised (the
            message names the rank, the cause and what to do; the error is
            chained from the cause: ``ActorError``, ``SupervisionError``).
        TimeoutError: the new actors were not ready within ``timeout``
            seconds (default ``MPIMESH_SPAWN_TIMEOUT``); nothing moved.
    """
    rt = _current.current()
    dead = rt.dead
    lost = [i for i in ranks if addrs[i] in dead]
    if not lost:
        return Healed([], addrs, hosts)
    placed = rt.role.replace([hosts[i] for i in lost])
    new_addrs, new_hosts = list(addrs), list(hosts)
    moved: dict[Addr, Addr] = {}
    for i, (addr, host) in zip(lost, placed, strict=True):
        moved[addrs[i]] = addr
        new_addrs[i], new_hosts[i] = addr, host
    rt.hosts.update((addr, host) for addr, host in placed)
    nodes = [node for node in rt.owners.of_kind(Kind.ACTOR_MESH) if any(a in moved for a in node.payload.addrs)]
    meshes: list[Owned] = [node.payload for node in nodes]
    # Until the heal commits, no mesh holds the replacements: a fault of an actor made there is
    # this heal's to report (as the error below), not the mesh owner's (``Failures.on_fault``).
    rt.failures.healing.update(moved.values())
    deadline = time.monotonic() + (settings.spawn_timeout if timeout is None else timeout)
    try:
        waits = [_remake(rt, node.key, node.payload, moved) for node in nodes]
        for fut in waits:
            if fut is not None:
                fut.get(max(0.0, deadline - time.monotonic()))
    except BaseException as exc:
        _undo(rt, [addr for addr, _ in placed])
        if not isinstance(exc, Exception):
            raise
        raise _failed(exc, lost, addrs, moved, new_hosts, meshes) from exc
    # Committed: what is attached to the mesh follows first (the tensor engine's client sends what it
    # has queued to the survivors while its actor mesh still names them), then every mesh is re-pointed.
    _drop_attached(rt, key, {i: dead[addrs[i]] for i in lost}, tuple(new_addrs))
    for owned in meshes:
        owned.addrs = tuple(moved.get(a, a) for a in owned.addrs)
        for ref in list(owned.handles):
            ref.repoint(owned.addrs)
    rt.failures.healing.difference_update(moved.values())
    shrink_world(rt)
    journal.event("heal", f"replaced {len(lost)} dead process(es): " + ", ".join(
        f"{a[0]}.{a[1]} -> {b[0]}.{b[1]}" for a, b in moved.items()), key=key)
    return Healed(lost, tuple(new_addrs), tuple(new_hosts))


def shrink_world(rt: Any) -> None:
    """Where ``MPI_Comm_create_from_group`` is unsupported, shrink the world to its live processes, all of them.

    After a death the tensor engine and the torch world make communicators
    on that shrunk world instead (``_transport.live``: Slurm's PMIx has no
    group construct).  The shrink is collective over every live process of
    the controller's MPI world: each gets a ``SHRINK`` frame, sent before
    this process stops its wire for its own part.  Only the controller
    knows them all: elsewhere (a heal from an actor) nothing is done.

    Raises:
        TimeoutError: a live process neither joined the shrink nor died
            within ``MPIMESH_SPAWN_TIMEOUT`` (frozen); the error names the
            processes it waited for.
        mpi4py.MPI.Exception: the shrink failed.
    """
    if rt.addr != protocol.CONTROLLER or live.from_group_supported():
        return
    dead = rt.dead
    peers = [addr for addr in rt.role.live_addrs() if addr[0] == rt.addr[0] and addr not in dead]
    live.announce()
    for addr in peers:
        rt.router.send(addr, protocol.shrink())
    rt.router.wire.flush()
    started = time.monotonic()
    live.shrink(settings.spawn_timeout, [rt.addr, *peers])
    journal.event("world", f"the world shrunk to its live processes ({len(peers) + 1}) in "
                  f"{time.monotonic() - started:.3f} s")


def _undo(rt: Any, placed: list[Addr]) -> None:
    """A heal failed: stop what it made on the replacements and give them back (bounded; best effort).

    The replacements stay in ``Failures.healing``: a late fault of an actor
    made there (its ``FAULT`` may trail the error that failed the heal) is
    not reported to the mesh's owner, whose mesh never held that process.
    """
    live = [addr for addr in placed if addr not in rt.dead]
    if not live:
        return
    try:
        rt.role.release(live, "a heal that failed is undone").get(settings.shutdown_timeout + 5.0)
    except Exception as exc:  # the heal's own error matters more; the processes stay taken
        warn(f"heal: could not give back the replacements {live} of a failed heal: {exc}")


def _failed(exc: Exception, lost: list[int], addrs: tuple[Addr, ...], moved: dict[Addr, Addr],
            new_hosts: list[str], meshes: list[Owned]) -> Exception:
    """The error of a heal that failed with ``exc`` and was undone: which rank, why, and what to do."""
    rank = None
    if isinstance(exc, ActorError):
        # the actor mesh's rank, to the process mesh's: through the replacement's address
        for owned in meshes:
            if owned.name == exc.endpoint.rsplit(".", 1)[0] and 0 <= exc.rank < len(owned.addrs):
                new = moved.get(owned.addrs[exc.rank])
                rank = next((i for i in lost if moved[addrs[i]] == new), None)
                break
    ranks = [rank] if rank is not None else lost
    where = ", ".join(f"rank {i} (by {moved[addrs[i]]} on {new_hosts[i]})" for i in ranks)
    cause = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    state = (f"nothing changed: the mesh and its actor meshes still have dead rank(s) {lost}, "
             "and the replacements were given back")
    if isinstance(exc, TimeoutError):
        return TimeoutError(f"cannot heal: the actors made again on {where} were not ready in time ({cause}); "
                            f"{state}; call heal() again with a longer timeout, or go on without them with shrink()")
    what = ("an actor's __init__ raised on it" if isinstance(exc, ActorError) else
            "a replacement died" if isinstance(exc, SupervisionError) else "it failed")
    return RuntimeError(f"cannot heal: replacing {where} failed, {what}: {type(exc).__name__}: {cause}; {state}; "
                        "fix the cause and call heal() again, or go on without them with shrink()")


def _drop_attached(rt: Any, key: Any, reports: dict[int, str], addrs: tuple[Addr, ...]) -> None:
    # What was attached to the mesh was built over the dead processes: an object that can follow the
    # heal (the tensor engine's client: ``follow_heal(reports, addrs)``) is told, before its actor mesh
    # is re-pointed to the replacements; any other is closed, and made anew on its next use.
    node = rt.owners.get(key)
    if node is None:
        return
    for child in list(node.children):
        if child.kind is Kind.ATTACHED:
            follow = getattr(child.payload, "follow_heal", None)
            if follow is not None:
                follow(reports, addrs)
            else:
                child.start_close("the process mesh was healed")


def _remake(rt: Any, key: Any, owned: Owned, moved: dict[Addr, Addr]) -> Future[None] | None:
    """Make again the actors of mesh ``key`` whose processes moved; the future of their ``__init__``.

    The mesh itself is not touched: the heal re-points it once every ``__init__`` has returned.
    """
    recipe = owned.recipe
    if recipe is None:
        return None
    old = owned.addrs
    addrs = tuple(moved.get(a, a) for a in old)
    shape: Shape = owned.shape
    fut: Future[None] = Future(f"{owned.name}.initialized")
    waiting = Gather(fut, f"{owned.name}.__init__", shape, list(addrs), values=False)
    again = [rank for rank, a in enumerate(old) if a in moved]
    waiting.skip(rank for rank in range(len(addrs)) if rank not in again)
    port_id = rt.ports.open(waiting)
    port = (rt.addr, port_id)
    sizes = tuple(b.nbytes for b in recipe.buffers) if recipe.buffers else None
    for rank in again:
        point = (rank, shape.labels, shape.sizes)
        frame = protocol.spawn(sizes, key, owned.name, point, recipe.is_async, recipe.body, port, recipe.creator,
                               recipe.path)
        try:
            rt.multicast.post(addrs[rank], frame, recipe.buffers)
        except ConnectionError as exc:
            if waiting.fail(addrs[rank], str(exc)):
                rt.ports.close(port_id)
    return fut
