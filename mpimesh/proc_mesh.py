"""Process meshes and host meshes: where actors live."""

from __future__ import annotations

import inspect
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any, TypeVar, cast

from ._core import current as _current
from ._core import serialize as _serialize
from ._core.ports import Gather, OneReply
from ._core.protocol import CONTROLLER, Kind
from .actor import Actor, endpoint_table
from .context import context
from .future import Future
from .shape import MeshTrait, Shape

__all__ = ["HostMesh", "ProcMesh", "this_host", "this_proc"]

#: Modules that an actor's process imports before the actor, when its creator has them.
_PRELOAD = ("torch",)

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
        sizes = ", ".join(f"{k}={v}" for k, v in zip(self._shape.labels, self._shape.sizes, strict=True))
        return f"ProcMesh({sizes})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._shape, self._addrs, self._hosts, self._key))

    @property
    def initialized(self) -> Future[bool]:
        """Done (``True``): processes are ready when ``spawn_procs`` returns."""
        return Future.completed(True, "ProcMesh.initialized")

    @property
    def host_mesh(self) -> HostMesh:
        """The host mesh these processes run on."""
        hosts = tuple(sorted(set(self._hosts)))
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
        from .actor_mesh import ActorMesh

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
            raise RuntimeError(f"cannot spawn on {self!r} after stop(); create new processes with spawn_procs()")
        table = endpoint_table(Class)  # type: ignore[arg-type]
        is_async = any(info.is_async for info in table.values())
        methods = frozenset(
            n for n, m in inspect.getmembers(Class, callable) if not n.startswith("_") and n not in table
        )
        rt = _current.current()
        # A worker imports torch lazily, at the first tensor it unpickles: that
        # made the first call with a tensor 1.2-1.6 s instead of milliseconds
        # (issue #13).  The creator's torch module travels with the actor (by
        # reference), so the import is part of the actor's creation.
        preload = tuple(sys.modules[m] for m in _PRELOAD if m in sys.modules)
        try:
            body, buffers = _serialize.dumps(
                (Class, args, kwargs, ProcMesh(self._shape, self._addrs, self._hosts, key=self._key), preload)
            )
        except Exception as exc:
            raise TypeError(
                f"cannot pickle the arguments of {Class.__qualname__} for actor mesh {name!r}: {exc}; "
                "pass data that pickles, or create the object inside __init__"
            ) from exc
        key = rt.new_id()
        shape = self._shape
        addrs = [self._addrs[i] for i in shape.ranks()]
        fut: Future[None] = Future(f"{name}.initialized")
        port = (rt.addr, rt.ports.open(Gather(fut, f"{name}.__init__", shape, addrs, values=False)))
        instance = context().actor_instance
        creator = (instance.actor_id, rt.addr)
        from ._core.runtime import Owned  # noqa: PLC0415 - keeps `import mpimesh` free of MPI

        rt.owned[key] = Owned(name, Class.__qualname__, tuple(addrs), shape, instance._cell)
        sizes = tuple(b.nbytes for b in buffers) or None
        # Classes from importable modules travel by reference: the workers
        # need the spawner's sys.path (pytest, for one, extends it late).
        path = tuple(sys.path)
        for rank, addr in enumerate(addrs):
            point = (rank, shape.labels, shape.sizes)
            rt.send(addr, (Kind.SPAWN, sizes, key, name, point, is_async, body, port, creator, path), buffers)
        mesh: ActorMesh[T] = ActorMesh(
            key=key,
            name=name,
            class_name=Class.__qualname__,
            endpoints=table,
            methods=methods,
            shape=Shape.row_major(shape.labels, shape.sizes),
            addrs=tuple(addrs),
            initialized=fut,
            owned=True,
        )
        return cast(T, mesh)

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor on these processes and give the processes back.

        Launch-pool processes return to the pool; spawned processes exit.

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
        rt = _current.current()
        addrs = [self._addrs[i] for i in self._shape.ranks()]
        if rt.controller is not None:
            return rt.controller.release_async(addrs, reason)
        fut = OneReply("ProcMesh.stop()", "ProcMesh.stop", CONTROLLER)
        port = (rt.addr, rt.ports.open(fut))
        rt.send(CONTROLLER, (Kind.PROCS, None, "release", (addrs, reason), port))
        return fut

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
    """Hosts that can run processes; ``this_host()`` is the controller's."""

    def __init__(self, shape: Shape, hosts: tuple[str, ...]) -> None:
        self._shape = shape
        self._hosts = hosts

    def _new_with_shape(self, shape: Shape) -> HostMesh:
        return HostMesh(shape, self._hosts)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in zip(self._shape.labels, self._shape.sizes, strict=True))
        return f"HostMesh({sizes})"

    def spawn_procs(
        self,
        per_host: Mapping[str, int] | None = None,
        bootstrap: Callable[[], Any] | None = None,
        name: str | None = None,
        proc_bind: Any = None,
        bootstrap_command: Any = None,
    ) -> ProcMesh:
        """Start worker processes: ``per_host`` of them on every host of this mesh.

        The processes come from the launch pool (ranks 1..N-1 of ``mpirun -n N``)
        while it has room, otherwise from ``MPI_Comm_spawn``.  Blocks until they
        are ready.  The mesh's dimensions are the host dimensions followed by
        those of ``per_host``: ``spawn_procs(per_host={"gpus": 4})`` gives
        ``hosts=1, gpus=4``.

        Args:
            per_host: dimension name -> size, e.g. ``{"gpus": 8}``.
            bootstrap: a callable run on every new process before any actor.
            name: accepted for Monarch compatibility.
            proc_bind: not supported: bind with the launcher instead.
            bootstrap_command: not supported: processes run ``python -m mpimesh``.

        Raises:
            TypeError, ValueError: ``per_host`` is malformed.
            NotImplementedError: ``proc_bind`` or ``bootstrap_command`` was given.
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
        n = len(self) * math.prod(dims.values())
        rt = _current.current()
        if rt.controller is not None:
            placed = [(p.addr, p.host) for p in rt.controller.allocate(n)]
        else:
            fut = OneReply("spawn_procs", "spawn_procs", CONTROLLER)
            port = (rt.addr, rt.ports.open(fut))
            rt.send(CONTROLLER, (Kind.PROCS, None, "alloc", n, port))
            placed = fut.get()
        shape = Shape.row_major(self._shape.labels + tuple(dims), self._shape.sizes + tuple(dims.values()))
        procs = ProcMesh(
            shape,
            tuple(a for a, _ in placed),
            tuple(h for _, h in placed),
            key=rt.new_id(),
            owned=True,
        )
        if bootstrap is not None:
            boot = procs.spawn("_bootstrap", _Bootstrap, bootstrap)
            try:
                boot.initialized.get()  # type: ignore[attr-defined]
            finally:
                boot.stop().get()  # type: ignore[attr-defined]
        return procs


def this_host() -> HostMesh:
    """The host mesh of the calling process (one host, dimension ``hosts``).

    Its ``spawn_procs`` draws from the launch pool first, wherever those
    ranks run, then spawns on this host.
    """
    rt = _current.current()
    return HostMesh(Shape.row_major(("hosts",), (1,)), (rt.host,))


def this_proc() -> ProcMesh:
    """The calling process as a 0-dimensional process mesh.

    Actors spawned on it live in this very process (on the controller: in the
    controller, next to the script).
    """
    rt = _current.current()
    return ProcMesh(Shape.unity(), (rt.addr,), (rt.host,), key=(rt.addr[0], rt.addr[1], 0))
