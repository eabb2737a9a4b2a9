"""ActorMesh: a sliceable handle on actors, and the endpoint adverbs."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, Literal, NoReturn, TypeVar, overload

from ._core.calls import MeshRef
from ._core.folds import Fold, Folded
from ._core.ports import Gather, Port, Receiver, Stream, gone
from .actor import EndpointInfo
from .errors import SupervisionError
from .future import Future
from .shape import MeshTrait, Shape
from .value_mesh import ValueMesh

__all__ = ["Accumulator", "ActorMesh", "Endpoint", "NotAnEndpoint", "as_endpoint", "send"]

R = TypeVar("R")
T = TypeVar("T")
A = TypeVar("A")
Addr = tuple[int, int]
#: Where the replies of a call to every actor go: made from the actors' addresses (None: nobody waits).
Replies = Callable[[list[Addr]], Receiver] | None


class Endpoint(Generic[R]):
    """One endpoint of an actor mesh, with Monarch's adverbs.

    Obtained as an attribute of the mesh: ``trainers.step``.  Every adverb
    returns at once; arguments are checked against the method's signature
    and pickled before anything is sent, so a bad call raises here.
    """

    def __init__(self, mesh: ActorMesh[Any], info: EndpointInfo, name: str | None = None) -> None:
        self._mesh = mesh
        self._info = info
        # what the actor is asked for: the method's name (see as_endpoint)
        self._name = name or info.name
        self._what = f"{mesh._name}.{info.name}"
        self._single = len(mesh) == 1
        self._call_one_name = f"{self._what}.call_one()"
        self._cast_one = mesh._ref.cast_one
        self._checks = info.check is not None
        # The numbers of positional arguments the signature check has accepted:
        # a call with that many positional arguments and no keywords passes it too.
        self._arities: set[int] = set()
        if self._single and type(self).call_one is Endpoint.call_one:
            # call_one's common case in C, re-checked on every call (native/callone.c); shadows the method
            front = mesh._ref.call_one_front(
                Endpoint.call_one.__get__(self), mesh, self._name, self._call_one_name, self._what,
                self._arities if self._checks else None,
            )
            if front is not None:
                self.call_one = front  # type: ignore[method-assign]

    def __repr__(self) -> str:
        return f"<Endpoint {self._what} of {self._mesh!r}>"

    def __getstate__(self) -> dict[str, Any]:
        # The C front (call_one) is this process's and bound to this object: a copy or a pickle goes without it.
        state = dict(self.__dict__)
        state.pop("call_one", None)
        return state

    def _check(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        # Raises TypeError unless the endpoint's signature accepts the arguments.
        check, sig = self._info.check, self._info.signature
        if check is None or sig is None:
            return
        lead = (None, None) if self._info.explicit_response_port else (None,)
        try:
            check(*lead, *args, **kwargs)
        except TypeError:
            try:
                sig.bind(*lead, *args, **kwargs)  # has the last word, and the better message
            except TypeError as exc:
                params = [p.replace(annotation=p.empty) for p in list(sig.parameters.values())[len(lead) :]]
                shown = sig.replace(parameters=params, return_annotation=sig.empty)
                raise TypeError(f"{self._what}(): {exc}; the endpoint takes {shown}") from None
        if not kwargs:
            self._arities.add(len(args))

    def _ready(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ActorMesh[Any]:
        """Check a call's arguments and that the mesh still serves; returns the mesh."""
        if self._checks and (kwargs or len(args) not in self._arities):
            self._check(args, kwargs)
        mesh = self._mesh
        if mesh._stopped:
            mesh._refuse(self._name)
        return mesh

    @overload
    def _send(self, args: tuple[Any, ...], kwargs: dict[str, Any], port: str, selection: int) -> Future[R]: ...
    @overload
    def _send(self, args: tuple[Any, ...], kwargs: dict[str, Any], port: Replies, selection: None) -> None: ...

    def _send(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], port: str | Replies, selection: int | None
    ) -> Future[R] | None:
        """Check a call and hand it to the mesh's inner handle: the one primitive behind every adverb.

        Args:
            args: the endpoint's positional arguments.
            kwargs: its keyword arguments.
            port: where the replies go.  To one actor: the name of the
                future its reply settles.  To every actor: a function that
                makes the receiver of the replies from the actors'
                addresses, or None when nobody waits.
            selection: the rank of the one actor to call, or None for all.

        Returns:
            The future of the one actor's reply; None for every actor.

        Raises:
            TypeError: the arguments do not fit the signature, or do not pickle.
            RuntimeError: the mesh was stopped.
        """
        mesh = self._ready(args, kwargs)
        if selection is None:
            mesh._ref.cast(self._name, self._what, args, kwargs, port)  # type: ignore[arg-type]
            return None
        return self._cast_one(self._name, port, self._what, args, kwargs, selection)  # type: ignore[arg-type]

    def call(self, *args: Any, **kwargs: Any) -> Future[ValueMesh[R]]:
        """Call every actor of the mesh; the future gives a ValueMesh shaped like it.

        If several actors raise, the future raises the error of the lowest rank.
        """
        fut: Future[ValueMesh[R]] = Future(f"{self._what}.call()")
        shape = self._mesh._shape.dense()
        what = self._what
        self._send(args, kwargs, lambda addrs: Gather(fut, what, shape, addrs), None)
        return fut

    def call_one(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call the one actor of a single-actor mesh.

        Raises:
            ValueError: the mesh does not hold exactly one actor.
        """
        if not self._single and len(self._mesh) != 1:  # a mesh can shrink to one actor (ProcMesh.shrink)
            mesh = self._mesh
            # Every dimension with more than one actor must be fixed for the hint to name one actor.
            wide = [label for label, size in zip(mesh._shape.labels, mesh._shape.sizes, strict=True) if size > 1]
            coords = ", ".join(f"{label}=0" for label in wide)
            raise ValueError(
                f"call_one() needs a mesh of exactly 1 actor, got {len(mesh)} in {mesh!r}; "
                f"slice it to one actor first, e.g. {mesh._name}.slice({coords}), or use call()"
            )
        return self._send(args, kwargs, self._call_one_name, 0)

    def choose(self, *args: Any, **kwargs: Any) -> Future[R]:
        """Call one actor of the mesh picked at random (load balancing)."""
        return self._send(args, kwargs, f"{self._what}.choose()", random.randrange(len(self._mesh)))

    def reduce(self, op: Callable[[R, R], R], /, *args: Any, **kwargs: Any) -> Future[R]:
        """Call every actor; the replies are combined with ``op`` on their way back: one value.

        ``mesh.loss.reduce(operator.add, batch)`` is ``sum(mesh.loss.call(batch).get().values())``
        without the N replies: a call to ``MPIMESH_CAST_TREE_MIN`` actors or
        more goes down a tree and each process of the tree sends its parent
        one partial value.  ``op`` must be associative and commutative (as
        MPI's reduction operators): the tree, not the rank order, decides
        which replies meet first.  It runs in the actors' processes, so it
        must pickle (``operator.add``, a module-level function; tensors add
        in place of their process).  If any actor raises, the future raises
        the error of the lowest failing rank, as ``call()``.

        Raises:
            TypeError: ``op`` is not callable or does not pickle, or the
                arguments do not fit the endpoint.
        """
        if not callable(op):
            raise TypeError(f"{self._what}.reduce() needs a callable op first, got {op!r}; "
                            f"e.g. {self._what}.reduce(operator.add, *args)")
        return _fold(self, args, kwargs, _reducer(op, f"{self._what}.reduce()"), "reduce")

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[Future[R]]:
        """Call every actor; yield one future per reply, in arrival order."""
        n = len(self._mesh)
        futures: list[Future[R]] = [Future(f"{self._what}.stream()[{i}]") for i in range(n)]
        what = self._what
        shape = self._mesh._shape.dense()
        self._send(args, kwargs, lambda addrs: Stream(futures, what, addrs, shape), None)
        return iter(futures)

    def broadcast(self, *args: Any, **kwargs: Any) -> None:
        """Send to every actor and return at once; nobody waits for an answer.

        An exception in the endpoint fails that actor and is reported to the
        mesh's owner (it cannot reach the caller).

        Raises:
            SupervisionError: an actor of the mesh is known to have failed.
        """
        self._send(args, kwargs, None, None)

    def _send_to(self, args: tuple[Any, ...], kwargs: dict[str, Any], port: Port[R] | None,
                 ranks: list[int] | None) -> None:
        """Check a call and cast it to ``ranks`` (all: None), every reply to ``port`` (none: nobody hears)."""
        mesh = self._ready(args, kwargs)
        reply_to = None if port is None else port._port
        mesh._ref.cast(self._name, self._what, args, kwargs, None, reply_to=reply_to, ranks=ranks)

    # --- For a layer built on the public API (the tensor engine): a stream that outlives dead actors.

    def broadcast_live(self, *args: Any, **kwargs: Any) -> None:
        """:meth:`broadcast`, skipping every actor known or found dead instead of raising.

        Each live actor of the mesh gets the message exactly once, whatever
        became of the others; nobody waits for an answer.

        Raises:
            TypeError: the arguments do not fit the signature, or do not pickle.
        """
        mesh = self._ready(args, kwargs)
        mesh._ref.cast(self._name, self._what, args, kwargs, None, skip_dead=True)


def send(
    endpoint: Endpoint[R],
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    port: Port[R] | None = None,
    selection: Literal["all", "choose"] = "all",
) -> None:
    """Call ``endpoint`` on every actor of its mesh, or on one at random; each reply goes to ``port``.

    Monarch's low-level primitive (``monarch.actor.send``): returns at once.
    With a ``port`` (from :meth:`Channel.open`, here or received from
    another actor) each actor's result arrives there as one message, and an
    endpoint's exception arrives as an ``ActorError`` that its ``recv()``
    raises; a ranked port gets ``(rank, value)``.  Without one nobody hears
    the replies, as with ``broadcast()``.

    Raises:
        TypeError: ``endpoint`` is not an endpoint of an actor mesh, ``port``
            is not a Port, or the arguments do not fit or do not pickle.
        ValueError: ``selection`` is neither ``"all"`` nor ``"choose"``.
        SupervisionError: an actor it is sent to is known to have failed.
    """
    if not isinstance(endpoint, Endpoint):
        raise TypeError(f"send() needs an endpoint of an actor mesh, got {endpoint!r}; e.g. send(mesh.step, (1,))")
    if port is not None and not isinstance(port, Port):
        raise TypeError(f"send() port must be a Port, got {port!r}; e.g. port, receiver = Channel.open()")
    if selection not in ("all", "choose"):
        raise ValueError(f"send() selection must be 'all' or 'choose', got {selection!r}; e.g. selection='choose'")
    if not isinstance(args, tuple):
        raise TypeError(f"send() args must be a tuple, got {args!r}; e.g. send({endpoint._what}, (x,))")
    ranks = [random.randrange(len(endpoint._mesh))] if selection == "choose" else None
    endpoint._send_to(args, dict(kwargs or {}), port, ranks)


#: op -> the Fold of ``endpoint.reduce(op)``: pickled once per op, not per call (a loop reduces with a few)
_REDUCERS: dict[int, tuple[Callable[[Any, Any], Any], Fold]] = {}


def _reducer(op: Callable[[Any, Any], Any], what: str) -> Fold:
    cached = _REDUCERS.get(id(op))
    if cached is not None and cached[0] is op:
        return cached[1]
    fold = Fold(None, None, op, what)
    if len(_REDUCERS) >= 32:
        _REDUCERS.clear()
    _REDUCERS[id(op)] = (op, fold)
    return fold


def _fold(endpoint: Endpoint[Any], args: tuple[Any, ...], kwargs: dict[str, Any], fold: Fold,
          verb: str) -> Future[Any]:
    """Call every actor of ``endpoint``'s mesh; the replies folded with ``fold`` (in the tree, if cast down one)."""
    fut: Future[Any] = Future(f"{endpoint._what}.{verb}()")
    shape = endpoint._mesh._shape.dense()
    what = endpoint._what
    endpoint._send(args, kwargs, lambda addrs: Folded(fut, what, shape, addrs, fold), None)
    return fut


class Accumulator(Generic[R, A]):
    """A left fold over the replies of an endpoint: ``Accumulator(mesh.value, 0, operator.add)``.

    :meth:`accumulate` calls every actor (as ``stream()`` does) and folds
    the replies in their arrival order, starting from ``identity``: Monarch's
    semantics, where the caller receives every reply.

    With ``merge`` (combining two partial folds: ``operator.add`` for a sum)
    the fold runs in the tree of the cast instead (see
    :meth:`Endpoint.reduce`): each process of the tree folds its subtree's
    replies into one partial, ``merge`` joins partials, and the caller
    receives one value per child.  ``combine`` and ``merge`` must then
    pickle, and the result must not depend on the order replies meet.
    """

    def __init__(self, endpoint: Endpoint[R], identity: A, combine: Callable[[A, R], A],
                 merge: Callable[[A, A], A] | None = None) -> None:
        if not isinstance(endpoint, Endpoint):
            raise TypeError(f"Accumulator needs an endpoint of an actor mesh, got {endpoint!r}; "
                            "e.g. Accumulator(mesh.value, 0, operator.add)")
        if not callable(combine):
            raise TypeError(f"Accumulator combine must be callable, got {combine!r}; e.g. operator.add")
        if merge is not None and not callable(merge):
            raise TypeError(f"Accumulator merge must be callable or None, got {merge!r}; e.g. operator.add")
        self._endpoint = endpoint
        self._identity = identity
        self._combine = combine
        self._fold = None if merge is None else Fold(identity, combine, merge, f"Accumulator({endpoint._what})")

    def accumulate(self, *args: Any, **kwargs: Any) -> Future[A]:
        """Call every actor; the future gives ``combine(...combine(identity, r1)..., rN)``.

        It fails with the first error to arrive (an endpoint's ``ActorError``,
        a ``SupervisionError``, or what ``combine`` raised); with ``merge``,
        with the error of the lowest failing rank.
        """
        if self._fold is not None:
            return _fold(self._endpoint, args, kwargs, self._fold, "accumulate")
        futures = list(self._endpoint.stream(*args, **kwargs))
        result: Future[A] = Future(f"{self._endpoint._what}.accumulate()")
        lock = threading.Lock()
        state: list[Any] = [self._identity, len(futures)]

        def arrived(fut: Any) -> None:
            with lock:
                if result.done():
                    return
                try:
                    state[0] = self._combine(state[0], fut.result())
                except BaseException as exc:
                    result.set_exception(exc)
                    return
                state[1] -= 1
                if state[1] == 0:
                    result.set_result(state[0])

        if not futures:
            result.set_result(self._identity)
        for fut in futures:
            fut.add_done_callback(arrived)
        return result


class ActorMesh(MeshTrait, Generic[T]):
    """Actors of one class, one per process of a process mesh.

    Returned by :meth:`ProcMesh.spawn`.  Its endpoints are attributes:
    ``mesh.step.call(x)``.  It slices like its process mesh, and pickles as a
    reference, so actors can call other actors.
    """

    def __init__(
        self,
        *,
        ref: MeshRef,
        name: str,
        class_name: str,
        endpoints: dict[str, EndpointInfo],
        methods: frozenset[str],
        initialized: Future[None] | None = None,
        owned: bool = False,
    ) -> None:
        self._ref = ref
        self._name = name
        self._class_name = class_name
        self._endpoints = endpoints
        self._methods = methods
        self._initialized = initialized
        self._owned = owned
        self._stopped = False

    @property
    def _shape(self) -> Shape:  # type: ignore[override]
        # The handle's: ProcMesh.shrink() re-points the spawner's handle to the survivors' shape.
        return self._ref.shape

    def _new_with_shape(self, shape: Shape) -> ActorMesh[T]:
        return ActorMesh(ref=self._ref.new_with_shape(shape), **self._state(), initialized=self._initialized)

    def _state(self) -> dict[str, Any]:
        # What a reference to this mesh keeps (see _new_with_shape and __reduce__), less the handle.
        return {"name": self._name, "class_name": self._class_name, "endpoints": self._endpoints,
                "methods": self._methods}

    def __repr__(self) -> str:
        sizes = self._sizes_repr()
        return f"ActorMesh({self._name!r}, {self._class_name}{', ' if sizes else ''}{sizes})"

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        info = self._endpoints.get(attr)
        if info is not None:
            endpoint: Endpoint[Any] = Endpoint(self, info)
            self.__dict__[attr] = endpoint  # later lookups skip __getattr__
            return endpoint
        if attr in self._methods:
            return NotAnEndpoint(self, attr)
        raise AttributeError(f"{self!r} has no endpoint {attr!r}; its endpoints are {sorted(self._endpoints)}")

    def __reduce__(self) -> tuple[Any, ...]:
        # Signatures stay behind (they may not pickle): the receiver skips the check.
        endpoints = {n: EndpointInfo(i.name, i.is_async, i.explicit_response_port, None)
                     for n, i in self._endpoints.items()}
        return (_rebuild, ({**self._state(), "endpoints": endpoints, "ref": self._ref},))

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
        return self._ref.stop(self._name, reason)

    def _refuse(self, method: str) -> NoReturn:
        # SupervisionError, as Monarch raises for a stopped actor (a RuntimeError too)
        raise SupervisionError(
            gone(f"{self._name}.{method}", "", f"it was stopped; cannot call {self!r} after stop(), spawn a new mesh"),
            endpoint=method,
        )

    # --- For a layer built on the public API (the tensor engine): one actor mesh, many process views.

    def with_shape(self, shape: Shape) -> ActorMesh[T]:
        """This mesh's actors in ``shape``, a view of the process mesh they were spawned on: a reference.

        ``shape`` is the ``view_shape`` of a view (a slice, split,
        flattening...) of that process mesh or of its ``base_mesh()``.
        """
        return self._new_with_shape(shape)


class NotAnEndpoint:
    """A plain method of a mesh's actor class, as ``mesh.method`` gives it: not callable remotely.

    Calling it, or one of its adverbs, raises with the fix; ``as_endpoint``
    makes it an :class:`Endpoint` (Monarch's ``NotAnEndpoint``).
    """

    def __init__(self, mesh: ActorMesh[Any], method: str) -> None:
        self._mesh = mesh
        self._method = method

    def __repr__(self) -> str:
        return f"<NotAnEndpoint {self._mesh._name}.{self._method} of {self._mesh!r}>"

    def _error(self) -> str:
        return (f"{self._mesh._class_name}.{self._method} is not an endpoint, so {self._mesh!r} cannot call it; "
                f"decorate it with @endpoint, or call as_endpoint(mesh.{self._method})")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Raise: a plain method cannot be called through a mesh.

        Raises:
            TypeError: always, with the fix.
        """
        raise TypeError(self._error())

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_"):
            raise AttributeError(attr)
        raise AttributeError(self._error())


def as_endpoint(
    not_an_endpoint: Any, *, propagate: Any = None, explicit_response_port: bool = False
) -> Endpoint[Any]:
    """Call a plain (not ``@endpoint``) method of a mesh's actors as if it were an endpoint.

    ``as_endpoint(mesh.method)`` returns an :class:`Endpoint` with every
    adverb; its arguments are not checked against the method's signature
    before sending (the actor's call checks them).  An endpoint is returned
    as it is.

    Args:
        not_an_endpoint: ``mesh.method`` for a method without ``@endpoint``.
        propagate: accepted for Monarch compatibility; unused.
        explicit_response_port: the method takes a :class:`Port` first and answers through it.

    Raises:
        TypeError: the argument is not a method of an actor mesh.
    """
    if isinstance(not_an_endpoint, Endpoint):
        return not_an_endpoint
    if not isinstance(not_an_endpoint, NotAnEndpoint):
        raise TypeError(
            f"as_endpoint expects a method of an actor mesh, got {not_an_endpoint!r}; "
            "pass mesh.method, e.g. as_endpoint(trainers.step)"
        )
    mesh, method = not_an_endpoint._mesh, not_an_endpoint._method
    how = "as_endpoint_port" if explicit_response_port else "as_endpoint"
    info = EndpointInfo(method, False, explicit_response_port, None)
    return Endpoint(mesh, info, name=f"{method}@{how}")


def _rebuild(state: dict[str, Any]) -> ActorMesh[Any]:
    return ActorMesh(**state)
