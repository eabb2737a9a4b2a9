"""Hosting actors in this process: mailboxes, actor threads, replies.

Each actor runs on a thread of its own and handles its mailbox in arrival
order.  A sync actor's thread, while its mailbox is empty, takes part in MPI
progress (see ``_progress``): under traffic it receives its own messages, so a
call costs no thread hand-off.  An async actor's thread runs an asyncio loop;
its endpoints await futures that the polling thread completes.

No exception raised by user code escapes this module: it becomes an error
reply to the caller, or, when nobody waits for an answer, a FAULT report to
the controller.
"""

from __future__ import annotations

import inspect
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..context import Context, Instance, _current
from ..errors import MeshInternalError
from ..shape import Extent, Point
from . import serialize as _serialize
from .protocol import Frame, Key, Kind, Status

if TYPE_CHECKING:
    import asyncio

    from .runtime import Runtime

__all__ = ["ActorHost"]

Addr = tuple[int, int]
Port = tuple[Addr, int]

# Results of these types are answered at once, without asking inspect.
_NOT_AWAITABLE = frozenset((int, float, str, bool, type(None), bytes, tuple, list, dict))
_CALL = Kind.CALL
# Results that are plain data by themselves (see _serialize.plain).
_SCALARS = _serialize.ATOMS
# The keyword arguments of every SITE_CALL (only unpacked, never changed).
_NO_KWARGS: dict[str, Any] = {}
_NO_BUFFERS: list[Any] = []


def _point(raw: tuple[int, tuple[str, ...], tuple[int, ...]]) -> Point:
    rank, labels, sizes = raw
    return Point(rank, Extent(labels, sizes))


class _Site:
    """A registered call site (see ``Kind.SITE_CALL``): actor, method, caller and point.

    The actor's thread fills in, on first use, what every call through the
    site needs: the bound endpoint and the context.
    """

    __slots__ = ("key", "method", "caller", "point", "fn", "ctx")

    def __init__(self, key: Key, method: str, caller: Addr, point: tuple[Any, ...]) -> None:
        self.key = key
        self.method = method
        self.caller = caller
        self.point = point
        self.fn: Callable[..., Any] | None = None
        self.ctx: Context | None = None


class _Cell:
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
        self.failure: str | None = None
        self.stop_reason: str | None = None
        self.mailbox: deque[tuple[Any, ...]] = deque()
        self.cond = threading.Condition()
        # the actor thread's id: it may fill its own mailbox while it polls
        self._tid: int | None = None
        # message point -> Context, for the few slices an actor is called through
        self._contexts: dict[tuple[Any, ...], Context] = {}
        # endpoint name -> (bound method, explicit response port), see _bind
        self._bound: dict[str, tuple[Callable[..., Any], bool]] = {}
        addr = self.runtime.addr
        self.actor_id = f"{name}[{point.rank}]@{addr[0]}.{addr[1]}"
        coords = ", ".join(f"{k}={v}" for k, v in point.items())
        self.header = f"### rank {point.rank} ({coords}) on {self.runtime.host} in actor {name!r}"
        self.identity = Instance(point, name, "", self.actor_id, None, creator, self)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        if is_async:
            import asyncio  # only async actors pay for it

            self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=f"mpimesh-actor-{self.actor_id}", daemon=True)
        self.finished = threading.Event()

    # -- mailbox -----------------------------------------------------------

    def put(self, item: tuple[Any, ...]) -> None:
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
        self.put(("stop", reason, None))

    # -- thread bodies -----------------------------------------------------

    def _main(self) -> None:
        try:
            if self.loop is None:
                self._tid = threading.get_ident()
                mailbox = self.mailbox
                wait = self.runtime.progress.wait
                has_mail = mailbox.__len__
                while True:
                    if not mailbox:
                        wait(has_mail, self.cond)
                    item = mailbox.popleft()
                    kind = item[0]
                    if kind == "site":
                        self._call_site(item)
                    elif kind == "call":
                        self._call(item, None)
                    elif not self._step(item, None):
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
        import asyncio

        self._wake = asyncio.Event()
        while True:
            while not self.mailbox:
                self._wake.clear()
                if self.mailbox:
                    break
                await self._wake.wait()
            if not await self._ahandle(self.mailbox.popleft()):
                break

    def _step(self, item: tuple[Any, ...], pending: list[Any] | None) -> bool:
        """Handle one mailbox item; False once the actor has stopped.

        An async actor passes ``pending``: a coroutine left there must be
        awaited before the next item (a sync actor passes ``None``).
        """
        kind = item[0]
        if kind == "call":
            self._call(item, pending)
        elif kind == "init":
            self._init(item)
        elif kind == "supervise":
            self._supervise(item[1], pending)
        else:
            return self._stop(item, pending)
        return True

    async def _ahandle(self, item: tuple[Any, ...]) -> bool:
        pending: list[Any] = []
        keep = self._step(item, pending)
        if pending:
            await pending[0]
        return keep

    # -- message kinds -------------------------------------------------------

    def _init(self, item: tuple[Any, ...]) -> None:
        _, body, buffers, port = item
        token = _current.set(Context(self.identity, self.point))
        try:
            cls, args, kwargs, proc_mesh, _preloaded = _serialize.loads(body, buffers)
            self.identity.class_name = cls.__qualname__
            self.identity.proc_mesh = proc_mesh
            self.instance = cls(*args, **kwargs)
        except BaseException as exc:
            self.state = "failed"
            self.failure = f"{type(exc).__name__} in __init__: {exc}"
            self._error(port, self.point.rank, exc)
        else:
            self.state = "running"
            self.runtime.reply(port, self.point.rank, Status.OK, None)
        finally:
            _current.reset(token)

    def _call(self, item: tuple[Any, ...], pending: list[Any] | None) -> None:
        _, frame, buffers, src = item
        method, payload, port, mpoint = frame[3], frame[4], frame[5], frame[6]
        index = mpoint[0]
        if self.state != "running":
            if port is not None:
                report = f"actor {self.actor_id} cannot take {method}(): it {self._why_not()}"
                self.runtime.reply(port, index, Status.FAILED, report)
            return
        contexts = self._contexts
        ctx = contexts.get(mpoint)
        if ctx is None:
            if len(contexts) > 64:
                contexts.clear()
            ctx = contexts[mpoint] = Context(self.identity, _point(mpoint))
        token: Any = _current.set(ctx)
        try:
            # plain arguments come unpickled with the frame (see Kind.CALL)
            args, kwargs = _serialize.loads(payload, buffers) if type(payload) is bytes else payload
            found = self._bound.get(method)
            if found is None:
                found = self._bind(method)
            fn, explicit_port = found
            if explicit_port:
                from ..channel import Port as PortObject

                args = (PortObject(port, index),) + tuple(args)
                port = None  # the method answers through its port
            result = fn(*args, **kwargs)
            if type(result) not in _NOT_AWAITABLE and inspect.isawaitable(result):
                if pending is None:
                    raise TypeError(f"endpoint {method} returned an awaitable in a sync actor; declare it async def")
                pending.append(self._finish_async(result, port, index, method, token))
                token = None
                return
        except BaseException as exc:
            self._failed_call(exc, port, index, method)
        else:
            if port is not None:
                self._answer(port, index, result, method)
        finally:
            if token is not None:
                _current.reset(token)

    def _call_site(self, item: tuple[Any, ...]) -> None:
        # A SITE_CALL to a sync actor: _call without the frame (the common case of call_one).
        _, site, pid, args = item
        fn = site.fn
        if fn is None or self.state != "running":
            if self.state == "running":
                fn, explicit_port = self._bound.get(site.method) or self._bind_quietly(site.method)
                if not explicit_port:
                    site.fn = fn
                    site.ctx = self._contexts.get(site.point) or Context(self.identity, _point(site.point))
            if site.fn is None or self.state != "running":
                # Not running, no such endpoint, or one that answers through
                # its own port: the general path says or does what is right.
                frame = (_CALL, None, site.key, site.method, (args, _NO_KWARGS), (site.caller, pid), site.point)
                self._call(("call", frame, _NO_BUFFERS, site.caller), None)
                return
            fn = site.fn
        port = (site.caller, pid)
        index = site.point[0]
        token = _current.set(site.ctx)
        try:
            result = fn(*args)
            if type(result) not in _NOT_AWAITABLE and inspect.isawaitable(result):
                raise TypeError(f"endpoint {site.method} returned an awaitable in a sync actor; declare it async def")
        except BaseException as exc:
            self._failed_call(exc, port, index, site.method)
        else:
            if type(result) in _SCALARS:
                self.runtime.reply_value(site.caller, pid, index, result)  # cannot fail to pickle
            else:
                self._answer(port, index, result, site.method)
        finally:
            _current.reset(token)

    def _bind_quietly(self, method: str) -> tuple[Callable[..., Any] | None, bool]:
        # _bind, but a missing endpoint gives (None, False): _call reports it.
        try:
            return self._bind(method)
        except AttributeError:
            return None, False

    def _bind(self, method: str) -> tuple[Callable[..., Any], bool]:
        # The bound endpoint and whether it answers through an explicit port, once per method.
        fn = getattr(self.instance, method)
        info = getattr(fn, "_mpimesh_endpoint", None)
        if info is None:
            raise AttributeError(f"{type(self.instance).__qualname__}.{method} is not an endpoint")
        found = self._bound[method] = (fn, bool(info["explicit_response_port"]))
        return found

    async def _finish_async(self, awaitable: Any, port: Port | None, index: int, method: str, token: Any) -> None:
        try:
            result = await awaitable
        except BaseException as exc:
            self._failed_call(exc, port, index, method)
        else:
            if port is not None:
                self._answer(port, index, result, method)
        finally:
            _current.reset(token)

    def _answer(self, port: Port, index: int, result: Any, method: str) -> None:
        try:
            self.runtime.reply(port, index, Status.OK, result)
        except Exception as exc:
            error = TypeError(
                f"cannot pickle the result of endpoint {method} ({_serialize.describe(result)}): {exc}; "
                "return plain data, numpy arrays or tensors"
            )
            self._error(port, index, error)

    def _failed_call(self, exc: BaseException, port: Port | None, index: int, method: str) -> None:
        if port is not None and isinstance(exc, Exception):
            self._error(port, index, exc)
            return
        # No caller to tell (broadcast), or not an ordinary exception: the
        # actor fails and its owner hears about it.
        self.state = "failed"
        self.failure = f"{type(exc).__name__} in {method}: {exc}"
        if port is not None:
            self.runtime.reply(port, index, Status.FAILED, f"actor {self.actor_id} failed: {self.failure}")
        self._report_fault(exc, method)

    def _error(self, port: Port | None, index: int, exc: BaseException) -> None:
        if port is None:
            return
        payload = _serialize.error_payload(exc, self.header, self.point.rank, dict(self.point), self.runtime.host)
        self.runtime.reply(port, index, Status.ERROR, payload)

    def _why_not(self) -> str:
        if self.state == "failed":
            return f"failed ({self.failure})"
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

    # -- supervision -----------------------------------------------------------

    def _supervise(self, failure: Any, pending: list[Any] | None) -> None:
        """A mesh this actor owns failed: ``__supervise__`` decides (Monarch's contract)."""
        hook = getattr(self.instance, "__supervise__", None)
        if hook is None or self.state != "running":
            self._unhandled(failure, None)
            return
        token = _current.set(Context(self.identity, self.point))
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
                return
        except Exception as exc:
            self._unhandled(failure, exc)
        else:
            if not handled:
                self._unhandled(failure, None)
        finally:
            _current.reset(token)

    def _unhandled(self, failure: Any, raised: BaseException | None) -> None:
        # Not handled: this actor fails too, and its own owner hears of both.
        self.state = "failed"
        extra = f"; __supervise__ raised {type(raised).__name__}: {raised}" if raised is not None else ""
        self.failure = f"unhandled failure of its mesh {failure.mesh_name!r}{extra}"
        self._fault(f"actor {self.actor_id} on {self.runtime.host} did not handle a failure{extra}:\n"
                    f"  {failure.report()}")

    def _stop(self, item: tuple[Any, ...], pending: list[Any] | None) -> bool:
        _, reason, done = item
        self.stop_reason = reason
        cleanup = getattr(self.instance, "__cleanup__", None)
        if cleanup is not None:
            token = _current.set(Context(self.identity, self.point))
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
                _current.reset(token)
        self._stopped(done)
        return False

    def _stopped(self, done: Callable[[], None] | None) -> None:
        if self.state != "failed":
            self.state = "stopped"
        self.host.forget(self.key, self.stop_reason or "stopped")
        if done is not None:
            done()


class ActorHost:
    """The actors living in this process."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.lock = threading.Lock()
        self.cells: dict[Key, _Cell] = {}
        # Calls that overtook their SPAWN (sent by another process than the
        # spawner): held until the actor exists.
        self.parked: dict[Key, list[tuple[Any, ...]]] = {}
        self.tombstones: dict[Key, str] = {}
        # call site -> (actor key, method, caller's address, message point), see Kind.SITE_CALL
        self.sites: dict[int, _Site] = {}
        # Every actor thread ever started: the process must not finalize MPI
        # while one of them is still on its way out (MPICH keeps per-thread
        # state and hangs in MPI_Finalize otherwise).
        self.threads: list[threading.Thread] = []

    def on_spawn(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        _, _, key, name, point, is_async, body, port, (creator, spawner), path = frame
        for entry in reversed(path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        cell = _Cell(self, key, name, _point(point), is_async, creator, spawner)
        with self.lock:
            self.cells[key] = cell
            parked = self.parked.pop(key, [])
        cell.put(("init", body, buffers, port))
        for item in parked:
            cell.put(item)
        self.threads = [t for t in self.threads if t.is_alive()]
        self.threads.append(cell.thread)
        cell.thread.start()

    def on_call(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        if len(frame) > 7:
            # (actor, method, caller, point) of later SITE_CALLs from the caller
            self.sites[frame[7]] = _Site(frame[2], frame[3], frame[5][0], frame[6])
        key = frame[2]
        cell = self.cells.get(key)
        if cell is not None:
            cell.put(("call", frame, buffers, src))
            return
        with self.lock:
            cell = self.cells.get(key)
            if cell is None:
                reason = self.tombstones.get(key)
                if reason is None:
                    self.parked.setdefault(key, []).append(("call", frame, buffers, src))
                    return
        if cell is not None:
            cell.put(("call", frame, buffers, src))
            return
        port, mpoint = frame[5], frame[6]
        if port is not None:
            self.runtime.reply(port, mpoint[0], Status.FAILED, f"actor {frame[3]}() target is gone: {reason}")

    def on_site_call(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        _, _, number, pid, args = frame
        site = self.sites.get(number)
        if site is None:
            # Cannot happen: the registering CALL travelled the same path first.
            raise MeshInternalError(f"SITE_CALL from {src} names call site {number}, which was never registered here")
        cell = self.cells.get(site.key)
        if cell is not None and cell.loop is None:
            cell.put(("site", site, pid, args))
            return
        # an async actor, or one not there (yet, or any more)
        frame = (_CALL, None, site.key, site.method, (args, _NO_KWARGS), (site.caller, pid), site.point)
        self.on_call(src, frame, buffers)

    def on_stop(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        _, _, key, port, index, reason = frame
        if key is None:
            self.stop_all(reason, lambda: self._ack(port, index))
            return
        cell = self.cells.get(key)
        if cell is None:
            if port is not None:
                self.runtime.reply(port, index, Status.OK, None)
            return
        cell.put(("stop", reason, lambda: self._ack(port, index)))

    def _ack(self, port: Port | None, index: int) -> None:
        if port is not None:
            self.runtime.reply(port, index, Status.OK, None)

    def stop_all(self, reason: str, done: Callable[[], Any]) -> list[_Cell]:
        """Stop every actor; ``done()`` runs once all have stopped."""
        with self.lock:
            cells = list(self.cells.values())
        if not cells:
            done()
            return []
        left = [len(cells)]
        lock = threading.Lock()

        def one_done() -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                done()

        for cell in cells:
            cell.put(("stop", reason, one_done))
        return cells

    def forget(self, key: Key, reason: str) -> None:
        with self.lock:
            self.cells.pop(key, None)
            self.tombstones[key] = reason

    def wait_stopped(self, cells: list[_Cell], timeout: float) -> list[_Cell]:
        """Wait (bounded) for cells to finish; returns those still running."""
        deadline = time.monotonic() + timeout
        for cell in cells:
            cell.finished.wait(max(0.0, deadline - time.monotonic()))
        return [c for c in cells if not c.finished.is_set()]

    def join_threads(self, timeout: float) -> int:
        """Wait (bounded) until every actor thread has exited; returns how many still run."""
        deadline = time.monotonic() + timeout
        for thread in list(self.threads):
            thread.join(max(0.0, deadline - time.monotonic()))
        return sum(t.is_alive() for t in self.threads)
