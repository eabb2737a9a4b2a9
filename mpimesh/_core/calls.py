"""Requests from the public mesh API: calls, spawns and stops of actors, processes, channels.

The public modules (``actor_mesh``, ``proc_mesh``, ``channel``, ``rma``)
check their arguments and hand each request to this module, as mpi4py's
``MPIPoolExecutor.submit`` hands its task to the pool.  Here the request
becomes frames (built by the constructors of ``protocol``), the reply port
is opened, and the frames are sent.  Every request that waits for answers
sends through one function, :func:`_post`: a target known dead, or one that
the send finds failed, fails the wait at once instead of leaving it hanging.

An actor mesh's inner handle is a :class:`MeshRef` (Monarch's
``ActorMesh._inner``): the mesh's key, the address and message point of each
actor, and the call sites this process registered.

Every actor mesh, process mesh and channel made here is adopted, when it is
made, by its owner in the runtime's ownership tree (``_core.owners``): the
calling actor, or the tree's root for the script.

Call sites (``protocol.site_call``): the first ``call_one`` from this
process to an (actor, method, point) sends a full CALL frame that also
registers a site number with the actor's process; later calls with plain
positional arguments send only the number, the reply port and the
arguments.  The SITE_CALL travels the path of the CALL that registered it,
so it cannot overtake it.  ``docs/design/calls.md`` says why this shortcut
exists and what it costs.  Three tables hold sites, one per role, and are
kept apart on purpose: ``Runtime.sites`` is the caller's registry (which
sites this process registered, for every handle); ``MeshRef._sites`` is one
handle's cache of it, keyed by what ``call_one`` has at hand (the method and
rank), so that the hot path builds no tuple key; ``ActorHost.sites`` is the
callee's side (site number -> actor, method, caller, point).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from concurrent.futures import Future as StdFuture
from typing import TYPE_CHECKING, Any, Protocol

from ..config import settings
from ..context import context
from ..errors import SupervisionError
from ..future import Future
from ..shape import Shape
from . import current as _current
from . import protocol
from . import serialize as _serialize
from .failures import Owned
from .heal import Recipe
from .logs import warn
from .owners import Kind
from .ports import Gather, OneReply, Port, PortReceiver, Queue, Receiver
from .protocol import Frame, Key, PortRef

if TYPE_CHECKING:
    from .._data.pulls import Pulls
    from .runtime import Runtime

__all__ = [
    "Here", "MeshRef", "allocate_procs", "attach", "here", "job_hosts", "named_actor", "open_channel", "own_procs",
    "release_procs", "stop_all_procs", "stop_procs",
]

Addr = tuple[int, int]
#: A message point as it travels: ``(rank, labels, sizes)`` in the mesh the caller addressed.
RawPoint = tuple[int, tuple[str, ...], tuple[int, ...]]

_NO_BUFFERS: list[Any] = []
_ATOMS = _serialize.ATOMS
_site_call = protocol.site_call
_SITE_CALL = protocol.Kind.SITE_CALL


class Here(Protocol):
    """What the public layer may read of this process: where it is, and which processes have died."""

    @property
    def addr(self) -> Addr:
        """This process's ``(island, rank)``."""

    @property
    def host(self) -> str:
        """This process's host name."""

    @property
    def dead(self) -> dict[Addr, str]:
        """Every process known dead, with the report of its death (read only)."""

    @property
    def pulls(self) -> Pulls:
        """This process's reads of RDMABuffers by pull (``_data.pulls``)."""


def here() -> Here:
    """This process (booting an embedded controller if no runtime runs yet)."""
    return _current.current()


def _post(
    rt: Runtime, addr: Addr, frame: Frame, buffers: list[Any], waiting: Receiver | None, port_id: int
) -> str | None:
    """Send ``frame`` to ``addr`` for the receiver ``waiting`` (open as port ``port_id``, if any).

    Returns:
        ``None`` once sent; else why not (``addr`` is known dead, or the send
        found it failed), after failing ``waiting`` for ``addr`` and closing
        its port if that was the last answer it waited for.
    """
    dead = rt.dead
    if dead and addr in dead:
        report = dead[addr]
    else:
        try:
            rt.multicast.post(addr, frame, buffers)
            return None
        except ConnectionError as exc:
            report = str(exc)
    if waiting is not None and waiting.fail(addr, report):
        rt.ports.close(port_id)
    return report


def _sizes(buffers: list[Any]) -> tuple[int, ...] | None:
    return tuple(b.nbytes for b in buffers) if buffers else None


def _encode(what: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
    """A CALL's arguments: ``(args, kwargs)`` itself when plain data (see ``serialize.plain``), else their pickle.

    Raises:
        TypeError: the arguments do not pickle.
    """
    if _serialize.plain(args) and (not kwargs or _serialize.plain(kwargs)):
        return (args, kwargs), _NO_BUFFERS
    try:
        return _serialize.dumps((args, kwargs))
    except Exception as exc:
        raise TypeError(
            f"cannot pickle the arguments of {what}(): {exc}; pass data that pickles (not locks, sockets or open files)"
        ) from exc


# --- actor meshes ---------------------------------------------------------------------------------


class MeshRef:
    """The inner handle of an actor mesh: which actors a (sliced) mesh addresses, and how to reach them.

    Args:
        key: the mesh's job-wide id.
        shape: the (possibly sliced) view of the mesh this handle addresses.
        addrs: the address of every actor of the whole mesh, by base index.
        cls: its actors' class (``module.Class``), for error texts; '' when unknown.

    It pickles as those four; the call sites it registered stay in this
    process.  The caller checks the arguments and whether the mesh was
    stopped; every operation returns at once.
    """

    __slots__ = ("key", "shape", "addrs", "cls", "_targets", "_points", "_sites", "_fast", "_here", "_owned",
                 "__weakref__")

    def __init__(self, key: Key, shape: Shape, addrs: tuple[Addr, ...], cls: str = "") -> None:
        self.key = key
        self.shape = shape
        self.addrs = addrs
        self.cls = cls
        # per rank of this view: the actor's address and the message point, made on first use
        self._targets: list[Addr] | None = None
        self._points: list[RawPoint] = []
        # method (rank 0) or (method, rank) -> (call site, actor's address), registered from this process
        self._sites: dict[Any, tuple[int, Addr]] = {}
        # the same keys -> the site's call_one in C (``_native.CallSite``), where the native wire can send it
        self._fast: dict[Any, Any] = {}
        # whether every actor of this view runs on this process's host, found on the first large cast
        self._here: bool | None = None
        # the spawner's record of the mesh, on the spawner's handles only: a heal re-points them (``repoint``)
        self._owned: Owned | None = None

    def __repr__(self) -> str:
        return f"MeshRef({self.key}, {self.shape!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (MeshRef, (self.key, self.shape, self.addrs, self.cls))

    def _near(self, rt: Runtime, addrs: list[Addr], whole: bool) -> bool:
        """Whether every one of ``addrs`` runs on this process's host (known for meshes this process spawned)."""
        if whole and self._here is not None:
            return self._here
        host = rt.host
        hosts = rt.hosts
        near = all(hosts.get(addr) == host for addr in addrs)
        if whole:
            self._here = near
        return near

    def new_with_shape(self, shape: Shape) -> MeshRef:
        """A handle on the view ``shape`` of the same mesh."""
        ref = MeshRef(self.key, shape, self.addrs, self.cls)
        owned = self._owned
        if owned is not None:
            ref._owned = owned
            owned.handles.add(ref)
        return ref

    def call_one_front(
        self, fallback: Callable[..., Any], mesh: Any, method: str, name: str, what: str, arities: set[int] | None
    ) -> Callable[..., Any] | None:
        """An endpoint's ``call_one`` in C (``_native.CallOne``) where the native wire runs; else None.

        It calls through this view's registered site for ``method`` at rank 0
        (``_fast``) and leaves everything else to ``fallback``.
        """
        rt = _current.runtime
        if rt is None or getattr(rt.router.wire, "_call_site", None) is None:
            return None
        from .. import _native  # only with the native wire

        front: Callable[..., Any] = _native.CallOne(fallback, mesh, self._fast, method, name, what, arities, _ATOMS)
        return front

    def repoint(self, addrs: tuple[Addr, ...]) -> None:
        """The mesh's actors now live at ``addrs`` (a heal replaced dead processes): forget what was resolved."""
        self.addrs = addrs
        self._targets = None
        self._points = []
        self._sites.clear()
        self._fast.clear()
        self._here = None

    @property
    def targets(self) -> list[Addr]:
        """The address of each actor of this view, by rank."""
        return self._targets or self._resolve()

    def point(self, rank: int) -> RawPoint:
        """The message point a call to ``rank`` of this view carries."""
        if self._targets is None:
            self._resolve()
        return self._points[rank]

    def _resolve(self) -> list[Addr]:
        shape = self.shape
        labels, sizes = shape.labels, shape.sizes
        self._points = [(rank, labels, sizes) for rank in range(len(shape))]
        self._targets = [self.addrs[i] for i in shape.ranks()]
        return self._targets

    @classmethod
    def spawn(
        cls, name: str, class_name: str, shape: Shape, addrs: list[Addr], is_async: bool, body: bytes,
        buffers: list[Any], hosts: list[str] | None = None,
    ) -> tuple[MeshRef, Future[None]]:
        """Create one actor at each of ``addrs`` (the processes of ``shape``, on ``hosts``) from the pickled ``body``.

        The calling actor (or the controller script) owns the new mesh: it is
        adopted by that actor's node of the ownership tree, and its failures
        go to that actor's ``__supervise__``.

        Returns:
            The new mesh's handle, and the future done when every actor's
            ``__init__`` has run.
        """
        rt = _current.current()
        key = rt.new_id()
        if hosts is not None:
            rt.hosts.update(zip(addrs, hosts, strict=True))
        fut: Future[None] = Future(f"{name}.initialized")
        waiting = Gather(fut, f"{name}.__init__", shape, addrs, values=False)
        port_id = rt.ports.open(waiting)
        port = (rt.addr, port_id)
        instance = context().actor_instance
        creator = (instance.actor_id, rt.addr)
        # Classes from importable modules travel by reference: the workers
        # need the spawner's sys.path (pytest, for one, extends it late).
        path = list(sys.path)
        recipe = Recipe(is_async, body, buffers, creator, path)
        owned = Owned(name, class_name, tuple(addrs), shape, recipe)
        rt.owners.adopt(
            rt.owners.owner_of(instance._actor), Kind.ACTOR_MESH, name,
            lambda reason: _stop_mesh(rt, key, name, owned.shape, list(owned.addrs), reason), key=key, payload=owned,
        )
        sizes = _sizes(buffers)
        for rank, addr in enumerate(addrs):
            point = (rank, shape.labels, shape.sizes)
            frame = protocol.spawn(sizes, key, name, point, is_async, body, port, creator, path)
            _post(rt, addr, frame, buffers, waiting, port_id)
        ref = cls(key, shape.dense(), tuple(addrs), class_name)
        ref._owned = owned
        owned.handles.add(ref)
        return ref, fut

    def stop(self, what: str, reason: str) -> Future[None]:
        """Stop every actor of this (whole) mesh after its pending messages; done once all have.

        The mesh's failures are no longer reported from then on.
        """
        return _stop_mesh(_current.current(), self.key, what, self.shape, list(self.targets), reason)

    def cast(
        self, method: str, what: str, args: tuple[Any, ...], kwargs: dict[str, Any],
        receiver: Callable[[list[Addr]], Receiver] | None, *, reply_to: PortRef | None = None,
        ranks: list[int] | None = None, skip_dead: bool = False,
    ) -> None:
        """Call ``method`` on every actor of this view; ``receiver(addrs)`` takes the replies (None: nobody waits).

        A target known dead, or one a send finds failed, fails its part of
        the wait.  With nobody waiting here (a broadcast, or replies sent to
        ``reply_to``, a port of any process) it raises instead.  ``ranks``:
        only these actors of the view (default: all).  ``skip_dead``: with
        nobody waiting, a target known or found dead is skipped instead of
        raising, so every live target gets the call exactly once.

        Raises:
            TypeError: the arguments do not pickle.
            SupervisionError: a call nobody waits for here reaches a dead actor.
        """
        rt = _current.current()
        targets = self.targets
        addrs = targets if ranks is None else [targets[rank] for rank in ranks]
        chosen = range(len(addrs)) if ranks is None else ranks
        verb = "broadcast" if reply_to is None else "send"
        dead = rt.dead
        if dead and receiver is None and skip_dead:
            live = [(rank, addr) for rank, addr in zip(chosen, addrs, strict=True) if addr not in dead]
            if len(live) < len(addrs):
                if not live:
                    return
                ranks = chosen = [rank for rank, _ in live]
                addrs = [addr for _, addr in live]
        elif dead and receiver is None:
            for addr in addrs:
                if addr in dead:
                    raise SupervisionError(f"cannot {verb} {what}(): {dead[addr]}", endpoint=method)
        payload, buffers = _encode(what, args, kwargs)
        waiting = None
        port = reply_to
        port_id = 0
        if receiver is not None:
            waiting = receiver(addrs)
            waiting.actor = self.cls
            port_id = rt.ports.open(waiting)
            port = (rt.addr, port_id)
        sizes = _sizes(buffers)
        key = self.key
        # A large cast to actors all on this host goes straight to each (``MPIMESH_CAST_NEAR_DIRECT``):
        # every receiver copies its own message out of shared memory, in parallel, where a tree copies
        # the payload once per level (64 MiB to 16 actors: direct 1.0x raw ``Bcast``, tree 2.2x).
        near = settings.cast_near_direct
        if len(addrs) >= settings.cast_tree_min and not (near and sizes and sum(sizes) >= near
                                                          and self._near(rt, addrs, ranks is None)):
            # down a tree (see multicast): at most MPIMESH_CAST_ROOT_FANOUT messages leave here
            shape = self.shape
            failed = rt.multicast.cast(key, method, payload, sizes, buffers, port, chosen, addrs, shape.labels,
                                       shape.sizes, waiting, 0 if waiting is None else waiting.gather,
                                       whole=ranks is None)
            for addr, why in failed:
                if waiting is None:
                    if skip_dead:
                        continue
                    raise SupervisionError(f"cannot {verb} {what}(): {why}", endpoint=method)
                if waiting.fail(addr, why):
                    rt.ports.close(port_id)
            return
        points = self._points
        for rank, addr in zip(chosen, addrs, strict=True):
            report = _post(rt, addr, protocol.call(sizes, key, method, payload, port, points[rank]), buffers, waiting,
                           port_id)
            if report is not None and waiting is None and not skip_dead:
                raise SupervisionError(f"cannot {verb} {what}(): {report}", endpoint=method)

    def cast_one(
        self, method: str, name: str, what: str, args: tuple[Any, ...], kwargs: dict[str, Any], rank: int
    ) -> OneReply:
        """Call ``method`` on the actor at ``rank`` of this view; returns the future its reply settles.

        ``name`` names the future (``"mesh.method.call_one()"``); ``what``
        names the endpoint in errors.

        Raises:
            TypeError: the arguments do not pickle.
        """
        here = method if rank == 0 else (method, rank)
        plain = not kwargs and len(args) <= 32 and _ATOMS.issuperset(map(type, args))
        if plain:
            fast = self._fast.get(here)
            if fast is not None:
                # the site's call in C (native/site.c); None: a death, a cast in flight, a new route: below
                made: OneReply | None = fast.call(name, what, args)
                if made is not None:
                    return made
        rt = _current.runtime or _current.current()
        site = self._sites.get(here) or self._known_site(rt, here, method, rank)
        if site is not None and plain:
            number, addr = site
            fut = OneReply(name, what, addr, self.shape, rank)
            fut.actor = self.cls
            port_id = rt.ports.open(fut)
            _post(rt, addr, _site_call(number, port_id, args), _NO_BUFFERS, fut, port_id)
            return fut
        # A full CALL frame, which registers a call site if there is none yet.
        addr = self.targets[rank]
        point = self._points[rank]
        payload, buffers = ((args, kwargs), _NO_BUFFERS) if plain else _encode(what, args, kwargs)
        fut = OneReply(name, what, addr, self.shape, rank)
        fut.actor = self.cls
        port_id = rt.ports.open(fut)
        port = (rt.addr, port_id)
        if site is not None:
            frame = protocol.call(_sizes(buffers), self.key, method, payload, port, point)
            _post(rt, addr, frame, buffers, fut, port_id)
            return fut
        number = rt.new_site()
        frame = protocol.call_registering(_sizes(buffers), self.key, method, payload, port, point, number)
        if _post(rt, addr, frame, buffers, fut, port_id) is None:
            # Sent: the site's CALL is ahead of any later call on this path.
            rt.sites[addr, self.key, method, point] = number
            self._remember(rt, here, number, addr, rank)
        return fut

    def _known_site(self, rt: Runtime, here: Any, method: str, rank: int) -> tuple[int, Addr] | None:
        # A site this process registered through another handle on the same actor and point.
        addr = self.targets[rank]
        number = rt.sites.get((addr, self.key, method, self._points[rank]))
        if number is None:
            return None
        return self._remember(rt, here, number, addr, rank)

    def _remember(self, rt: Runtime, here: Any, number: int, addr: Addr, rank: int) -> tuple[int, Addr]:
        # Keep a registered site for the calls to come, and its call in C where the native wire can send it.
        site = self._sites[here] = (number, addr)
        router = rt.router
        make = getattr(router.wire, "_call_site", None)  # the native wire's (native/call.c)
        way = router.direct_route(addr) if make is not None else None
        if make is None or way is None or way[2] is None:  # only a route of the island's own (not the parent's)
            return site
        link, routes = way[0], way[3]
        ports = rt.ports
        opened, ids = ports.table()

        def failed(fut: OneReply, port_id: int, report: str) -> None:
            # as _post, when the send finds the actor's process failed
            if fut.fail(addr, report):
                ports.close(port_id)

        fast = make(link, addr[1], failed, routes=routes, open=opened, ids=ids, dead=rt.dead,
                    multicast=rt.multicast, one_type=OneReply, kind=_SITE_CALL, number=number, addr=addr,
                    shape=self.shape, rank=rank, actor=self.cls)
        if fast is not None:
            self._fast[here] = fast
        return site


# --- processes and channels -----------------------------------------------------------------------


def allocate_procs(per_host: int, hosts: list[str]) -> tuple[Key, list[Addr], list[str]]:
    """Take ``per_host`` worker processes on each of ``hosts`` for a new process mesh (blocks until ready).

    Returns:
        The new process mesh's key, and the processes' addresses and hosts,
        host by host.
    """
    rt = _current.current()
    placed = rt.role.allocate(per_host, hosts)
    return rt.new_id(), [a for a, _ in placed], [h for _, h in placed]


def job_hosts() -> list[str]:
    """The job's hosts in launch order (the controller's first)."""
    return _current.current().role.job_hosts()


def named_actor(name: str, cls: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The job's singleton actor mesh ``name`` in the controller's process, spawned on first use (blocking)."""
    import cloudpickle

    try:
        body = cloudpickle.dumps((cls, args, kwargs))
    except Exception as exc:
        raise TypeError(
            f"cannot pickle the arguments of {getattr(cls, '__qualname__', cls)} for controller {name!r}: {exc}; "
            "pass data that pickles"
        ) from exc
    return _current.current().role.named_actor(name, body)


def _stop_mesh(rt: Any, key: Key, what: str, shape: Shape, targets: list[Addr], reason: str) -> Future[None]:
    # STOP to every actor of mesh `key`; the future is done once all have answered.
    rt.owners.take(key)
    fut: Future[None] = Future(f"{what}.stop()")
    waiting = Gather(fut, f"{what}.stop", shape, targets, values=False)
    port_id = rt.ports.open(waiting)
    port = (rt.addr, port_id)
    for rank, addr in enumerate(targets):
        _post(rt, addr, protocol.stop(key, port, rank, reason), _NO_BUFFERS, waiting, port_id)
    return fut


def own_procs(key: Key, name: str, stop: Callable[[str], Future[None]]) -> None:
    """Adopt the process mesh ``key`` the caller spawned: it stops with its owner, or by ``stop(reason)``."""
    rt = _current.current()
    # payload: the ProcMesh whose stop this is (its processes, for the dashboard's tree)
    rt.owners.adopt(rt.owners.owner_of(context().actor_instance._actor), Kind.PROC_MESH, name, stop, key=key,
                    payload=getattr(stop, "__self__", None))


def attach(key: Key, name: str, make: Callable[[], Any], close: Callable[[Any], None] | None) -> Any:
    """The object ``name`` kept with the process mesh ``key`` in the ownership tree (``ProcMesh.attach``)."""
    return _current.current().owners.attach(key, name, make, close)


def stop_procs(key: Key, addrs: list[Addr], reason: str) -> Future[None]:
    """Stop the process mesh ``key``: close what it owns (bounded), then give its processes back."""
    rt = _current.current()
    node = rt.owners.take(key)
    if node is not None:
        for error in node.close(reason, settings.cleanup_timeout, itself=False):
            warn(f"stopping what {node.name} owns: {error}")
    rt.owners.forget_actor_meshes_on(addrs)
    return release_procs(addrs, reason)


def stop_all_procs(reason: str) -> list[StdFuture[Any]]:
    """Stop every process mesh this process spawned and has not stopped (``shutdown_context``).

    Returns at once with the stops' futures; none without a runtime.
    """
    rt = _current.runtime
    if rt is None:
        return []
    stops: list[StdFuture[Any]] = []
    for node in rt.owners.of_kind(Kind.PROC_MESH):
        stops.extend(node.start_close(reason))
    return stops


def release_procs(addrs: list[Addr], reason: str) -> Future[None]:
    """Give processes back (their actors are stopped first); done once they are."""
    return _current.current().role.release(addrs, reason)


def open_channel(once: bool, ranked: bool) -> tuple[Port[Any], PortReceiver[Any]]:
    """A new port whose receiver lives in this process (see ``mpimesh.Channel``)."""
    rt = _current.current()
    queue = Queue("Channel", once=once, ranked=ranked)
    port_id = rt.ports.open(queue)
    ports = rt.ports
    owners = rt.owners
    owners.adopt(owners.owner_of(context().actor_instance._actor), Kind.CHANNEL, "Channel",
                 lambda reason: ports.close(port_id))
    port: Port[Any] = Port((rt.addr, port_id))
    return port, PortReceiver(queue, port)
