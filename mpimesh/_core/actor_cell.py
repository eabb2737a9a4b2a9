"""One actor hosted in this process: its object, lifecycle, runner and invoker, and its life's events.

The cell creates the user's object (its ``__init__`` is the first mailbox
item), delivers the failures of the meshes it owns to ``__supervise__``,
fails, and stops: what it spawned first, then ``__cleanup__``.  Calls go to
its :class:`~.actor_invoke.Invoker`; its thread is a
:class:`~.actor_runner.SyncRunner` or an :class:`~.actor_runner.AsyncRunner`;
its phase is its :class:`~.actor_lifecycle.Lifecycle`.

No exception raised by user code escapes: it becomes an error reply to the
caller, or, when nobody waits for an answer, a FAULT report to the process
that spawned the actor.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..config import settings
from ..context import Context, Instance, _context_var
from ..shape import Point
from . import serialize as _serialize
from .actor_invoke import Invoker, Runtime
from .actor_lifecycle import Lifecycle, Phase
from .actor_mail import Addr, Call, Init, Item, Site, SiteCall, Stop, Supervise
from .actor_runner import AsyncRunner, Handlers, SyncRunner
from .logs import warn
from .protocol import CALL_METHOD, CALL_POINT, CALL_REPLY_PORT, Key, PortRef, Status

if TYPE_CHECKING:
    from ..supervision import MeshFailure

__all__ = ["ActorCell", "Host"]


class Host(Protocol):
    """What a cell needs of the host of this process's actors (``actors.ActorHost``)."""

    @property
    def sites(self) -> dict[int, Site]: ...

    def forget(self, key: Key, name: str, reason: str) -> None: ...

    def close_owned(self, owner: object, reason: str, timeout: float) -> list[BaseException]: ...


class ActorCell:
    """One actor: its instance, lifecycle, runner (thread and mailbox) and invoker.

    Args:
        host: the host of this process's actors.
        runtime: this process's runtime.
        key: the key of the actor's mesh.
        name: the mesh's name.
        point: the actor's point in its mesh.
        is_async: whether its endpoints are coroutines (it runs an asyncio loop).
        creator: the id of the actor that spawned it (None: the controller script).
        spawner: the address of the process that spawned it, which hears of its failures.
    """

    def __init__(
        self, host: Host, runtime: Runtime, key: Key, name: str, point: Point, is_async: bool, creator: str | None,
        spawner: Addr,
    ) -> None:
        self.host = host
        self.runtime = runtime
        self.key = key
        self.name = name
        self.point = point
        self.is_async = is_async
        self.creator = creator
        self.spawner = spawner
        self.instance: Any = None
        # the actor's class as Monarch names it in errors (module.Class), once known
        self.class_path = ""
        # where `initialized` waits (see ActorHost.on_spawn)
        self.init_port: PortRef | None = None
        #: the exception of the last call that failed, its traceback kept for
        #: ``mpimesh.debug.pm`` (one per actor, dropped when the actor stops)
        self.last_error: BaseException | None = None
        # What the Python path runs (Invoker): the endpoint running and since when, the calls
        # taken; the calls a native call site runs are the lane's (calls, busy).
        self.py_busy: tuple[str, float] | None = None
        self.py_calls = 0
        #: bytes of the calls' pickled arguments (the dashboard's rates)
        self.call_bytes = 0
        addr = runtime.addr
        self.actor_id = f"{name}[{point.rank}]@{addr[0]}.{addr[1]}"
        coords = ", ".join(f"{k}={v}" for k, v in point.items())
        self.header = f"### rank {point.rank} ({coords}) on {runtime.host} in actor {name!r}"
        self.identity = Instance(point, name, "", self.actor_id, None, creator, self)
        self.lifecycle = Lifecycle(self.actor_id)
        thread_name = f"mpimesh-actor-{self.actor_id}"
        self.runner: SyncRunner | AsyncRunner
        if is_async:
            self.runner = aio = AsyncRunner(thread_name, self.lifecycle, self.report_fault)
        else:
            self.runner = SyncRunner(thread_name, runtime.progress, self.lifecycle, self.report_fault)
            aio = None
        self.invoker = Invoker(self, runtime, self.lifecycle, aio)
        #: add an item to the mailbox and wake the actor (the runner's, without a hop)
        self.put: Callable[[Item], None] = self.runner.put
        self.thread = self.runner.thread
        #: set once the actor's thread has ended
        self.finished = self.runner.finished

    @property
    def busy(self) -> tuple[str, float] | None:
        """``(endpoint, time.monotonic() at its start)`` while a sync endpoint runs, else None (the dashboard's)."""
        lane = getattr(self.runner, "lane", None)
        busy = lane.busy if lane is not None else None
        return busy if busy is not None else self.py_busy

    @property
    def calls(self) -> int:
        """The calls taken: by the Python path and by the native call sites (the dashboard's rates)."""
        lane = getattr(self.runner, "lane", None)
        return self.py_calls + (lane.calls if lane is not None else 0)

    @property
    def abandoned(self) -> bool:
        """Whether it was let go before its ``__init__`` returned (its thread may never end)."""
        return self.lifecycle.abandoned

    def start(self) -> None:
        """Start the actor's thread: the mailbox's items go to their handlers."""
        invoker = self.invoker
        handlers: Handlers = {
            Init: self._init,
            Call: invoker.call,
            SiteCall: invoker.call_site,
            Supervise: self._supervise,
            Stop: self._stop,
        }
        self.runner.start(handlers)

    # -- events from outside the actor's thread ------------------------------

    def request_stop(self, reason: str) -> None:
        """Stop after the messages already in the mailbox (``Instance.stop``)."""
        self.put(Stop(reason, None))

    def stop(self, reason: str, done: Callable[[], None], owned: bool = True) -> None:
        """Stop after the messages already in the mailbox; ``done()`` runs once stopped.

        An actor whose ``__init__`` has not returned (it may never) is let go
        at once: it counts as stopped, later calls are refused, and its
        thread ends when ``__init__`` returns, without running anything else.
        A thread cannot be interrupted, so this is the only bounded stop.
        """
        if not self.lifecycle.abandon(reason):
            self.put(Stop(reason, done, owned))
            return
        self.host.forget(self.key, self.name, reason)
        # Calls waiting behind __init__ are refused now, not when (if ever) it returns.
        cause = f"Actor {self.actor_id} was stopped before its __init__ returned ({reason})"
        self._refuse_mailbox(cause)
        self.put(Stop(reason, None))  # wakes the thread if __init__ never began
        if self.init_port is not None:
            self.invoker.refuse(self.init_port, self.point.rank, "__init__", None, cause)
        done()

    def _refuse_mailbox(self, cause: str) -> None:
        # Empty the mailbox of an actor that will run nothing more: each call
        # is refused with ``cause``, and each stop asked meanwhile is answered
        # (a second STOP, e.g. its process stopping while the actor is in
        # __cleanup__, would otherwise never be, and its sender waits out its bound).
        mailbox = self.runner.mailbox
        while True:
            try:
                item = mailbox.popleft()
            except IndexError:
                break
            if isinstance(item, SiteCall):
                site = item.site
                port: PortRef | None = (site.caller, item.pid)
                method, index = site.method, site.point[0]
            elif isinstance(item, Call):
                method, port, index = item.frame[CALL_METHOD], item.frame[CALL_REPLY_PORT], item.frame[CALL_POINT][0]
            elif isinstance(item, Stop):
                if item.done is not None:
                    item.done()
                continue
            else:
                continue
            if port is not None:
                self.invoker.refuse(port, index, method, None, cause)

    def abort(self, reason: str) -> None:
        """Fail this actor now, with ``reason``, and tell its owner (``Instance.abort``)."""
        if self.lifecycle.phase is Phase.FAILED:
            return
        self.lifecycle.fail(f"aborted: {reason}")
        report = f"actor {self.actor_id} on {self.runtime.host} aborted: {reason}"
        self.invoker.fail_awaiting(report)
        self._fault(report)

    def supervise(self, failure: MeshFailure) -> None:
        """Hand a failure of a mesh this actor owns to its ``__supervise__``.

        A sync actor takes it in mailbox order.  An async actor takes it at
        once, as a task on its loop: even while one of its endpoints awaits
        (say, the very mesh that failed), as Monarch delivers supervision at
        the endpoint's await points.
        """
        runner = self.runner
        if isinstance(runner, SyncRunner):
            runner.put(Supervise(failure))
        elif not runner.call_soon(self._supervise_now, runner, failure):  # the actor has stopped
            self._unhandled(failure, None)

    def _supervise_now(self, aio: AsyncRunner, failure: MeshFailure) -> None:
        # On an async actor's loop: __supervise__ now, its awaitable as a task.
        pending: list[Any] = []
        self._supervise(Supervise(failure), pending)
        if pending:
            aio.start_task(pending[0])

    # -- mailbox items, by kind (see start) ------------------------------------
    #
    # Each takes the item and `pending` (None for a sync actor), and returns
    # False once the actor has stopped.

    def _init(self, item: Init, pending: list[Any] | None) -> bool:
        life = self.lifecycle
        if not life.begin_init():
            return False  # stopped before its __init__ began
        token = _context_var.set(Context(self.identity, self.point))
        try:
            # the first item: the creator's heavy modules, imported by now (settings.preload)
            _, cls, args, kwargs, proc_mesh = _serialize.loads(item.body, item.buffers)
            self.identity.class_name = cls.__qualname__
            self.class_path = f"{cls.__module__}.{cls.__qualname__}"
            self.identity.proc_mesh = proc_mesh
            self.instance = cls(*args, **kwargs)
        except BaseException as exc:
            if life.abandoned:
                return False  # stopped while __init__ ran: nobody waits for it any more
            life.fail(f"{type(exc).__name__} in __init__: {exc}")
            # `initialized` fails with the exception, and the owner hears of
            # it as of any failed actor (Monarch: a supervision event).
            self.invoker.error(item.port, self.point.rank, exc, "__init__")
            self.report_fault(exc, "__init__")
        else:
            if not life.init_returned():
                # stop() let the actor go while __init__ ran (see stop): it never runs
                return False
            self.runtime.reply(item.port, self.point.rank, Status.OK, None)
        finally:
            _context_var.reset(token)
        return True

    def _supervise(self, item: Supervise, pending: list[Any] | None) -> bool:
        """A mesh this actor owns failed: ``__supervise__`` decides (Monarch's contract)."""
        failure = item.failure
        hook = getattr(self.instance, "__supervise__", None)
        if hook is None or self.lifecycle.phase is not Phase.RUNNING:
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

    def _stop(self, item: Stop, pending: list[Any] | None) -> bool:
        self.lifecycle.stopping(item.reason)
        runner = self.runner
        if pending is not None and isinstance(runner, AsyncRunner) and runner.tasks:
            pending.append(self._cancel_then_stop(runner, item))
            return False
        return self._cleanup_then_stop(item, pending)

    async def _cancel_then_stop(self, aio: AsyncRunner, item: Stop) -> None:
        # Concurrent calls still running are cancelled before __cleanup__ (Monarch's order).
        await aio.cancel_tasks()
        pending: list[Any] = []
        self._cleanup_then_stop(item, pending)
        if pending:
            await pending[0]

    def _cleanup_then_stop(self, item: Stop, pending: list[Any] | None) -> bool:
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
                            self.report_fault(exc, "__cleanup__")
                        finally:
                            self._stopped(done)

                    pending.append(finish())
                    return False
            except Exception as exc:
                self.report_fault(exc, "__cleanup__")
            finally:
                _context_var.reset(token)
        self._stopped(done)
        return False

    def _stop_owned(self) -> None:
        # What this actor made stops first, bottom-up (Monarch), bounded: its node of the ownership tree.
        errors = self.host.close_owned(self, f"its owner {self.actor_id} stopped", settings.cleanup_timeout)
        for exc in errors:
            warn(f"actor {self.actor_id} stopping what it owns: {exc}")

    def _stopped(self, done: Callable[[], None] | None) -> None:
        self.lifecycle.stopped()
        # Let go of the user's object now (its __del__ runs, as when a
        # Monarch actor stops), not when the cycle through `identity` is collected.
        self.instance = None
        self.last_error = None
        self.invoker.unbind()
        for site in list(self.host.sites.values()):
            if site.key == self.key:
                site.fn = None  # the bound method holds the object
        reason = self.lifecycle.stop_reason or "stopped"
        self.host.forget(self.key, self.name, reason)
        if done is not None:
            done()
        self._refuse_mailbox(f"it is stopped ({reason})")

    # -- failures ----------------------------------------------------------

    def _unhandled(self, failure: MeshFailure, raised: BaseException | None) -> None:
        # Not handled: this actor fails too, and its own owner hears of both.
        extra = f"; __supervise__ raised {type(raised).__name__}: {raised}" if raised is not None else ""
        self.lifecycle.fail(f"unhandled failure of its mesh {failure.mesh_name!r}{extra}")
        report = f"actor {self.actor_id} on {self.runtime.host} did not handle a failure{extra}:\n  {failure.report()}"
        self.invoker.fail_awaiting(report)
        self._fault(report)

    def report_fault(self, exc: BaseException, where: str) -> None:
        """Tell the actor's spawner that ``exc``, raised in ``where``, failed it (with the traceback)."""
        import traceback

        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
        report = f"actor {self.actor_id} on {self.runtime.host}: {type(exc).__name__} in {where}: {exc}\n{text}"
        self._fault(report)

    def _fault(self, report: str) -> None:
        try:
            self.runtime.fault(self.key, self.point.rank, report, self.spawner)
        except Exception as exc:
            warn(f"actor failure not reported to its owner ({type(exc).__name__}: {exc}):\n{report}")
