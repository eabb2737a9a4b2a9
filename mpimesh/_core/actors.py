"""Hosting actors in this process: mailboxes, actor threads, replies.

Each actor runs on a thread of its own and handles its mailbox in arrival
order.  A sync actor's thread, while its mailbox is empty, takes part in MPI
progress (see ``progress``): under traffic it receives its own messages, so a
call costs no thread hand-off.  An async actor's thread runs an asyncio loop;
its endpoints await futures that the polling thread completes.

The mailbox holds small typed items (:class:`_Init`, :class:`_Call`,
:class:`_SiteCall`, :class:`_Supervise`, :class:`_Stop`); ``_HANDLERS`` maps
each to the :class:`_Actor` method that handles it.

No exception raised by user code escapes this module: it becomes an error
reply to the caller, or, when nobody waits for an answer, a FAULT report to
the process that spawned the actor.
"""

from __future__ import annotations

import inspect
import itertools
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..config import settings
from ..context import Context, Instance, _context_var
from ..errors import MeshInternalError
from ..shape import Extent, Point
from . import protocol
from . import serialize as _serialize
from .owners import Owners
from .ports import Port, gone
from .protocol import CONTROLLER, Frame, Key, PortRef, Status

if TYPE_CHECKING:
    import asyncio

    from ..supervision import MeshFailure

__all__ = ["ActorHost"]

Addr = tuple[int, int]
#: A message point as it travels: ``(rank, labels, sizes)``.
RawPoint = tuple[int, tuple[str, ...], tuple[int, ...]]

# Results of these types are answered at once, without asking inspect.
_NOT_AWAITABLE = frozenset((int, float, str, bool, type(None), bytes, tuple, list, dict))
# Results that are plain data by themselves (see serialize.plain).
_SCALARS = _serialize.ATOMS
# The keyword arguments of every SITE_CALL (only unpacked, never changed).
_NO_KWARGS: dict[str, Any] = {}
_NO_BUFFERS: list[Any] = []


class _Progress(Protocol):
    def wait(self, done: Callable[[], object], cond: threading.Condition, timeout: float | None = None) -> bool: ...


class _Runtime(Protocol):
    """What the actor host needs of this process's runtime."""

    @property
    def addr(self) -> Addr: ...

    @property
    def host(self) -> str: ...

    @property
    def progress(self) -> _Progress: ...

    def reply(self, port: PortRef, index: int, status: int, value: Any) -> None: ...

    def reply_value(self, dest: Addr, pid: int, index: int, value: Any) -> None: ...

    def fault(self, key: Key, rank: int, report: str, spawner: Addr) -> None: ...

    @property
    def owners(self) -> Owners: ...


def _point(raw: RawPoint) -> Point:
    rank, labels, sizes = raw
    return Point(rank, Extent(labels, sizes))


class _Site:
    """A registered call site (see ``protocol.site_call``): actor, method, caller and point.

    The actor's thread fills in, on first use, what every call through the
    site needs: the bound endpoint and the context.
    """

    __slots__ = ("key", "method", "caller", "point", "fn", "ctx")

    def __init__(self, key: Key, method: str, caller: Addr, point: RawPoint) -> None:
        self.key = key
        self.method = method
        self.caller = caller
        self.point = point
        self.fn: Callable[..., Any] | None = None
        self.ctx: Context | None = None


# --- mailbox items ----------------------------------------------------------------------------------


class _Init:
    """Create the actor from the pickled class and arguments; always the first item."""

    __slots__ = ("body", "buffers", "port")

    def __init__(self, body: bytes, buffers: list[Any], port: PortRef) -> None:
        self.body = body
        self.buffers = buffers
        self.port = port


class _Call:
    """A CALL frame (see ``protocol.call``) and its out-of-band buffers."""

    __slots__ = ("frame", "buffers")

    def __init__(self, frame: Frame, buffers: list[Any]) -> None:
        self.frame = frame
        self.buffers = buffers


class _SiteCall:
    """A call through a registered site, to a sync actor (see ``protocol.site_call``)."""

    __slots__ = ("site", "pid", "args")

    def __init__(self, site: _Site, pid: int, args: tuple[Any, ...]) -> None:
        self.site = site
        self.pid = pid
        self.args = args


class _Supervise:
    """A mesh this actor owns has failed."""

    __slots__ = ("failure",)

    def __init__(self, failure: MeshFailure) -> None:
        self.failure = failure


class _Stop:
    """Stop after the items before this one; ``done()`` runs once the actor has stopped."""

    __slots__ = ("reason", "done", "owned")

    def __init__(self, reason: str, done: Callable[[], None] | None, owned: bool = True) -> None:
        self.reason = reason
        self.done = done
        #: stop the meshes the actor spawned first (not when the whole job ends: they stop anyway)
        self.owned = owned


_Item = _Init | _Call | _SiteCall | _Supervise | _Stop


# --- one actor ----------------------------------------------------------------------------------------


class _Actor:
    """One actor: its instance, mailbox and thread."""

    def __init__(
        self, host: ActorHost, key: Key, name: str, point: Point, is_async: bool, creator: str | None,
        spawner: Addr,
    ) -> None:
        self.host = host
        self.runtime = host.runtime
        self.key = key
        self.name = name
        self.point = point
        self.is_async = is_async
        self.creator = creator
        self.spawner = spawner
        self.instance: Any = None
        self.state = "starting"
        # stopped while its __init__ had not returned (see stop)
        self.abandoned = False
        # the actor's class as Monarch names it in errors (module.Class), once known
        self.class_path = ""
        # where `initialized` waits (see ActorHost.on_spawn)
        self.init_port: PortRef | None = None
        self.failure: str | None = None
        #: the exception of the last call that failed, its traceback kept for
        #: ``mpimesh.debug.pm`` (one per actor, dropped when the actor stops)
        self.last_error: BaseException | None = None
        self.stop_reason: str | None = None
        self.mailbox: deque[_Item] = deque()
        self.cond = threading.Condition()
        # the actor thread's id: it may fill its own mailbox while it polls
        self._tid: int | None = None
        # message point -> Context, for the few slices an actor is called through
        self._contexts: dict[RawPoint, Context] = {}
        # endpoint name -> (bound method, explicit response port, concurrent), see _bind
        self._bound: dict[str, tuple[Callable[..., Any], bool, bool]] = {}
        addr = self.runtime.addr
        self.actor_id = f"{name}[{point.rank}]@{addr[0]}.{addr[1]}"
        coords = ", ".join(f"{k}={v}" for k, v in point.items())
        self.header = f"### rank {point.rank} ({coords}) on {self.runtime.host} in actor {name!r}"
        self.identity = Instance(point, name, "", self.actor_id, None, creator, self)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        # an async actor's tasks outside the mailbox (__supervise__), kept referenced
        self._tasks: set[asyncio.Task[None]] = set()
        # calls whose coroutine is awaiting, by a number of their own: (port, index, method);
        # if the actor fails meanwhile their callers are told at once (Monarch, issue #14)
        self._awaiting: dict[int, tuple[PortRef, int, str]] = {}
        self._awaiting_ids = itertools.count()
        # the mailbox call whose coroutine _amain awaits (its key), and whether _fail_awaiting
        # cancelled it: a failed actor does not finish it (its stop() must not wait for it)
        self._main_key: int | None = None
        self._abandon = False
        self._main_task: asyncio.Task[None] | None = None
        if is_async:
            import asyncio  # only async actors pay for it

            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=f"mpimesh-actor-{self.actor_id}", daemon=True)
        self.finished = threading.Event()

    # -- mailbox -----------------------------------------------------------

    def put(self, item: _Item) -> None:
        """Add ``item`` to the mailbox and wake the actor's thread."""
        if self.loop is not None:
            self.mailbox.append(item)
            try:
                self.loop.call_soon_threadsafe(self._notify_async)
            except RuntimeError:
                pass  # loop closed: the actor has stopped
            return
        if threading.get_ident() == self._tid:
            # Put by the actor's own thread while it polls: nobody to wake.
            self.mailbox.append(item)
            return
        with self.cond:
            self.mailbox.append(item)
            self.cond.notify()

    def _notify_async(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def request_stop(self, reason: str) -> None:
        """Stop after the messages already in the mailbox (``Instance.stop``)."""
        self.put(_Stop(reason, None))

    def stop(self, reason: str, done: Callable[[], None], owned: bool = True) -> None:
        """Stop after the messages already in the mailbox; ``done()`` runs once stopped.

        An actor whose ``__init__`` has not returned (it may never) is let go
        at once: it counts as stopped, later calls are refused, and its
        thread ends when ``__init__`` returns, without running anything else.
        A thread cannot be interrupted, so this is the only bounded stop.
        """
        with self.cond:
            abandon = self.state in ("starting", "initializing")
            if abandon:
                self.abandoned = True
                self.state = "stopped"
                self.stop_reason = reason
        if not abandon:
            self.put(_Stop(reason, done, owned))
            return
        self.host.forget(self.key, self.name, reason)
        # Calls waiting behind __init__ are refused now, not when (if ever) it returns.
        while True:
            try:
                item = self.mailbox.popleft()
            except IndexError:
                break
            if isinstance(item, _SiteCall):
                site = item.site
                port: PortRef | None = (site.caller, item.pid)
                method, index = site.method, site.point[0]
            elif isinstance(item, _Call):
                method, port, index = item.frame[3], item.frame[5], item.frame[6][0]
            else:
                continue
            if port is not None:
                report = self._gone(method, None, f"Actor {self.actor_id} was stopped before its __init__ "
                                    f"returned ({reason})")
                self.runtime.reply(port, index, Status.FAILED, report)
        self.put(_Stop(reason, None))  # wakes the thread if __init__ never began
        if self.init_port is not None:
            report = self._gone("__init__", None, f"Actor {self.actor_id} was stopped before its __init__ "
                                f"returned ({reason})")
            self.runtime.reply(self.init_port, self.point.rank, Status.FAILED, report)
        done()

    def abort(self, reason: str) -> None:
        """Fail this actor now, with ``reason``, and tell its owner (``Instance.abort``)."""
        if self.state == "failed":
            return
        self.state = "failed"
        self.failure = f"aborted: {reason}"
        report = f"actor {self.actor_id} on {self.runtime.host} aborted: {reason}"
        self._fail_awaiting(report)
        self._fault(report)

    def supervise(self, failure: MeshFailure) -> None:
        """Hand a failure of a mesh this actor owns to its ``__supervise__``.

        A sync actor takes it in mailbox order.  An async actor takes it at
        once, as a task on its loop: even while one of its endpoints awaits
        (say, the very mesh that failed), as Monarch delivers supervision at
        the endpoint's await points.
        """
        loop = self.loop
        if loop is None:
            self.put(_Supervise(failure))
            return
        try:
            loop.call_soon_threadsafe(self._supervise_now, failure)
        except RuntimeError:  # the loop has closed: the actor has stopped
            self._unhandled(failure, None)

    def _supervise_now(self, failure: MeshFailure) -> None:
        # On an async actor's loop: __supervise__ now, its awaitable as a task.
        import asyncio

        pending: list[Any] = []
        self._supervise(_Supervise(failure), pending)
        if pending:
            task = asyncio.ensure_future(pending[0])
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # -- thread bodies -----------------------------------------------------

    def _main(self) -> None:
        try:
            if self.loop is None:
                self._tid = threading.get_ident()
                mailbox = self.mailbox
                wait = self.runtime.progress.wait
                has_mail = mailbox.__len__
                handlers = _HANDLERS
                while True:
                    if not mailbox:
                        wait(has_mail, self.cond)
                    item = mailbox.popleft()
                    if not handlers[type(item)](self, item, None):
                        break
            else:
                import asyncio

                asyncio.set_event_loop(self.loop)
                self.loop.run_until_complete(self._amain())
        except BaseException as exc:  # last resort: never let the thread die silently
            self._report_fault(exc, "actor thread")
        finally:
            self.state = "stopped" if self.state != "failed" else "failed"
            self.finished.set()
            if self.loop is not None:
                self.loop.close()

    async def _amain(self) -> None:
        # An async actor: a handler leaves in `pending` the coroutine to await before the next item.
        import asyncio

        self._wake = asyncio.Event()
        self._main_task = task = asyncio.current_task()
        handlers = _HANDLERS
        while True:
            while not self.mailbox:
                self._wake.clear()
                if self.mailbox:
                    break
                await self._wake.wait()
            item = self.mailbox.popleft()
            pending: list[Any] = []
            keep = handlers[type(item)](self, item, pending)
            if pending:
                try:
                    await pending[0]
                except asyncio.CancelledError:
                    if not self._abandon:
                        raise
                finally:
                    if self._abandon and task is not None:
                        self._abandon = False
                        task.uncancel()
            if not keep:
                break

    # -- mailbox items, by kind (see _HANDLERS) -------------------------------
    #
    # Each takes the item and `pending` (None for a sync actor), and returns
    # False once the actor has stopped.

    def _init(self, item: _Init, pending: list[Any] | None) -> bool:
        with self.cond:
            if self.state == "stopped":
                return False  # stopped before its __init__ began
            self.state = "initializing"
        token = _context_var.set(Context(self.identity, self.point))
        try:
            # the first item: the creator's heavy modules, imported by now (proc_mesh._PRELOAD)
            _, cls, args, kwargs, proc_mesh = _serialize.loads(item.body, item.buffers)
            self.identity.class_name = cls.__qualname__
            self.class_path = f"{cls.__module__}.{cls.__qualname__}"
            self.identity.proc_mesh = proc_mesh
            self.instance = cls(*args, **kwargs)
        except BaseException as exc:
            if self.abandoned:
                return False  # stopped while __init__ ran: nobody waits for it any more
            self.state = "failed"
            self.failure = f"{type(exc).__name__} in __init__: {exc}"
            # `initialized` fails with the exception, and the owner hears of
            # it as of any failed actor (Monarch: a supervision event).
            self._error(item.port, self.point.rank, exc, "__init__")
            self._report_fault(exc, "__init__")
        else:
            with self.cond:
                if self.state == "stopped":
                    # stop() let the actor go while __init__ ran (see stop): it never runs
                    return False
                self.state = "running"
            self.runtime.reply(item.port, self.point.rank, Status.OK, None)
        finally:
            _context_var.reset(token)
        return True

    def _call(self, item: _Call, pending: list[Any] | None) -> bool:
        _, _, _, method, args, port, point, *_ = item.frame
        index = point[0]
        if self.state != "running":
            if port is not None:
                report = self._gone(method, point, f"Actor {self.actor_id} {self._why_not()}")
                self.runtime.reply(port, index, Status.FAILED, report)
            return True
        token = _context_var.set(self._contexts.get(point) or self._context(point))
        try:
            try:
                # plain arguments come unpickled with the frame (see protocol.call)
                args, kwargs = _serialize.loads(args, item.buffers) if type(args) is bytes else args
                fn, explicit_port, concurrent = self._bound.get(method) or self._bind(method)
            except BaseException as exc:  # arguments that do not unpickle, or no such endpoint
                self._failed_call(exc, port, index, method)
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

    def _call_site(self, item: _SiteCall, pending: list[Any] | None) -> bool:
        site = item.site
        fn = site.fn
        if fn is None and self.state == "running":
            fn = self._bind_site(site)
        if fn is None or self.state != "running":
            # Not running, no such endpoint, or one that answers through its
            # own port: the general path says or does what is right.
            frame = protocol.call(None, site.key, site.method, (item.args, _NO_KWARGS), (site.caller, item.pid),
                                  site.point)
            return self._call(_Call(frame, _NO_BUFFERS), pending)
        token = _context_var.set(site.ctx)  # type: ignore[arg-type]
        try:
            self._invoke(fn, item.args, _NO_KWARGS, (site.caller, item.pid), site.point[0], site.method, pending)
        finally:
            _context_var.reset(token)
        return True

    def _supervise(self, item: _Supervise, pending: list[Any] | None) -> bool:
        """A mesh this actor owns failed: ``__supervise__`` decides (Monarch's contract)."""
        failure = item.failure
        hook = getattr(self.instance, "__supervise__", None)
        if hook is None or self.state != "running":
            self._unhandled(failure, None)
            return True
        token = _context_var.set(Context(self.identity, self.point))
        try:
            handled = hook(failure)
            if inspect.isawaitable(handled):
                if pending is None:
                    raise TypeError("__supervise__ returned an awaitable in a sync actor; make it a plain def")

                async def finish() -> None:
                    try:
                        if not await handled:
                            self._unhandled(failure, None)
                    except Exception as exc:
                        self._unhandled(failure, exc)

                pending.append(finish())
                return True
        except Exception as exc:
            self._unhandled(failure, exc)
        else:
            if not handled:
                self._unhandled(failure, None)
        finally:
            _context_var.reset(token)
        return True

    def _stop(self, item: _Stop, pending: list[Any] | None) -> bool:
        self.stop_reason = item.reason
        if pending is not None and self._tasks:
            pending.append(self._cancel_then_stop(item))
            return False
        return self._cleanup_then_stop(item, pending)

    async def _cancel_then_stop(self, item: _Stop) -> None:
        # Concurrent calls still running are cancelled before __cleanup__ (Monarch's order).
        import asyncio

        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pending: list[Any] = []
        self._cleanup_then_stop(item, pending)
        if pending:
            await pending[0]

    def _cleanup_then_stop(self, item: _Stop, pending: list[Any] | None) -> bool:
        done = item.done
        if item.owned:
            self._stop_owned()
        cleanup = getattr(self.instance, "__cleanup__", None)
        if cleanup is not None:
            token = _context_var.set(Context(self.identity, self.point))
            try:
                result = cleanup(None)
                if inspect.isawaitable(result) and pending is not None:

                    async def finish() -> None:
                        try:
                            await result
                        except Exception as exc:
                            self._report_fault(exc, "__cleanup__")
                        finally:
                            self._stopped(done)

                    pending.append(finish())
                    return False
            except Exception as exc:
                self._report_fault(exc, "__cleanup__")
            finally:
                _context_var.reset(token)
        self._stopped(done)
        return False

    def _stop_owned(self) -> None:
        # What this actor made stops first, bottom-up (Monarch), bounded: its node of the ownership tree.
        errors = self.runtime.owners.close_actor(self, f"its owner {self.actor_id} stopped", settings.cleanup_timeout)
        for exc in errors:
            print(f"mpimesh: actor {self.actor_id} stopping what it owns: {exc}", file=sys.stderr, flush=True)

    # -- calling endpoints ---------------------------------------------------

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
        try:
            result = fn(*args, **kwargs) if kwargs else fn(*args)  # no dict built for the common call
            if type(result) not in _NOT_AWAITABLE and inspect.isawaitable(result):
                if pending is None:
                    raise TypeError(f"endpoint {method} returned an awaitable in a sync actor; declare it async def")
                pending.append(self._finish_async(result, port, index, method, _context_var.get(), failed_port))
                return
        except BaseException as exc:
            self._failed_call(exc, port, index, method, failed_port)
        else:
            if port is not None and type(result) in _SCALARS:
                self.runtime.reply_value(port[0], port[1], index, result)  # plain data: cannot fail to pickle
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
        import asyncio

        if explicit_port:
            args = (Port(port, index), *args)  # type: ignore[arg-type]  # as in _call: a broadcast has none
        try:
            coro = fn(*args, **kwargs)
        except BaseException as exc:
            self._failed_call(exc, None, index, method, port)
            return
        answer_to = None if explicit_port else port
        task = asyncio.ensure_future(
            self._finish_async(coro, answer_to, index, method, _context_var.get(), port, concurrent=True)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _finish_async(
        self, awaitable: Any, port: PortRef | None, index: int, method: str, ctx: Context,
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
                report = self._gone(method, None, f"Actor {self.actor_id} stopped before {method}() finished")
                self.runtime.reply(failed_port, index, Status.FAILED, report)
        except BaseException as exc:
            if told is None or self._claim(key):
                self._failed_call(exc, port, index, method, failed_port)
        else:
            if told is None or self._claim(key):
                self._answer(port, index, result, method)
        finally:
            self._awaiting.pop(key, None)
            if not concurrent:
                self._main_key = None
            _context_var.reset(token)

    def _claim(self, key: int) -> bool:
        # Whether the call `key` is still this coroutine's to answer (_fail_awaiting may have answered it).
        return self._awaiting.pop(key, None) is not None

    def _fail_awaiting(self, cause: str) -> None:
        # The actor failed while calls awaited: their callers get a SupervisionError now
        # rather than a result from a failed actor later (Monarch: pending calls fail),
        # and the mailbox call's coroutine is cancelled, so that stop() does not wait for it.
        awaiting = list(self._awaiting.values())
        if self._main_key in self._awaiting and self._main_task is not None:
            self._abandon = True
            self._main_task.cancel()
        self._awaiting.clear()
        for port, index, method in awaiting:
            try:
                self.runtime.reply(port, index, Status.FAILED, self._gone(method, None, cause))
            except Exception as exc:
                print(f"mpimesh: actor {self.actor_id} telling a caller it failed: {exc}", file=sys.stderr,
                      flush=True)

    def _context(self, point: RawPoint) -> Context:
        # The context of messages to `point`, kept for the next ones.
        contexts = self._contexts
        if len(contexts) > 64:
            contexts.clear()
        ctx = contexts[point] = Context(self.identity, _point(point))
        return ctx

    def _bind(self, method: str) -> tuple[Callable[..., Any], bool, bool]:
        # The bound endpoint, whether it answers through an explicit port and
        # whether its calls overlap, once per method.
        # "name@as_endpoint[_port]": any public method, called through as_endpoint()
        name, _, how = method.partition("@")
        fn = getattr(self.instance, name)
        info = getattr(fn, "_mpimesh_endpoint", None)
        if info is not None:
            found = (fn, bool(info["explicit_response_port"]), bool(info.get("concurrent")))
        elif how and not name.startswith("_") and callable(fn):
            found = (fn, how == "as_endpoint_port", False)
        else:
            raise AttributeError(f"{type(self.instance).__qualname__}.{method} is not an endpoint")
        self._bound[method] = found
        return found

    def _bind_site(self, site: _Site) -> Callable[..., Any] | None:
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

    def _answer(self, port: PortRef | None, index: int, result: Any, method: str) -> None:
        if port is None:
            return
        try:
            self.runtime.reply(port, index, Status.OK, result)
        except Exception as exc:
            error = TypeError(
                f"cannot pickle the result of endpoint {method} ({_serialize.describe(result)}): {exc}; "
                "return plain data, numpy arrays or tensors"
            )
            self._error(port, index, error, method)

    def _failed_call(
        self, exc: BaseException, port: PortRef | None, index: int, method: str, failed_port: PortRef | None = None,
    ) -> None:
        self.last_error = exc
        if port is not None and isinstance(exc, Exception):
            self._error(port, index, exc, method)
            return
        # No caller to tell (broadcast), an endpoint that answers through its
        # own port, or not an ordinary exception: the actor fails and its
        # owner hears about it; a caller waiting gets a SupervisionError.
        self.state = "failed"
        self.failure = f"{type(exc).__name__} in {method}: {exc}"
        # An actor owner hears first: when it is the caller, its __supervise__ has the failure
        # before the call raises (one sender, one destination: FIFO), as in Monarch, where the
        # call fails because of the supervision event.  The controller hears second: its
        # default hook ends the script, which should see the SupervisionError first.
        owner_first = tuple(self.spawner) != CONTROLLER
        if owner_first:
            self._report_fault(exc, method)
        told = port if port is not None else failed_port
        if told is not None:
            report = self._gone(method, None, f"Actor {self.actor_id} failed: {self.failure}")
            self.runtime.reply(told, index, Status.FAILED, report)
        if not owner_first:
            self._report_fault(exc, method)

    def _error(self, port: PortRef | None, index: int, exc: BaseException, method: str) -> None:
        if port is None:
            return
        payload = _serialize.error_payload(exc, self.header, self.point.rank, dict(self.point), self.runtime.host,
                                           self.actor_id, f"{self.name}.{method}")
        self.runtime.reply(port, index, Status.ERROR, payload)

    def _gone(self, method: str, point: RawPoint | None, cause: str) -> str:
        # Monarch's text for a call this actor cannot answer (see ports.gone)
        where = str(_point(point)) if point is not None and point[1] else ""
        return gone(f"{self.name}.{method}", where, cause, self.class_path)

    def _why_not(self) -> str:
        if self.state == "failed":
            return f"is unhealthy with reason: {self.failure}"
        return f"is {self.state}"

    def _report_fault(self, exc: BaseException, where: str) -> None:
        import traceback

        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
        report = f"actor {self.actor_id} on {self.runtime.host}: {type(exc).__name__} in {where}: {exc}\n{text}"
        self._fault(report)

    def _fault(self, report: str) -> None:
        try:
            self.runtime.fault(self.key, self.point.rank, report, self.spawner)
        except Exception:
            print(report, file=sys.stderr, flush=True)

    def _unhandled(self, failure: MeshFailure, raised: BaseException | None) -> None:
        # Not handled: this actor fails too, and its own owner hears of both.
        self.state = "failed"
        extra = f"; __supervise__ raised {type(raised).__name__}: {raised}" if raised is not None else ""
        self.failure = f"unhandled failure of its mesh {failure.mesh_name!r}{extra}"
        report = f"actor {self.actor_id} on {self.runtime.host} did not handle a failure{extra}:\n  {failure.report()}"
        self._fail_awaiting(report)
        self._fault(report)

    def _stopped(self, done: Callable[[], None] | None) -> None:
        if self.state != "failed":
            self.state = "stopped"
        # Let go of the user's object now (its __del__ runs, as when a
        # Monarch actor stops), not when the cycle through `identity` is collected.
        self.instance = None
        self.last_error = None
        self._bound.clear()
        for site in list(self.host.sites.values()):
            if site.key == self.key:
                site.fn = None  # the bound method holds the object
        self.host.forget(self.key, self.name, self.stop_reason or "stopped")
        if done is not None:
            done()


#: The one dispatch of mailbox items: kind -> the _Actor method that handles it.
_HANDLERS: dict[type, Callable[[_Actor, Any, list[Any] | None], bool]] = {
    _Init: _Actor._init,
    _Call: _Actor._call,
    _SiteCall: _Actor._call_site,
    _Supervise: _Actor._supervise,
    _Stop: _Actor._stop,
}


# --- the actors of this process ---------------------------------------------------------------------------


class ActorHost:
    """The actors living in this process: creates them and hands them their messages."""

    def __init__(self, runtime: _Runtime) -> None:
        self.runtime = runtime
        self.lock = threading.Lock()
        self.live: dict[Key, _Actor] = {}
        # Calls that overtook their SPAWN (sent by another process than the
        # spawner): held until the actor exists.
        self.parked: dict[Key, list[_Item]] = {}
        # key -> (mesh name, why it stopped), to refuse later calls
        self.tombstones: dict[Key, tuple[str, str]] = {}
        # call site -> (actor key, method, caller's address, message point), see protocol.site_call
        self.sites: dict[int, _Site] = {}
        # Every actor thread ever started: the process must not finalize MPI
        # while one of them is still on its way out (MPICH keeps per-thread
        # state and hangs in MPI_Finalize otherwise).
        self.threads: list[threading.Thread] = []

    def on_spawn(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """The SPAWN handler: start the actor's thread, its ``__init__`` first in its mailbox."""
        _, _, key, name, point, is_async, body, port, (creator, spawner), path = frame
        for entry in reversed(path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        actor = _Actor(self, key, name, _point(point), is_async, creator, spawner)
        with self.lock:
            self.live[key] = actor
            parked = self.parked.pop(key, [])
        actor.init_port = port
        actor.put(_Init(body, buffers, port))
        for item in parked:
            actor.put(item)
        self.threads = [t for t in self.threads if t.is_alive()]
        self.threads.append(actor.thread)
        actor.thread.start()

    def on_call(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """The CALL handler: to the actor's mailbox, held until it exists, or refused if it is gone."""
        _, _, key, method, _, port, point, *site = frame
        if site:
            # (actor, method, caller, point) of later SITE_CALLs from the caller
            self.sites[site[0]] = _Site(key, method, port[0], point)
        actor = self.live.get(key)
        tomb = None
        if actor is None:
            with self.lock:
                actor = self.live.get(key)
                if actor is None:
                    tomb = self.tombstones.get(key)
                    if tomb is None:
                        self.parked.setdefault(key, []).append(_Call(frame, buffers))
                        return
        if actor is not None:
            actor.put(_Call(frame, buffers))
        elif port is not None and tomb is not None:
            name, reason = tomb
            where = str(_point(point)) if point[1] else ""
            report = gone(f"{name}.{method}", where, f"it is stopped ({reason})")
            self.runtime.reply(port, point[0], Status.FAILED, report)

    def on_site_call(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """The SITE_CALL handler: a call through a site that a CALL from ``src`` registered."""
        _, _, number, pid, args = frame
        site = self.sites.get(number)
        if site is None:
            # Cannot happen: the registering CALL travelled the same path first.
            raise MeshInternalError(f"SITE_CALL from {src} names call site {number}, which was never registered here")
        actor = self.live.get(site.key)
        if actor is not None and actor.loop is None:
            actor.put(_SiteCall(site, pid, args))
            return
        # an async actor, or one not there (yet, or any more)
        call = protocol.call(None, site.key, site.method, (args, _NO_KWARGS), (site.caller, pid), site.point)
        self.on_call(src, call, buffers)

    def on_stop(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """The STOP handler: stop one actor (or all) after its pending messages, then answer."""
        _, _, key, port, index, reason = frame
        if key is None:
            self.stop_all(reason, lambda: self._ack(port, index))
            return
        actor = self.live.get(key)
        if actor is None:
            self._ack(port, index)
            return
        actor.stop(reason, lambda: self._ack(port, index))

    def _ack(self, port: PortRef | None, index: int) -> None:
        if port is not None:
            self.runtime.reply(port, index, Status.OK, None)

    def stop_all(self, reason: str, done: Callable[[], Any], owned: bool = True) -> list[_Actor]:
        """Stop every actor; ``done()`` runs once all have stopped.

        ``owned``: each actor first stops the meshes it spawned; not when the
        whole job ends, which stops them all anyway.
        """
        with self.lock:
            actors = list(self.live.values())
        if not actors:
            done()
            return []
        left = [len(actors)]
        lock = threading.Lock()

        def one_done() -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                done()

        for actor in actors:
            actor.stop(reason, one_done, owned)
        return actors

    def forget(self, key: Key, name: str, reason: str) -> None:
        """The actor of mesh ``key`` (named ``name``) has stopped: later calls to it are refused with ``reason``."""
        with self.lock:
            self.live.pop(key, None)
            self.tombstones[key] = (name, reason)

    def wait_stopped(self, actors: list[_Actor], timeout: float) -> list[_Actor]:
        """Wait (bounded) for actors to finish; returns those still running."""
        deadline = time.monotonic() + timeout
        actors = [a for a in actors if not a.abandoned]  # stopped already, their __init__ may never return
        for actor in actors:
            actor.finished.wait(max(0.0, deadline - time.monotonic()))
        return [a for a in actors if not a.finished.is_set()]

    def join_threads(self, timeout: float) -> int:
        """Wait (bounded) until every actor thread has exited; returns how many still run."""
        deadline = time.monotonic() + timeout
        for thread in list(self.threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(t.is_alive() for t in self.threads)
