"""The MPI communicators under the ``"mpimesh"`` torch.distributed backend: who the world is, and joining it.

Whoever makes a process a rank of a torch.distributed world tells it which
processes the world is (:func:`remember`: ``setup_torch_elastic_env`` gives
its process mesh, the tensor engine the mesh of its global-view tensors):
the backend watches those processes while a collective waits (a dead one
fails the collective at once instead of hanging it).  The world's communicator is made when the
default process group is, from the rendezvous store torch gives every
backend: each rank posts its MPI address (``(MPI world, rank)``); ranks of
one MPI world (the launch pool, or one spawn) get a sub-communicator of
``MPI_COMM_WORLD`` with ``MPI_Comm_create_group``, collective over the
members only (``MPI_Comm_create_from_group`` once a process of the job has
died, a world made again after a heal); worlds that differ (pool ranks and spawned islands) are joined
island by island with ``MPI_Comm_accept``/``MPI_Comm_connect`` on ports the
first rank opens and posts in the store, then merged.  Ranks of the result
are torch's ranks.  This module imports no torch.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, cast

from .._transport import live
from .._transport.mpi import MPI, alone, dynamic
from ..config import settings
from ..context import context

__all__ = ["Liveness", "World", "backend_choice", "forget", "island_comm", "join", "join_islands", "remember",
           "subgroup", "world"]

Addr = tuple[int, int]

#: ``MPI_Comm_create_group`` tags: the world's communicator, and a sub-group's.
_WORLD_TAG = 7801
_GROUP_TAG = 7802


class Liveness(Protocol):
    """The processes of a world, as the backend watches them: a :class:`mpimesh.ProcMesh` in rank order is one."""

    def dead(self) -> dict[int, str]:
        """The world ranks known dead, each with the report of its death."""


class World:
    """The processes of this process's torch.distributed world, and its backend choice.

    Args:
        mesh: the world's processes in rank order (``setup_torch_elastic_env``'s mesh).
        rank: this process's rank in it.
        backend: what :func:`mpimesh.spmd.default_backend` gives here
            (None: nccl or gloo by device).
        tag: not empty once a process of the job has died (a world made
            again after a heal): the communicators are made from the group
            alone, under this tag (:func:`island_comm`).
    """

    def __init__(self, mesh: Liveness, rank: int, backend: str | None, tag: str = "") -> None:
        self.mesh = mesh
        self.rank = rank
        self.backend = backend
        self.tag = tag

    def dead(self, ranks: list[int] | None = None) -> dict[int, str]:
        """The world ranks among ``ranks`` (None: all) known dead here, each with the report of its death."""
        dead = self.mesh.dead()
        if not dead or ranks is None:
            return dead
        return {r: dead[r] for r in ranks if r in dead}


_lock = threading.Lock()
_world: list[World] = []  # at most one: the last world this process was set up for


def remember(mesh: Liveness, rank: int, backend: str | None, tag: str = "") -> None:
    """This process is rank ``rank`` of the world ``mesh`` (``setup_torch_elastic_env`` and the engine call it)."""
    with _lock:
        _world[:] = [World(mesh, rank, backend, tag)]


def forget(mesh: Liveness) -> None:
    """The world of ``mesh`` ended (its default group was destroyed): this process is in none now."""
    with _lock:
        if _world and _world[0].mesh is mesh:
            _world.clear()


def world() -> World | None:
    """The world this process was last set up for, or None."""
    with _lock:
        return _world[0] if _world else None


def backend_choice() -> str | None:
    """The backend ``setup_torch_elastic_env(backend=...)`` chose for this process's world, or None."""
    w = world()
    return None if w is None else w.backend


# --- making the communicators


def island_comm(addrs: list[Addr] | tuple[Addr, ...], island: int, tag: str = "",
                group_tag: int = _WORLD_TAG) -> MPI.Intracomm:
    """The members of ``addrs`` in MPI world ``island`` (this process's), in their order; collective over them only.

    ``tag`` empty: ``MPI_Comm_create_group`` on ``MPI_COMM_WORLD`` (tag
    ``group_tag``).  ``tag`` set (once a process of the job has died):
    ``MPI_Comm_create_from_group`` under it, which involves the members
    only; under ULFM ``MPI_Comm_create_group`` fails with
    ``MPI_ERR_PROC_FAILED`` once the world holds a dead process, even for a
    group without it.  Either is made while no other thread of the runtime
    calls MPI (:func:`mpimesh._transport.mpi.alone`): both end in Open MPI's
    communicator activation, which waited for ever beside the wire's polling
    in about a third of the tries (tests/tensor/test_comm_from_group.py).
    """
    world = MPI.COMM_WORLD
    group = world.Get_group().Incl([r for i, r in addrs if i == island])
    try:
        with alone():
            if not tag:
                return world.Create_group(group, tag=group_tag)
            comm = live.create_from_group(group, f"{tag}:{island}")
        if comm is None:  # no group construct here (srun --mpi=pmix): on the world shrunk to the live
            comm = live.create_group(group, group_tag, settings.spawn_timeout)
        return comm
    finally:
        group.Free()


def join_islands(local: MPI.Intracomm, islands: list[int], mine: int, ports: list[str] | tuple[str, ...],
                 rank: int) -> MPI.Intracomm | None:
    """Join the islands' communicators into one, rank ``rank`` here; None if this process was left out.

    ``local`` is this process's island's part (:func:`island_comm`, freed
    here), ``mine`` its island's index in ``islands``, ``ports`` one port per
    further island, opened by the first island's first member.  The first
    island accepts each further island in turn (``MPI_Comm_accept``), the
    joined part growing by one island at every step; the last ``Split``
    orders the ranks.  The accept and the connect wait for the other side
    and are made outside :func:`alone` (the wire must run meanwhile); the
    merges and the split, between members already joined, are not.
    """
    joined: MPI.Intracomm | None = local if mine == 0 else None
    for k in range(1, len(islands)):
        if joined is not None:  # already in: accept island k
            inter = joined.Accept(ports[k - 1], root=0)
            with alone():
                merged = inter.Merge(high=False)
        elif k == mine:  # island k: connect
            with dynamic:
                inter = local.Connect(ports[k - 1], root=0)
            with alone():
                merged = inter.Merge(high=True)
        else:
            continue
        inter.Free()
        if joined is not None and joined is not local:
            joined.Free()
        joined = merged
    if joined is None:
        local.Free()
        return None
    with alone():
        final = cast(MPI.Intracomm, joined.Split(0, rank))
    if joined is not local:
        joined.Free()
    local.Free()
    return final


def join(store: Any, rank: int, size: int, timeout_s: float) -> MPI.Intracomm:
    """The communicator of the world's ``size`` processes, rank ``rank`` here; collective over them.

    ``store`` is the group's rendezvous store (keys under ``mpimesh/``).
    After a death (a world remembered with a tag, :func:`remember`) each
    island's part is made from the group alone (:func:`island_comm`).

    Raises:
        RuntimeError: this process is not an mpimesh process, or the store
            gave no address of a rank within its timeout.
    """
    # this process's ProcMesh through the context (a value leaf): the proc_mesh module sits on
    # the tensor engine's lazy way in, and an import of it from here would close a circle
    me = cast(Addr, tuple(context().actor_instance.proc.addresses[0]))
    store.set(f"mpimesh/addr/{rank}", f"{me[0]} {me[1]}")
    addrs: list[Addr] = []
    for r in range(size):
        island, mpi_rank = store.get(f"mpimesh/addr/{r}").decode().split()
        addrs.append((int(island), int(mpi_rank)))
    if len(set(addrs)) != size:
        raise RuntimeError(f"mpimesh backend: two ranks of the world are one MPI process ({addrs}); "
                           "give each rank its own process")
    w = world()
    islands = list(dict.fromkeys(i for i, _ in addrs))
    local = island_comm(addrs, me[0], "" if w is None else w.tag)
    if len(islands) == 1:
        return local
    if rank == 0:
        ports = [MPI.Open_port() for _ in islands[1:]]
        store.set("mpimesh/ports", "\n".join(ports))
    else:
        ports = store.get("mpimesh/ports").decode().split("\n")
    try:
        final = join_islands(local, islands, islands.index(me[0]), ports, rank)
    finally:
        if rank == 0:
            for port in ports:
                MPI.Close_port(port)
    if final is None:
        raise RuntimeError(f"mpimesh backend: rank {rank} was not joined to its world {addrs}")
    return final


def subgroup(parent: MPI.Intracomm, ranks: list[int]) -> MPI.Intracomm:
    """The communicator of ``parent``'s ``ranks``, in that order; collective over them only (``new_group``).

    Made under :func:`alone`, as :func:`island_comm` is.
    """
    group = parent.Get_group().Incl(ranks)
    try:
        with alone():
            return parent.Create_group(group, tag=_GROUP_TAG)
    finally:
        group.Free()
