"""Process meshes and host meshes: where actors live.

A process mesh that ``spawn_procs`` made is adopted by its maker (the calling
actor, or the script) in the runtime's ownership tree (``_core.owners``);
what is attached to it (:meth:`ProcMesh.attach`) hangs under it there, and
``stop()`` closes that first.
"""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from functools import partial
from types import ModuleType
from typing import Any, TypeVar, cast

from ._core import calls as _calls
from ._core import heal as _heal
from ._core import hooks as _hooks
from ._core import serialize as _serialize
from ._core import shrink as _shrink
from ._waits import when_all
from .actor import Actor, endpoint_table
from .actor_mesh import ActorMesh
from .config import settings
from .context import register_this_proc
from .future import Future
from .shape import MeshTrait, Shape

__all__ = [
    "HostMesh", "ProcMesh", "get_or_spawn_controller", "heal_mesh", "host_mesh", "shutdown_context", "this_host",
    "this_proc",
]

T = TypeVar("T")
Addr = tuple[int, int]


class ProcMesh(MeshTrait):
    """A shaped set of worker processes; ``spawn`` puts actors on them.

    Returned by :meth:`HostMesh.spawn_procs` and :func:`this_proc`.  Slices
    and pickled copies are references: they can spawn actors but not stop
    the processes.
    """

    def __init__(
        self,
        shape: Shape,
        addrs: tuple[Addr, ...],
        hosts: tuple[str, ...],
        *,
        key: tuple[int, int, int],
        owned: bool = False,
    ) -> None:
        self._shape = shape
        self._addrs = addrs
        self._hosts = hosts
        self._key = key
        self._owned = owned
        self._stopped = False

    def _new_with_shape(self, shape: Shape) -> ProcMesh:
        return ProcMesh(shape, self._addrs, self._hosts, key=self._key)

    def __repr__(self) -> str:
        return f"ProcMesh({self._sizes_repr()})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._shape, self._addrs, self._hosts, self._key))

    @property
    def initialized(self) -> Future[bool]:
        """Done (``True``): processes are ready when ``spawn_procs`` returns."""
        return Future.completed(True, "ProcMesh.initialized")

    @property
    def host_mesh(self) -> HostMesh:
        """The hosts these processes run on, in the order of their first process (dimension ``hosts``)."""
        hosts = tuple(dict.fromkeys(self._hosts[i] for i in self._shape.ranks()))
        return HostMesh(Shape.row_major(("hosts",), (len(hosts),)), hosts)

    def spawn(self, name: str, Class: type[T], *args: Any, **kwargs: Any) -> T:
        """Create one ``Class(*args, **kwargs)`` actor on every process of this mesh.

        Returns at once with an :class:`ActorMesh` (typed as ``Class`` so that
        editors complete its endpoints).  ``__init__`` runs before any message
        to the actor; ``mesh.initialized.get()`` waits for it.

        Raises:
            TypeError: ``Class`` is not an Actor subclass, or the arguments do not pickle.
            ValueError: ``Class`` mixes ``def`` and ``async def`` endpoints.
            RuntimeError: the mesh was stopped.
        """
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"actor mesh name must be a non-empty str, got {name!r}; e.g. procs.spawn('trainers', Trainer)"
            )
        if not (isinstance(Class, type) and issubclass(Class, Actor)):
            raise TypeError(
                f"cannot spawn {Class!r} on {self!r}: it is not an Actor subclass; "
                "define it as `class MyActor(mpimesh.Actor)`"
            )
        if self._stopped:
            # Monarch's phrase, which its users match on ("`ProcMesh` has already been stopped")
            raise RuntimeError(
                f"cannot spawn on {self!r}: `ProcMesh` has already been stopped; "
                "create new processes with spawn_procs()"
            )
        table = endpoint_table(Class)  # type: ignore[arg-type]
        is_async = any(info.is_async for info in table.values())
        methods = frozenset(
            n for n, m in inspect.getmembers(Class, callable) if not n.startswith("_") and n not in table
        )
        try:
            # Heavy modules the creator has loaded (settings.preload: torch): modules pickle by
            # reference, so unpickling the body imports them while the actor is created.  Workers
            # never import torch by themselves (their loop stays light), and importing it at the
            # first tensor argument made that call take ~1.3 s instead of milliseconds
            # (docs/design/hosts.md, 3.3).
            preload = tuple(sys.modules[m] for m in settings.preload if m in sys.modules)
            body, buffers = _serialize.dumps(
                (preload, Class, args, kwargs, ProcMesh(self._shape, self._addrs, self._hosts, key=self._key))
            )
        except Exception as exc:
            raise TypeError(
                f"cannot pickle the arguments of {Class.__qualname__} for actor mesh {name!r}: {exc}; "
                "pass data that pickles, or create the object inside __init__"
            ) from exc
        addrs = [self._addrs[i] for i in self._shape.ranks()]
        ref, initialized = _calls.MeshRef.spawn(
            name, f"{Class.__module__}.{Class.__qualname__}", self._shape, addrs, is_async, body, buffers,
            [self._hosts[i] for i in self._shape.ranks()],
        )
        mesh: ActorMesh[T] = ActorMesh(
            ref=ref,
            name=name,
            class_name=Class.__qualname__,
            endpoints=table,
            methods=methods,
            initialized=initialized,
            owned=True,
        )
        return cast(T, mesh)

    def activate(self) -> AbstractContextManager[ProcMesh]:
        """Make this mesh the active one: ``with procs.activate():`` torch calls run on its processes.

        Inside the block, torch factory functions and operations make
        :class:`mpimesh.Tensor` handles (the tensor engine, :mod:`mpimesh.tensor`;
        imports torch).  Leaving the block sends what is queued without waiting.
        """
        return _tensor_engine().activate(self)  # type: ignore[no-any-return]

    def rank_tensor(self, dim: str) -> Any:
        """A mesh tensor holding each process's coordinate along ``dim`` (see :mod:`mpimesh.tensor`)."""
        return _tensor_engine().rank_tensor(self, dim)

    def rank_tensors(self) -> dict[str, Any]:
        """:meth:`rank_tensor` for every dimension."""
        return _tensor_engine().rank_tensors(self)  # type: ignore[no-any-return]

    def attach(self, name: str, make: Callable[[], T], close: Callable[[T], None] | None = None) -> T:
        """The object ``name`` kept with these processes: made by ``make()`` on first use, from any view of this mesh.

        The object lives as long as the mesh: :meth:`stop` closes it first
        (``close(obj)``, if given) and lets it go.  The tensor engine keeps
        its client of a mesh this way.  On a mesh this process did not spawn
        (a received one, :func:`this_proc`) it is kept until the job ends.

        Raises:
            RuntimeError: the mesh was stopped.
        """
        try:
            return cast(T, _calls.attach(self._key, name, make, close))
        except LookupError:
            raise RuntimeError(
                f"cannot attach {name!r} to {self!r}: `ProcMesh` has already been stopped; "
                "create new processes with spawn_procs()"
            ) from None

    def heal(self, *, timeout: float | None = None) -> ProcMesh:
        """Replace this mesh's dead processes in place and make their actors again; returns this mesh.

        The mesh keeps its shape: each dead process is replaced by a spare
        (a launch-pool rank no mesh holds: one of the dead process's host
        first, then of any host; ``mpimesh run --spares-per-host K`` keeps
        some), else by a process spawned on that host (or on the
        controller's, when the host is lost).  Every actor mesh spawned on
        it from this process gets a new actor on each replacement, made
        with the mesh's original constructor arguments (``__init__`` runs
        again: restore its state from a survivor or a checkpoint); the
        actors of healthy processes are not touched, and calls to them go
        on during the heal.  Slices and handles taken before the heal by
        this process follow it; a mesh handed to another actor does not
        (hand it again).  Blocks until the new actors are initialized.  A
        mesh with no dead process is returned as it is.  All or nothing: if
        a replacement dies or a re-made actor's ``__init__`` raises, this mesh
        and its actor meshes are left as they were (the dead ranks still
        dead) and the replacements are given back.

        Args:
            timeout: seconds to wait for the new actors (default ``MPIMESH_SPAWN_TIMEOUT``).

        Raises:
            RuntimeError: this is a reference (a slice or a received mesh), the mesh
                was stopped, it is healed from an actor, there is no spare
                and spawning failed (the message says what to launch instead),
                or the heal failed and was undone: a replacement died or a
                re-made actor's ``__init__`` raised (the message names the
                rank and the cause; ``__cause__`` is the ``SupervisionError``
                or ``ActorError``).
            TimeoutError: the new actors were not ready in time (undone as well).
        """
        if not self._owned:
            raise RuntimeError(
                f"cannot heal {self!r}: it is a reference (a slice or a received mesh); "
                "call heal() on the mesh that spawn_procs() returned"
            )
        if self._stopped:
            raise RuntimeError(
                f"cannot heal {self!r}: `ProcMesh` has already been stopped; create new processes with spawn_procs()"
            )
        healed = _heal.heal(self._key, list(self._shape.ranks()), self._addrs, self._hosts, timeout=timeout)
        self._addrs, self._hosts = healed.addrs, healed.hosts
        return self

    def shrink(self) -> ProcMesh:
        """Go on with fewer processes (elastic): a new, smaller mesh of this mesh's live processes.

        This mesh hands its live processes over to the new one and is then
        stopped without stopping them (``spawn`` and ``shrink`` on it raise,
        ``stop`` does nothing); its dead processes are given up.  When the dead
        ranks make up whole slices along one dimension (every process of
        host 1 of a ``(hosts=2, gpus=4)`` mesh), the new mesh keeps the
        dimensions with that one smaller (``hosts=1, gpus=4``); otherwise
        its survivors form one dimension ``rank`` (as :meth:`base_mesh`
        names it).  Survivors keep their order, renumbered from 0.  A mesh
        with no dead process is returned as it is.

        Every actor mesh spawned on this mesh (or a slice of it) from this
        process follows in place, by the same rule applied to its own
        shape: the actor mesh that ``spawn`` returned now addresses its
        surviving actors, the same objects with their state, in the new
        coordinates, which calls made after the shrink carry
        (``current_rank()``).  Views of part of an actor mesh taken before
        the shrink keep the old coordinates: slice the mesh again.  What
        was attached to this mesh is closed, but for the tensor engine's
        client, which follows: tensors made on this mesh (not on a slice)
        now belong to the new one, with the survivors' local tensors.
        Later deaths are reported in the new coordinates, and ``stop()``
        on the new mesh gives its processes back.

        Raises:
            RuntimeError: this is a reference (a slice or a received mesh), the
                mesh was stopped, or every one of its processes has died.
        """
        if not self._owned:
            raise RuntimeError(
                f"cannot shrink {self!r}: it is a reference (a slice or a received mesh); "
                "call shrink() on the mesh that spawn_procs() returned"
            )
        if self._stopped:
            raise RuntimeError(
                f"cannot shrink {self!r}: `ProcMesh` has already been stopped; create new processes with spawn_procs()"
            )
        dead = _calls.here().dead
        if not any(a in dead for a in self._addrs):
            return self
        new = _shrink.shrink(self._key, self._shape, self._addrs, self._hosts, repr(self))
        self._stopped = True
        procs = ProcMesh(new.shape, new.addrs, new.hosts, key=new.key, owned=True)
        _calls.own_procs(new.key, repr(procs), procs.stop)
        for name, adopt in new.followers:  # the tensor engine's client goes on with the survivors' tensors
            procs.attach(name, partial(adopt, self, procs))
        return procs

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor on these processes and give the processes back.

        Launch-pool processes return to the pool; spawned processes exit.
        What is attached to the mesh (:meth:`attach`) closes first.

        Raises:
            RuntimeError: this is a reference (a slice or a received mesh).
        """
        if not self._owned:
            raise RuntimeError(
                f"cannot stop {self!r}: it is a reference (a slice or a received mesh); "
                "call stop() on the mesh that spawn_procs() returned"
            )
        if self._stopped:
            return Future.completed(None, "ProcMesh.stop()")
        self._stopped = True
        return _calls.stop_procs(self._key, [self._addrs[i] for i in self._shape.ranks()], reason)

    def __enter__(self) -> ProcMesh:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            self.stop().get()

    async def __aenter__(self) -> ProcMesh:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._owned:
            await self.stop()

    # --- What a layer built on the public API (the tensor engine, spmd) reads of a process mesh.

    @property
    def mesh_id(self) -> tuple[int, int, int]:
        """The job-wide id of the processes this mesh was made as: the same for its slices and copies."""
        return self._key

    @property
    def view_shape(self) -> Shape:
        """This view's shape: its dimensions, and the index of each of its processes in :meth:`base_mesh`."""
        return self._shape

    def same_view(self, other: ProcMesh) -> bool:
        """Whether ``other`` is the same processes in the same shape (the same mesh or slice, or a copy of it)."""
        return other is self or (other._key == self._key and other._shape == self._shape)

    @property
    def stopped(self) -> bool:
        """Whether :meth:`stop` was called on this mesh (a slice or copy never says so)."""
        return self._stopped

    @property
    def hostnames(self) -> list[str]:
        """The host name of each process of this mesh, in rank order (:attr:`host_mesh` names each host once)."""
        return [self._hosts[i] for i in self._shape.ranks()]

    @property
    def addresses(self) -> list[tuple[int, int]]:
        """The ``(MPI world, rank)`` address of each process of this mesh, in rank order."""
        return [self._addrs[i] for i in self._shape.ranks()]

    def base_mesh(self) -> ProcMesh:
        """Every process of the mesh this view was sliced from, in one dimension ``rank``: a reference.

        Its rank ``i`` is the process that every view's
        ``view_shape.ranks()`` numbers ``i``.
        """
        return ProcMesh(Shape.row_major(("rank",), (len(self._addrs),)), self._addrs, self._hosts, key=self._key)

    def dead(self) -> dict[int, str]:
        """The processes of this mesh known to have died, by rank, each with the report of its death."""
        dead = _calls.here().dead
        if not dead:
            return {}
        addrs = self._addrs
        return {rank: dead[addrs[i]] for rank, i in enumerate(self._shape.ranks()) if addrs[i] in dead}


def _tensor_engine() -> ModuleType:
    """The tensor engine, :mod:`mpimesh.tensor`, imported on first use: the one way in from the meshes.

    It sits above this module (it imports torch, and uses meshes through
    their public methods only), so ``import mpimesh`` never imports torch.
    """
    from . import tensor

    return tensor


def _rebuild(shape: Shape, addrs: tuple[Addr, ...], hosts: tuple[str, ...], key: tuple[int, int, int]) -> ProcMesh:
    return ProcMesh(shape, addrs, hosts, key=key)


class _Bootstrap(Actor):
    """Runs a ``spawn_procs(bootstrap=...)`` callable on every new process."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        result = fn()
        if inspect.isawaitable(result):
            import asyncio

            asyncio.run(result)  # type: ignore[arg-type]


class HostMesh(MeshTrait):
    """Hosts that can run processes: :func:`this_host` (the caller's) or :func:`host_mesh` (the job's).

    A host mesh slices like any mesh (``host_mesh().slice(hosts=0)``);
    :meth:`spawn_procs` starts processes on each of its hosts.
    """

    def __init__(self, shape: Shape, hosts: tuple[str, ...]) -> None:
        self._shape = shape
        self._hosts = hosts

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._hosts)

    @property
    def hostnames(self) -> list[str]:
        """The host names of this mesh, in its order (as MPI's processor name gives them)."""
        return [self._hosts[i] for i in self._shape.ranks()]

    def __repr__(self) -> str:
        if not self._shape.labels:
            return f"HostMesh({self.hostnames[0]!r})"
        return f"HostMesh({self._sizes_repr()})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (HostMesh, (self._shape, self._hosts))

    def spawn_procs(
        self,
        per_host: Mapping[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        proc_bind: Any = None,
        bootstrap_command: Any = None,
    ) -> ProcMesh:
        """Start ``per_host`` worker processes on every host of this mesh; blocks until they are ready.

        On each host, the launch pool's free ranks of that host are used
        first (ranks 1..N-1 of ``mpirun -n N``, in rank order), then new
        processes are spawned on that very host (``MPI_Comm_spawn`` with the
        ``host`` info key).  The mesh's dimensions are this mesh's followed
        by those of ``per_host``: ``this_host().spawn_procs(per_host={"gpus":
        4})`` has sizes ``gpus=4``, ``host_mesh().spawn_procs(per_host={"gpus":
        4})`` has ``hosts=H, gpus=4`` with each ``gpus`` row on its own host,
        so ``current_rank()["gpus"]`` is the process's index on its host
        (e.g. for ``torch.cuda.set_device``).

        Args:
            per_host: dimension name -> size, e.g. ``{"gpus": 8}``; none: one
                process per host.
            bootstrap: a callable run on every new process before any actor.
            name: accepted for Monarch compatibility.
            proc_bind: not supported: bind with the launcher instead.
            bootstrap_command: not supported: processes run ``python -m mpimesh``.

        Raises:
            TypeError, ValueError: ``per_host`` is malformed.
            NotImplementedError: ``proc_bind`` or ``bootstrap_command`` was given.
            RuntimeError: the pool has no room on a host and MPI could not spawn there.
        """
        if proc_bind is not None:
            raise NotImplementedError(
                "spawn_procs(proc_bind=...) is not supported by mpimesh; bind with the launcher "
                "(`mpirun --bind-to core` or `srun --cpu-bind=cores`)"
            )
        if bootstrap_command is not None:
            raise NotImplementedError(
                "spawn_procs(bootstrap_command=...) is not supported by mpimesh; set the environment with "
                "bootstrap=callable, or in the launcher"
            )
        dims = dict(per_host or {})
        if per_host is not None and not isinstance(per_host, Mapping):
            raise TypeError(
                f"per_host must be a dict of dimension name to size, got {per_host!r}; e.g. per_host={{'gpus': 4}}"
            )
        for label, size in dims.items():
            if not isinstance(label, str) or not label:
                raise TypeError(f"per_host keys must be dimension names, got {label!r}; e.g. per_host={{'gpus': 4}}")
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(
                    f"per_host[{label!r}] must be a positive int, got {size!r}; e.g. per_host={{{label!r}: 4}}"
                )
            if label in self._shape.labels:
                raise ValueError(
                    f"per_host dimension {label!r} clashes with a dimension of {self!r}; choose another name"
                )
        key, addrs, hosts = _calls.allocate_procs(math.prod(dims.values()), self.hostnames)
        shape = Shape.row_major(self._shape.labels + tuple(dims), self._shape.sizes + tuple(dims.values()))
        procs = ProcMesh(shape, tuple(addrs), tuple(hosts), key=key, owned=True)
        _calls.own_procs(key, repr(procs), procs.stop)
        if bootstrap is not None:
            boot = procs.spawn("_bootstrap", _Bootstrap, bootstrap)
            try:
                boot.initialized.get()  # type: ignore[attr-defined]
            finally:
                boot.stop().get()  # type: ignore[attr-defined]
        return procs


def shutdown_context() -> Future[None]:
    """Stop every process mesh this process spawned and has not stopped yet; idempotent.

    Monarch's global teardown.  Returns at once; the future is done once
    every one of those meshes has stopped (their actors' ``__cleanup__`` has
    run and their processes are given back), and raises the first error a
    stop raised.  Meshes spawned later are not affected; the job itself
    goes on (it ends when the controller script ends).
    """
    return when_all(_calls.stop_all_procs("shutdown_context()"), "shutdown_context()")


def heal_mesh(mesh: ProcMesh, *, timeout: float | None = None) -> ProcMesh:
    """The brief's ``heal_mesh(mesh)``: :meth:`ProcMesh.heal` -- the same mesh, its dead processes replaced.

    Catch the failure, heal, and run the step again::

        try:
            result = trainers.step.call(batch).get()
        except DeviceMeshError:
            procs = heal_mesh(procs)      # trainers has a new actor on each replacement
            result = trainers.step.call(batch).get()

    Raises:
        TypeError: ``mesh`` is not a process mesh.
        RuntimeError, ActorError, TimeoutError: as :meth:`ProcMesh.heal`.
    """
    if not isinstance(mesh, ProcMesh):
        raise TypeError(
            f"heal_mesh() takes the ProcMesh that spawn_procs() returned, got {type(mesh).__name__}; "
            "for an actor mesh, heal the processes it runs on (its proc_mesh)"
        )
    return mesh.heal(timeout=timeout)


def this_host() -> HostMesh:
    """The host of the calling process, as a host mesh with no dimensions (as in Monarch).

    ``this_host().spawn_procs(per_host={"gpus": 4})`` starts 4 processes on
    this host (launch-pool ranks of this host first, then spawned), with
    sizes ``gpus=4``.  For processes on every host of the job use
    :func:`host_mesh`.
    """
    return HostMesh(Shape.unity(), (_calls.here().host,))


def host_mesh() -> HostMesh:
    """The job's hosts as a mesh with one dimension, ``hosts``, in launch order.

    The hosts are the nodes the job's ranks run on (``mpirun --host``,
    ``--hostfile``, a SLURM allocation), grouped by MPI's processor name; the
    controller's host comes first, then each host of the launch pool in
    rank order.  Monarch gets such a mesh from its job API (e.g.
    ``SlurmJob(...).state().hosts``).
    """
    hosts = tuple(_calls.job_hosts())
    return HostMesh(Shape.row_major(("hosts",), (len(hosts),)), hosts)


def this_proc() -> ProcMesh:
    """The calling process as a 0-dimensional process mesh.

    Actors spawned on it live in this very process (on the controller: in the
    controller, next to the script).
    """
    here = _calls.here()
    island, rank = here.addr
    return ProcMesh(Shape.unity(), (here.addr,), (here.host,), key=(island, rank, 0))


def get_or_spawn_controller(name: str, Class: type[T], *args: Any, **kwargs: Any) -> Future[T]:
    """The job's singleton actor ``name``: spawned once, in the controller's process; the same for every caller.

    Any code, the script or an actor on any process, gets the same actor
    mesh for the same ``name`` (the arguments of the first call win).  The
    future is done when the call returns (the actor's ``__init__`` may still
    run: ``.initialized`` waits for it); blocking meanwhile, as the
    controller answers.

    Raises:
        TypeError: ``name`` is not a non-empty str, ``Class`` is not an Actor
            subclass, or the arguments do not pickle.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"controller name must be a non-empty str, got {name!r}; "
                        "e.g. get_or_spawn_controller('registry', Registry)")
    if not (isinstance(Class, type) and issubclass(Class, Actor)):
        raise TypeError(f"cannot spawn controller {name!r} of {Class!r}: it is not an Actor subclass; "
                        "define it as `class MyActor(mpimesh.Actor)`")
    mesh = _calls.named_actor(name, Class, args, kwargs)
    return Future.completed(cast(T, mesh), f"get_or_spawn_controller({name!r})")


def _spawn_here(name: str, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return this_proc().spawn(name, cls, *args, **kwargs)


# The runtime's calls up into this module, registered once as the package is imported
# (context, a value leaf, and the controller's named actors import no mesh module).
register_this_proc(this_proc)
_hooks.register_spawn_here(_spawn_here)
