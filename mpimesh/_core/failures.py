"""Failure reconciliation: which processes are dead, and who hears of it.

A death is known from up to three sources, which must agree on one report:

* the controller's own watch (``_roles.liveness``: a pidfd, last words,
  heartbeats), which gives the cause, the pid and the host;
* the controller's DEAD frame, which carries that report to every other
  process;
* ULFM's ``MPI_ERR_PROC_FAILED``, which often arrives first but says nothing
  of the cause (and, on a worker, nothing of the pid or host either).

So a ULFM report waits ``_MPI_REPORT_GRACE`` for the fuller one before it is
taken as the cause.  Once a process is dead, :meth:`Failures.apply_dead` fails
every wait on it (the port table) and hands a :class:`~mpimesh.MeshFailure`
to the owner of each actor mesh it hosted: the owning actor's
``__supervise__``, or the role's :meth:`Role.unhandled` at the top.  Who
owns a mesh is read from the ownership tree (``_core.owners``), where the
mesh's node keeps its :class:`Owned` record.

What differs between the controller and a worker (who declares a death, who
is told, whether the job survives it) is the role's, through :class:`Role`.
"""

from __future__ import annotations

import time
import weakref
from typing import TYPE_CHECKING, Any, Protocol

from ..supervision import MeshFailure
from . import journal, protocol
from .logs import warn
from .owners import Kind, Node, Owners
from .protocol import CONTROLLER, Frame

if TYPE_CHECKING:
    from .._transport.bell import Ringer
    from .._transport.peers import Peers
    from ..shape import Shape
    from .ports import PortTable

__all__ = ["Failures", "Owned", "Owner", "Role"]

Addr = tuple[int, int]

# How long a process waits for the fuller report of a death that ULFM told it
# about first (a worker: the controller's DEAD notice; the controller: its
# pidfd), before failing its waits with ULFM's poorer message.
_MPI_REPORT_GRACE = 0.2


class Rerouter(Protocol):
    """What re-routes casts around a dead process (``_core.multicast.Multicast``)."""

    def dead(self, addr: Addr) -> None:
        """``addr`` has died: resend what it was to forward."""
        ...


class Owner(Protocol):
    """An actor that owns meshes (``_core.actor_cell.ActorCell``)."""

    def supervise(self, failure: MeshFailure) -> None:
        """Hand ``failure`` to the actor's ``__supervise__``, in mailbox order."""
        ...


class Owned:
    """An actor mesh this process spawned, kept (by its node in the ownership tree) to report its failures.

    Args:
        name: the mesh's name.
        class_name: its actor class's ``__qualname__``.
        addrs: the process of each of its ranks.
        shape: its shape (for the coordinates in reports).
        recipe: how its actors were made (``_core.heal.Recipe``), so that a
            heal can make a dead rank's actor again; None where that is not possible.
    """

    __slots__ = ("name", "class_name", "addrs", "shape", "recipe", "handles")

    def __init__(
        self, name: str, class_name: str, addrs: tuple[Addr, ...], shape: Shape, recipe: Any = None
    ) -> None:
        self.name = name
        self.class_name = class_name
        self.addrs = addrs
        self.shape = shape
        self.recipe = recipe
        #: this process's handles on the mesh (its ``MeshRef`` and every view of it), which a heal re-points
        self.handles: weakref.WeakSet[Any] = weakref.WeakSet()

    def failure(self, ranks: list[int], cause: str) -> MeshFailure:
        """The failure of ``ranks`` of this mesh, for ``cause``."""
        coords = [self.shape.coordinates(r) for r in ranks]
        points = [str(self.shape.point(r)) if self.shape.labels else "" for r in ranks]
        return MeshFailure(self.name, ranks, cause, self.class_name, coords, points=points)


class Role(Protocol):
    """What a process's role decides about deaths (``_roles.controller``, ``_roles.worker``)."""

    @property
    def fault_tolerant(self) -> bool:
        """Whether this process's job outlives the death of one of its processes."""
        ...

    def record_death(self, addr: Addr, cause: str) -> str:
        """Bookkeeping for the death of ``addr``; returns the report every process gets."""
        ...

    def live_addrs(self) -> list[Addr]:
        """The processes to tell about a death this process declares."""
        ...

    def fatal(self, report: str) -> None:
        """End the job after a death it cannot survive."""
        ...

    def unhandled(self, failure: MeshFailure) -> None:
        """A failure reached the top: no actor owns the mesh that failed."""
        ...

    def settle_mpi_report(self, addr: Addr, text: str) -> bool:
        """MPI reported ``addr`` failed; returns whether the role has settled it (no grace needed)."""
        ...


class FailuresRuntime(Protocol):
    """What failure reconciliation uses of its process's runtime."""

    @property
    def role(self) -> Role: ...

    @property
    def ports(self) -> PortTable: ...

    @property
    def ringer(self) -> Ringer | None: ...

    @property
    def multicast(self) -> Rerouter: ...

    @property
    def peers(self) -> Peers: ...

    @property
    def owners(self) -> Owners: ...

    def send(self, dest: Addr, frame: Frame) -> None: ...


class Failures:
    """The dead processes, and what follows a death for the meshes this process owns.

    Args:
        process: this process's runtime.
    """

    def __init__(self, process: FailuresRuntime) -> None:
        self._process = process
        #: addr -> report, for every process known dead
        self.dead: dict[Addr, str] = {}
        # peers ULFM reported failed, waiting for the fuller report: addr -> (when, ULFM's text)
        self._mpi_reported: dict[Addr, tuple[float, str]] = {}
        #: replacements a heal makes actors on before a mesh holds them (``_core.heal``): the heal reports their faults
        self.healing: set[Addr] = set()

    def mpi_failed(self, addrs: list[Addr], text: str) -> None:
        """ULFM reported ``addrs`` failed (the router's callback): settle now, or after the grace."""
        role = self._process.role
        for addr in addrs:
            if addr in self.dead or role.settle_mpi_report(addr, text):
                continue
            self._mpi_reported.setdefault(addr, (time.monotonic(), text))

    def settle_reported(self, addr: Addr, cause: str) -> None:
        """The fuller report of a death ULFM reported (its host's watcher's): declare it now with ``cause``."""
        if self._mpi_reported.pop(addr, None) is not None:
            self.declare_dead(addr, cause)

    def check_reported(self) -> None:
        """Declare dead the ULFM reports whose grace has run out (run about once per millisecond)."""
        if not self._mpi_reported:
            return
        now = time.monotonic()
        for addr, (when, text) in list(self._mpi_reported.items()):
            if addr in self.dead:
                del self._mpi_reported[addr]
            elif now - when > _MPI_REPORT_GRACE:
                del self._mpi_reported[addr]
                self.declare_dead(addr, f"reported failed by MPI ({text})")

    def declare_dead(self, addr: Addr, cause: str) -> None:
        """This process has found ``addr`` dead: record it, tell the others, fail its waits, supervise."""
        if addr in self.dead:
            return
        role = self._process.role
        report = role.record_death(addr, cause)
        frame = protocol.dead(addr, report)
        for other in role.live_addrs():
            try:
                self._process.send(other, frame)
            except ConnectionError:
                pass
        self.apply_dead(addr, report)
        if not role.fault_tolerant:
            role.fatal(report)

    def apply_dead(self, addr: Addr, report: str) -> None:
        """``addr`` is dead: fail every wait on it and tell the owners of its actors."""
        if addr in self.dead:
            return
        self.dead[addr] = report
        journal.event("dead", report, addr=addr)
        ringer = self._process.ringer
        if ringer is not None:
            ringer.forget(addr)
        if addr == CONTROLLER:
            return
        self._process.ports.fail_source(addr, report)
        self._process.multicast.dead(addr)
        self._process.peers.dead(addr)
        owners = self._process.owners
        for node in owners.of_kind(Kind.ACTOR_MESH):
            owned: Owned = node.payload
            ranks = [r for r, a in enumerate(owned.addrs) if a == addr]
            if ranks:
                self.supervise(owners.actor_of(node), owned.failure(ranks, report))

    def supervise(self, owner: Owner | None, failure: MeshFailure) -> None:
        """Deliver ``failure`` to the owner actor, or to the role at the top."""
        journal.event("failure", failure.cause, mesh=failure.mesh_name, ranks=list(failure.crashed_ranks))
        if owner is not None:
            owner.supervise(failure)
            return
        self._process.role.unhandled(failure)

    # --- frames -----------------------------------------------------------------------------------

    def on_fault(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """FAULT: an actor of a mesh this process spawned has failed."""
        _, _, key, rank, report = frame
        owners = self._process.owners
        node: Node | None = owners.get(key)
        if node is None or node.kind is not Kind.ACTOR_MESH:
            warn(f"failure of an actor whose mesh is gone:\n{report}")
            return
        # The actor's rank now, from its process: a shrink renumbers the ranks its spawn gave it.
        ranks = [r for r, a in enumerate(node.payload.addrs) if a == src]
        if not ranks and src in self.healing:
            return  # an actor a heal made on a replacement no mesh holds: the heal raises its error
        ranks = ranks or [rank]
        self.supervise(owners.actor_of(node), node.payload.failure(ranks, report))

    def on_dead(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """DEAD: the controller declared a process dead."""
        _, _, addr, report = frame
        self.apply_dead(addr, report)

    def on_unreachable(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """UNREACHABLE: the controller could not relay a frame of this process to a process that is gone.

        Fails every wait on it, and resends around it the casts it was to
        forward, as a death would; but it is not recorded dead (it stopped).
        """
        _, _, addr, report = frame
        self._process.ports.fail_source(addr, report)
        self._process.multicast.dead(addr)
