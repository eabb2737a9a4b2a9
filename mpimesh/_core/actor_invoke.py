"""Calling one actor's endpoints: find the endpoint, unpickle the arguments, call, answer.

The invoker handles an actor's :class:`~.actor_mail.Call` and
:class:`~.actor_mail.SiteCall` items on the actor's thread.  No exception
raised by an endpoint escapes it: it becomes an error reply to the caller,
or, when nobody waits for an answer (a broadcast, an endpoint that answers
through its own port), a failure of the actor that its owner hears of.

An async endpoint's coroutine is awaited by the actor's loop before its next
item (or, ``@concurrent_endpoint``, as a task of its own); the invoker keeps
the calls that await, so that their callers hear at once if the actor
fails meanwhile.
"""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..context import Context, Instance, _context_var
from ..errors import MeshInternalError
from ..shape import Point
from . import protocol
from . import serialize as _serialize
from .actor_lifecycle import Lifecycle, Phase
from .actor_mail import Addr, Call, RawPoint, Site, SiteCall, as_point
from .actor_runner import AsyncRunner, Progress
from .logs import warn
from .ports import Port, gone
from .protocol import CONTROLLER, Key, PortRef, Status

__all__ = ["Cell", "Invoker", "Runtime"]

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .._transport.router import Router
    from .owners import Owners

# Results of these types are answered at once, without asking inspect.
_NOT_AWAITABLE = frozenset((int, float, str, bool, type(None), bytes, tuple, list, dict))
# Results that are plain data by themselves (see serialize.plain).
_SCALARS = _serialize.ATOMS
# The keyword arguments of every SITE_CALL (only unpacked, never changed).
_NO_KWARGS: dict[str, Any] = {}
_NO_BUFFERS: list[Any] = []
_RUNNING = Phase.RUNNING


class Runtime(Protocol):
    """What the actors need of this process's runtime."""

    @property
    def addr(self) -> Addr: ...

    @property
    def host(self) -> str: ...

    @property
    def progress(self) -> Progress: ...

    def reply(self, port: PortRef, index: int, status: int, value: Any) -> None: ...

    def reply_value(self, dest: Addr, pid: int, index: int, value: Any) -> None: ...

    def fault(self, key: Key, rank: int, report: str, spawner: Addr) -> None: ...

    @property
    def owners(self) -> Owners: ...

    @property
    def router(self) -> Router: ...

    @property
    def dead(self) -> dict[Addr, str]: ...


class Cell(Protocol):
    """What the invoker uses of its actor (``actor_cell.ActorCell``)."""

    instance: Any
    identity: Instance
    name: str
    point: Point
    spawner: Addr
    actor_id: str
    header: str
    class_path: str
    last_error: BaseException | None
    py_busy: tuple[str, float] | None
    py_calls: int
    call_bytes: int

    def report_fault(self, exc: BaseException, where: str) -> None: ...


class Invoker:
    """Calls the endpoints of one actor and answers their callers.

    Args:
        cell: the actor.
        runtime: this process's runtime, which sends the replies.
        lifecycle: the actor's: only a running actor is called, and an endpoint can fail it.
        aio: an async actor's runner (None for a sync actor), which awaits what endpoints return.
    """

    def __init__(self, cell: Cell, runtime: Runtime, lifecycle: Lifecycle, aio: AsyncRunner | None) -> None:
        self._cell = cell
        self._runtime = runtime
        self._life = lifecycle
        self._aio = aio
        # message point -> Context, for the few slices an actor is called through
        self._contexts: dict[RawPoint, Context] = {}
        # endpoint name -> (bound method, explicit response port, concurrent), see _bind
        self._bound: dict[str, tuple[Callable[..., Any], bool, bool]] = {}
        # calls whose coroutine is awaiting, by a number of their own: (port, index, method);
        # if the actor fails meanwhile their callers are told at once (Monarch, issue #14)
        self._awaiting: dict[int, tuple[PortRef, int, str]] = {}
        self._awaiting_ids = itertools.count()
        # the mailbox call whose coroutine the loop awaits (its key): fail_awaiting cancels
        # it, so that a failed actor does not finish it (its stop() must not wait for it)
        self._main_key: int | None = None

    # -- the handlers of call items ----------------------------------------

    def call(self, item: Call, pending: list[Any] | None) -> bool:
        """Handle a CALL: refused unless the actor runs, else the endpoint is called."""
        _, _, _, method, args, port, point, *_ = item.frame
        index = point[0]
        if type(args) is bytes:
            self._cell.call_bytes += len(args) + sum(memoryview(b).nbytes for b in item.buffers)
        if self._life.phase is not _RUNNING:
            if port is not None:
                self.refuse(port, index, method, point, f"Actor {self._cell.actor_id} {self._life.why_not()}")
            return True
        token = _context_var.set(self._contexts.get(point) or self._context(point))
        try:
            try:
                # plain arguments come unpickled with the frame (see protocol.call)
                args, kwargs = _serialize.loads(args, item.buffers) if type(args) is bytes else args
                fn, explicit_port, concurrent = self._bound.get(method) or self._bind(method)
            except BaseException as exc:  # arguments that do not unpickle, or no such endpoint
                self._failed(exc, port, index, method)
                return True
            if concurrent:
                self._start_concurrent(fn, args, kwargs, port, index, method, explicit_port)
            elif explicit_port:
                # The method answers through its port; if it raises, the
                # actor fails and the port hears of that (Monarch's contract).
                args = (Port(port, index), *args)
                self._invoke(fn, args, kwargs, None, index, method, pending, failed_port=port)
            else:
                self._invoke(fn, args, kwargs, port, index, method, pending)
        finally:
            _context_var.reset(token)
        return True

    def call_site(self, item: SiteCall, pending: list[Any] | None) -> bool:
        """Handle a SITE_CALL: the site's cached endpoint and context, or the general path."""
        site = item.site
        fn = site.fn
        running = self._life.phase is _RUNNING
        if fn is None and running:
            fn = self._bind_site(site)
        if fn is None or not running:
            # Not running, no such endpoint, or one that answers through its
            # own port: the general path says or does what is right.
            frame = protocol.call(None, site.key, site.method, (item.args, _NO_KWARGS), (site.caller, item.pid),
                                  site.point)
            return self.call(Call(frame, _NO_BUFFERS), pending)
        token = _context_var.set(site.ctx)  # type: ignore[arg-type]
        try:
            self._invoke(fn, item.args, _NO_KWARGS, (site.caller, item.pid), site.point[0], site.method, pending)
        finally:
            _context_var.reset(token)
        return True

    def site_done(self, site: Site, pid: int, result: Any, exc: BaseException | None) -> None:
        """The end of a call through ``site`` that native/site.c made: its error, or a result not a scalar.

        What :meth:`_invoke` does after the endpoint returns or raises, for
        the calls it does not answer itself (in the site's context, the
        actor no longer busy).
        """
        port = (site.caller, pid)
        index = site.point[0]
        if exc is None and type(result) not in _NOT_AWAITABLE and inspect.isawaitable(result):
            exc = TypeError(f"endpoint {site.method} returned an awaitable in a sync actor; declare it async def")
        if exc is not None:
            self._failed(exc, port, index, site.method)
        else:
            self._answer(port, index, result, site.method)

    def site_again(self, site: Site, pid: int, args: tuple[Any, ...]) -> None:
        """A call through ``site`` that native/site.c took but leaves to the Python path (the actor stopped, ...)."""
        self.call_site(SiteCall(site, pid, args), None)

    # -- calling -----------------------------------------------------------

    def _invoke(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], port: PortRef | None,
        index: int, method: str, pending: list[Any] | None, failed_port: PortRef | None = None,
    ) -> None:
        """Call an endpoint and answer the caller (if any) with its result or its error.

        An async actor's coroutine goes to ``pending``, and
        :meth:`_finish_async` answers once it is done.  ``failed_port``: the
        explicit response port of an endpoint that answers by itself, told
        if the endpoint raises.
        """
        cell = self._cell
        cell.py_calls += 1
        cell.py_busy = (method, time.monotonic())
        try:
            result = fn(*args, **kwargs) if kwargs else fn(*args)  # no dict built for the common call
            if type(result) not in _NOT_AWAITABLE and inspect.isawaitable(result):
                if pending is None:
                    raise TypeError(f"endpoint {method} returned an awaitable in a sync actor; declare it async def")
                # busy until the coroutine ends (_finish_async): the actor takes no other message meanwhile
                pending.append(self._finish_async(result, port, index, method, _context_var.get(), failed_port))
                return
        except BaseException as exc:
            cell.py_busy = None
            self._failed(exc, port, index, method, failed_port)
        else:
            cell.py_busy = None
            if port is not None and type(result) in _SCALARS:
                self._runtime.reply_value(port[0], port[1], index, result)  # plain data: cannot fail to pickle
            else:
                self._answer(port, index, result, method)

    def _start_concurrent(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], port: PortRef | None,
        index: int, method: str, explicit_port: bool,
    ) -> None:
        """Start a ``@concurrent_endpoint`` call as a task: the actor takes its next message meanwhile.

        An exception that escapes the body reaches the caller as an
        ActorError; one that escapes a body answering through its own port
        fails the actor (the caller gets a SupervisionError).  stop()
        cancels the tasks still running.
        """
        aio = self._aio
        if aio is None:  # endpoint_table: a class with a concurrent endpoint is an async actor
            raise MeshInternalError(f"concurrent endpoint {method} in the sync actor {self._cell.actor_id}")
        if explicit_port:
            args = (Port(port, index), *args)  # type: ignore[arg-type]  # as in call: a broadcast has none
        try:
            coro = fn(*args, **kwargs)
        except BaseException as exc:
            self._failed(exc, None, index, method, port)
            return
        answer_to = None if explicit_port else port
        aio.start_task(self._finish_async(coro, answer_to, index, method, _context_var.get(), port, concurrent=True))

    async def _finish_async(
        self, awaitable: Awaitable[Any], port: PortRef | None, index: int, method: str, ctx: Context,
        failed_port: PortRef | None = None, concurrent: bool = False,
    ) -> None:
        # The rest of _invoke for a coroutine: await it, in the message's context, then answer.
        # `concurrent`: a task of its own, which stop() may cancel.
        import asyncio

        token = _context_var.set(ctx)
        told = port if port is not None else failed_port
        key = next(self._awaiting_ids)
        if told is not None:
            self._awaiting[key] = (told, index, method)
        if not concurrent:
            self._main_key = key
        try:
            result = await awaitable
        except asyncio.CancelledError:
            if not concurrent:
                raise
            if failed_port is not None and self._claim(key):  # stop() cancelled it
                self.refuse(failed_port, index, method, None,
                            f"Actor {self._cell.actor_id} stopped before {method}() finished")
        except BaseException as exc:
            if told is None or self._claim(key):
                self._failed(exc, port, index, method, failed_port)
        else:
            if told is None or self._claim(key):
                self._answer(port, index, result, method)
        finally:
            self._awaiting.pop(key, None)
            if not concurrent:
                self._main_key = None
                self._cell.py_busy = None
            _context_var.reset(token)

    def _claim(self, key: int) -> bool:
        # Whether the call `key` is still this coroutine's to answer (fail_awaiting may have answered it).
        return self._awaiting.pop(key, None) is not None

    def fail_awaiting(self, cause: str) -> None:
        """The actor failed while calls awaited: tell their callers now, with ``cause``.

        They get a SupervisionError now rather than a result from a failed
        actor later (Monarch: pending calls fail), and the mailbox call's
        coroutine is cancelled, so that stop() does not wait for it.
        """
        awaiting = list(self._awaiting.values())
        if self._main_key in self._awaiting and self._aio is not None:
            self._aio.abandon_current()
        self._awaiting.clear()
        for port, index, method in awaiting:
            try:
                self.refuse(port, index, method, None, cause)
            except Exception as exc:
                warn(f"actor {self._cell.actor_id} telling a caller it failed: {exc}")

    # -- endpoints and contexts --------------------------------------------

    def _context(self, point: RawPoint) -> Context:
        # The context of messages to `point`, kept for the next ones.
        contexts = self._contexts
        if len(contexts) > 64:
            contexts.clear()
        ctx = contexts[point] = Context(self._cell.identity, as_point(point))
        return ctx

    def _bind(self, method: str) -> tuple[Callable[..., Any], bool, bool]:
        # The bound endpoint, whether it answers through an explicit port and
        # whether its calls overlap, once per method.
        # "name@as_endpoint[_port]": any public method, called through as_endpoint()
        name, _, how = method.partition("@")
        instance = self._cell.instance
        fn = getattr(instance, name)
        info = getattr(fn, "_mpimesh_endpoint", None)
        if info is not None:
            found = (fn, bool(info["explicit_response_port"]), bool(info.get("concurrent")))
        elif how and not name.startswith("_") and callable(fn):
            found = (fn, how == "as_endpoint_port", False)
        else:
            raise AttributeError(f"{type(instance).__qualname__}.{method} is not an endpoint")
        self._bound[method] = found
        return found

    def _bind_site(self, site: Site) -> Callable[..., Any] | None:
        # What every call through `site` needs, once: the bound endpoint and the
        # context.  None: no such endpoint, or one that answers through a port.
        try:
            fn, explicit_port, concurrent = self._bound.get(site.method) or self._bind(site.method)
        except AttributeError:
            return None
        if explicit_port or concurrent:
            return None
        site.ctx = self._contexts.get(site.point) or self._context(site.point)
        site.fn = fn
        return fn

    def unbind(self) -> None:
        """Drop the bound endpoints: the actor has stopped, its object must be let go."""
        self._bound.clear()

    # -- answers -----------------------------------------------------------

    def _answer(self, port: PortRef | None, index: int, result: Any, method: str) -> None:
        if port is None:
            return
        try:
            self._runtime.reply(port, index, Status.OK, result)
        except Exception as exc:
            error = TypeError(
                f"cannot pickle the result of endpoint {method} ({_serialize.describe(result)}): {exc}; "
                "return plain data, numpy arrays or tensors"
            )
            self.error(port, index, error, method)

    def _failed(
        self, exc: BaseException, port: PortRef | None, index: int, method: str, failed_port: PortRef | None = None,
    ) -> None:
        cell = self._cell
        cell.last_error = exc
        if port is not None and isinstance(exc, Exception):
            self.error(port, index, exc, method)
            return
        # No caller to tell (broadcast), an endpoint that answers through its
        # own port, or not an ordinary exception: the actor fails and its
        # owner hears about it; a caller waiting gets a SupervisionError.
        self._life.fail(f"{type(exc).__name__} in {method}: {exc}")
        # An actor owner hears first: when it is the caller, its __supervise__ has the failure
        # before the call raises (one sender, one destination: FIFO), as in Monarch, where the
        # call fails because of the supervision event.  The controller hears second: its
        # default hook ends the script, which should see the SupervisionError first.
        owner_first = tuple(cell.spawner) != CONTROLLER
        if owner_first:
            cell.report_fault(exc, method)
        told = port if port is not None else failed_port
        if told is not None:
            self.refuse(told, index, method, None, f"Actor {cell.actor_id} failed: {self._life.failure}")
        if not owner_first:
            cell.report_fault(exc, method)

    def error(self, port: PortRef | None, index: int, exc: BaseException, method: str) -> None:
        """Answer ``port`` with the error ``exc`` that ``method`` raised (an ActorError for the caller)."""
        if port is None:
            return
        cell = self._cell
        payload = _serialize.error_payload(exc, cell.header, cell.point.rank, dict(cell.point), self._runtime.host,
                                           cell.actor_id, f"{cell.name}.{method}")
        self._runtime.reply(port, index, Status.ERROR, payload)

    def refuse(self, port: PortRef, index: int, method: str, point: RawPoint | None, cause: str) -> None:
        """Answer ``port`` that this actor cannot answer a call of ``method`` (a SupervisionError), with ``cause``.

        Monarch's text (see ``ports.gone``); ``point``: the call's message
        point, named in the text if it has dimensions.
        """
        where = str(as_point(point)) if point is not None and point[1] else ""
        report = gone(f"{self._cell.name}.{method}", where, cause, self._cell.class_path)
        self._runtime.reply(port, index, Status.FAILED, report)
