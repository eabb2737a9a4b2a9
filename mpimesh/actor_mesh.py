"""ActorMesh: a sliceable handle on actors, and the endpoint adverbs."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any, Generic, NoReturn, TypeVar

from ._core import current as _current
from ._core import serialize as _serialize
from ._core.ports import Gather, OneReply, Receiver, Stream
from ._core.protocol import Kind
from ._core.serialize import plain
from .actor import EndpointInfo
from .errors import SupervisionError
from .future import Future
from .shape import MeshTrait, Shape
from .value_mesh import ValueMesh

__all__ = ["ActorMesh", "Endpoint"]

R = TypeVar("R")
T = TypeVar("T")
Addr = tuple[int, int]

_CALL = Kind.CALL
_SITE_CALL = Kind.SITE_CALL
_NO_BUFFERS: list[Any] = []
# Arguments made only of builtin scalars ride in the frame (see _serialize.plain).
_ATOMS = _serialize.ATOMS


def _plain_tuple(args: tuple[Any, ...]) -> bool:
    return len(args) <= 32 and _ATOMS.issuperset(map(type, args))


class Endpoint(Generic[R]):
    """One endpoint of an actor mesh, with Monarch's adverbs.

    Obtained as an attribute of the mesh: ``trainers.step``.  Every adverb
    returns at once; arguments are checked against the method's signature
    and pickled before anything is sent, so a bad call raises here.
    """

    def __init__(self, mesh: ActorMesh[Any], info: EndpointInfo) -> None:
        self._mesh = mesh
        self._info = info
        self._what = f"{mesh._name}.{info.name}"
        # call_one's hot path: what it needs, looked up once
        self._single = len(mesh) == 1
        self._checks = info.check is not None
        self._what_one = f"{self._what}.call_one()"
        # Once call_one has registered a call site (Kind.SITE_CALL): the site,
        # the actor's address, and the numbers of positional arguments the
        # signature check has accepted (all of them if there is no check).
        self._site: int | None = None
        self._addr: Addr = (0, 0)
        self._arities: set[int] | None = set() if self._checks else None

    def __repr__(self) -> str:
        return f"<Endpoint {self._mesh._name}.{self._info.name} of {self._mesh!r}>"

    def _check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        check = self._info.check
        if check is None:
            return
        lead = (None, None) if self._info.explicit_response_port else (None,)
        try:
            check(*lead, *args, **kwargs)
        except TypeError:
            sig = self._info.signature
            assert sig is not None
            try:
                sig.bind(*lead, *args, **kwargs)
                return
            except TypeError as exc:
                error = exc
            params = [p.replace(annotation=p.empty) for p in list(sig.parameters.values())[len(lead) :]]
            shown = sig.replace(parameters=params, return_annotation=sig.empty)
            raise TypeError(f"{self._mesh._name}.{self._info.name}(): {error}; the endpoint takes {shown}") from None

    def _send(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ranks: list[int],
        receiver: Callable[[list[Addr]], Receiver] | None,
    ) -> None:
        self._check(args, kwargs)
        self._mesh._cast(self._info.name, args, kwargs, ranks, receiver)

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor of the mesh; the future gives a ValueMesh shaped like it.

        If several actors raise, the future raises the error of the lowest rank.
        """
        mesh = self._mesh
        fut: Future[ValueMesh[R]] = Future(f"{mesh._name}.{self._info.name}.call()")
        shape = mesh._shape.dense()
        what = self._what
        self._send(args, kwargs, list(range(len(mesh))), lambda addrs: Gather(fut, what, shape, addrs))
        return fut

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the one actor of a single-actor mesh.

        Raises:
            ValueError: the mesh does not hold exactly one actor.
        """
        site = self._site
        if (
            site is not None
            and not kwargs
            and (self._arities is None or len(args) in self._arities)
            and _plain_tuple(args)
        ):
            # This is the round trip B1 measures: a registered site, plain
            # arguments the signature has accepted before.
            return self._call_site(site, args)
        mesh = self._mesh
        if not self._single:
            dim = mesh._shape.labels[0] if mesh._shape.labels else "dim"
            raise ValueError(
                f"call_one() needs a mesh of exactly 1 actor, got {len(mesh)} in {mesh!r}; "
                f"slice it to one actor first, e.g. {mesh._name}.slice({dim}=0), or use call()"
            )
        if self._checks:
            self._check(args, kwargs)
            if not kwargs:
                self._arities.add(len(args))  # type: ignore[union-attr]
        name = self._info.name
        fut = mesh._cast_one(name, self._what_one, self._what, args, kwargs, 0)
        site = mesh._sites.get(name)
        if site is not None and _current.runtime is not None:
            self._site = site
            self._addr = mesh._targets[0]  # type: ignore[index]
        return fut

    def _call_site(self, site: int, args: tuple[Any, ...]) -> Future[R]:
        # call_one through the call site registered by an earlier call_one.
        mesh = self._mesh
        if mesh._stopped:
            mesh._refuse(self._info.name)
        rt = _current.runtime
        assert rt is not None, "a call site outlived its runtime"
        addr = self._addr
        fut = OneReply(self._what_one, self._what, addr, mesh._shape, 0)
        dead = rt.dead
        if dead and addr in dead:
            fut.fail(addr, dead[addr])
            return fut
        ports = rt.ports
        pid = ports.open(fut)
        try:
            rt.router.send(addr, (_SITE_CALL, None, site, pid, args))
        except ConnectionError as exc:
            fut.fail(addr, str(exc))
            ports.close(pid)
        return fut

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of the mesh picked at random (load balancing)."""
        return self._one(random.randrange(len(self._mesh)), "choose", args, kwargs)

    def _one(self, rank: int, adverb: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Future[R]:
        # One target, one reply.
        what = self._what
        self._check(args, kwargs)
        return self._mesh._cast_one(self._info.name, f"{what}.{adverb}()", what, args, kwargs, rank)

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Call every actor; yield one future per reply, in arrival order."""
        mesh = self._mesh
        futures: list[Future[R]] = [Future(f"{mesh._name}.{self._info.name}.stream()[{i}]") for i in range(len(mesh))]
        what = self._what
        shape = mesh._shape.dense()
        self._send(args, kwargs, list(range(len(mesh))), lambda addrs: Stream(futures, what, addrs, shape))
        return iter(futures)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor and return at once; nobody waits for an answer.

        An exception in the endpoint fails that actor and is reported to the
        mesh's owner (it cannot reach the caller).
        """
        self._send(args, kwargs, list(range(len(self._mesh))), None)


class ActorMesh(MeshTrait, Generic[T]):
    """Actors of one class, one per process of a process mesh.

    Returned by :meth:`ProcMesh.spawn`.  Its endpoints are attributes:
    ``mesh.step.call(x)``.  It slices like its process mesh, and pickles as a
    reference, so actors can call other actors.
    """

    def __init__(
        self,
        *,
        key: tuple[int, int, int],
        name: str,
        class_name: str,
        endpoints: dict[str, EndpointInfo],
        methods: frozenset[str],
        shape: Shape,
        addrs: tuple[Addr, ...],
        initialized: Future[None] | None = None,
        owned: bool = False,
    ) -> None:
        self._key = key
        self._name = name
        self._class_name = class_name
        self._endpoints = endpoints
        self._methods = methods
        self._shape = shape
        self._addrs = addrs
        self._initialized = initialized
        self._owned = owned
        self._stopped = False
        # per rank of this (sliced) mesh: its address and its message point
        self._targets: list[Addr] | None = None
        self._points: list[tuple[int, tuple[str, ...], tuple[int, ...]]] = []
        # method (rank 0) or (method, rank) -> call site registered from this process
        self._sites: dict[Any, int] = {}

    def _new_with_shape(self, shape: Shape) -> ActorMesh[T]:
        return ActorMesh(
            key=self._key,
            name=self._name,
            class_name=self._class_name,
            endpoints=self._endpoints,
            methods=self._methods,
            shape=shape,
            addrs=self._addrs,
            initialized=self._initialized,
        )

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in zip(self._shape.labels, self._shape.sizes, strict=True))
        return f"ActorMesh({self._name!r}, {self._class_name}, {sizes})"

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        info = self._endpoints.get(attr)
        if info is not None:
            endpoint: Endpoint[Any] = Endpoint(self, info)
            self.__dict__[attr] = endpoint  # later lookups skip __getattr__
            return endpoint
        if attr in self._methods:
            raise AttributeError(
                f"{self._class_name}.{attr} is not an endpoint, so {self!r} cannot call it; decorate it with @endpoint"
            )
        raise AttributeError(f"{self!r} has no endpoint {attr!r}; its endpoints are {sorted(self._endpoints)}")

    def __reduce__(self) -> tuple[Any, ...]:
        refs = {n: EndpointInfo(i.name, i.is_async, i.explicit_response_port, None) for n, i in self._endpoints.items()}
        return (
            _rebuild,
            (self._key, self._name, self._class_name, refs, self._methods, self._shape, self._addrs),
        )

    @property
    def initialized(self) -> Future[None]:
        """Done when every actor's ``__init__`` has run; raises ActorError if one raised."""
        if self._initialized is None:
            return Future.completed(None, f"{self._name}.initialized")
        return self._initialized

    def stop(self, reason: str = "stopped by client") -> Future[None]:
        """Stop every actor of this mesh after its pending messages; runs ``__cleanup__``.

        Raises:
            RuntimeError: this is a reference (sliced or received), not the mesh from ``spawn``.
        """
        if not self._owned:
            raise RuntimeError(
                f"cannot stop {self!r}: it is a reference (a slice or a received mesh); "
                "call stop() on the mesh that spawn() returned"
            )
        if self._stopped:
            return Future.completed(None, f"{self._name}.stop()")
        self._stopped = True
        rt = _current.current()
        rt.owned.pop(self._key, None)
        fut: Future[None] = Future(f"{self._name}.stop()")
        shape = self._shape
        addrs = [self._addrs[i] for i in shape.ranks()]
        port = (rt.addr, rt.ports.open(Gather(fut, f"{self._name}.stop", shape, addrs, values=False)))
        for rank, addr in enumerate(addrs):
            rt.send(addr, (Kind.STOP, None, self._key, port, rank, reason))
        return fut

    def _resolve(self) -> list[Addr]:
        # The address and message point of each rank of this (sliced) mesh, computed once.
        shape = self._shape
        base = self._addrs
        labels, dims = shape.labels, shape.sizes
        self._points = [(rank, labels, dims) for rank in range(len(shape))]
        self._targets = [base[i] for i in shape.ranks()]
        return self._targets

    def _payload(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, list[Any]]:
        if plain(args) and (not kwargs or plain(kwargs)):
            # Plain data rides in the frame: one pickle instead of two.
            return (args, kwargs), _NO_BUFFERS
        try:
            return _serialize.dumps((args, kwargs))
        except Exception as exc:
            raise TypeError(
                f"cannot pickle the arguments of {self._name}.{method}(): {exc}; "
                "pass data that pickles (not locks, sockets or open files)"
            ) from exc

    def _refuse(self, method: str) -> NoReturn:
        raise RuntimeError(f"cannot call {self._name}.{method}() after stop() of {self!r}; spawn a new mesh")

    def _cast_one(
        self, method: str, name: str, what: str, args: tuple[Any, ...], kwargs: dict[str, Any], rank: int
    ) -> OneReply:
        """Send one call to ``rank``; returns the future its reply settles (call_one, choose)."""
        if self._stopped:
            self._refuse(method)
        rt = _current.runtime or _current.current()
        targets = self._targets or self._resolve()
        addr = targets[rank]
        # The call site this process registered for (actor, method, point),
        # if any (Kind.SITE_CALL): a call with plain positional arguments
        # names it instead of the actor, method, reply address and point.
        here = method if rank == 0 else (method, rank)
        site = self._sites.get(here)
        if site is None:
            site = rt.sites.get((addr, self._key, method, self._points[rank]))  # another mesh object's
            if site is not None:
                self._sites[here] = site
        plain = not kwargs and _plain_tuple(args)
        if plain:
            payload: Any = args if site is not None else (args, kwargs)
            buffers = _NO_BUFFERS
        else:
            payload, buffers = self._payload(method, args, kwargs)
        fut = OneReply(name, what, addr, self._shape, rank)
        dead = rt.dead
        if dead and addr in dead:
            fut.fail(addr, dead[addr])
            return fut
        ports = rt.ports
        pid = ports.open(fut)
        register = 0
        if plain and site is not None:
            frame: tuple[Any, ...] = (_SITE_CALL, None, site, pid, payload)
        else:
            sizes = tuple(b.nbytes for b in buffers) if buffers else None
            frame = (_CALL, sizes, self._key, method, payload, (rt.addr, pid), self._points[rank])
            if site is None:
                register = rt.new_site()
                frame += (register,)
        try:
            rt.router.send(addr, frame, buffers)
        except ConnectionError as exc:
            fut.fail(addr, str(exc))
            ports.close(pid)
            return fut
        if register:
            # Sent: the site's CALL is ahead of any later call on this path.
            rt.sites[addr, self._key, method, self._points[rank]] = register
            self._sites[here] = register
        return fut

    def _cast(
        self,
        method: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ranks: list[int],
        receiver: Callable[[list[Addr]], Receiver] | None,
    ) -> None:
        if self._stopped:
            self._refuse(method)
        rt = _current.current()
        targets = self._targets or self._resolve()
        addrs = [targets[r] for r in ranks]
        dead = rt.dead
        if dead and receiver is None:
            for addr in addrs:
                if addr in dead:
                    raise SupervisionError(f"cannot broadcast {self._name}.{method}(): {dead[addr]}", endpoint=method)
        payload, buffers = self._payload(method, args, kwargs)
        port = None
        waiting: Receiver | None = None
        if receiver is not None:
            waiting = receiver(addrs)
            port = (rt.addr, rt.ports.open(waiting))
        sizes = tuple(b.nbytes for b in buffers) if buffers else None
        points = self._points
        send = rt.router.send
        for rank, addr in zip(ranks, addrs, strict=True):
            if dead and addr in dead:
                # A known-dead target fails at once; the rest go ahead.
                assert waiting is not None and port is not None
                if waiting.fail(addr, dead[addr]):
                    rt.ports.close(port[1])
                continue
            try:
                send(addr, (_CALL, sizes, self._key, method, payload, port, points[rank]), buffers)
            except ConnectionError as exc:
                if waiting is None or port is None:
                    raise SupervisionError(
                        f"cannot broadcast {self._name}.{method}(): {exc}", endpoint=method
                    ) from None
                if waiting.fail(addr, str(exc)):
                    rt.ports.close(port[1])


def _rebuild(
    key: tuple[int, int, int],
    name: str,
    class_name: str,
    endpoints: dict[str, EndpointInfo],
    methods: frozenset[str],
    shape: Shape,
    addrs: tuple[Addr, ...],
) -> ActorMesh[Any]:
    return ActorMesh(
        key=key, name=name, class_name=class_name, endpoints=endpoints, methods=methods, shape=shape, addrs=addrs
    )
