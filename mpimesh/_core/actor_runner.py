"""An actor's thread: what runs its mailbox, one class for sync actors and one for async actors.

A sync actor's thread, while its mailbox is empty, takes part in MPI
progress (see ``progress``): under traffic it receives its own messages, so a
call costs no thread hand-off.  An async actor's thread runs an asyncio loop;
its endpoints await futures that the polling thread completes.

Both take items in arrival order and hand each to the handler registered for
its type.  A handler takes the item and ``pending`` (None for a sync actor),
and returns False once the actor has stopped; an async actor's handler may
leave in ``pending`` the coroutine to await before the next item.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from .actor_lifecycle import Lifecycle
from .actor_mail import Item

if TYPE_CHECKING:
    import asyncio

__all__ = ["AsyncRunner", "Handlers", "Progress", "SyncRunner"]

#: item type -> its handler: ``handler(item, pending) -> bool`` (False: the actor has stopped)
Handlers = dict[type, Callable[[Any, list[Any] | None], bool]]
#: what a runner calls if its thread dies of an exception: ``crashed(exc, where)``
Crashed = Callable[[BaseException, str], None]


class Progress(Protocol):
    """The progress engine, which a sync actor's idle thread drives."""

    #: a sync actor's idle wait in C, serving its known call sites (``Progress.serve``), or None
    serve: Callable[[Any], bool] | None

    def wait(self, done: Callable[[], object], cond: threading.Condition, timeout: float | None = None) -> bool: ...


class SyncRunner:
    """A sync actor's thread: its mailbox in order; while the mailbox is empty, MPI progress.

    Args:
        name: the thread's name.
        progress: this process's progress engine.
        lifecycle: the actor's; STOPPED (unless FAILED) once the thread ends.
        crashed: told if the thread dies of an exception (a handler never lets one escape).
    """

    def __init__(self, name: str, progress: Progress, lifecycle: Lifecycle, crashed: Crashed) -> None:
        self.mailbox: deque[Item] = deque()
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        #: set once the thread has ended
        self.finished = threading.Event()
        self._progress = progress
        self._lifecycle = lifecycle
        self._crashed = crashed
        self._handlers: Handlers = {}
        # the thread's id: it may fill its own mailbox while it polls
        self._tid: int | None = None
        #: the actor as native call sites see it (a ``_native.Lane``, see
        #: ``ActorHost.on_site_call``), or None; armed while the thread waits idle
        self.lane: Any = None

    def put(self, item: Item) -> None:
        """Add ``item`` to the mailbox and wake the thread."""
        if threading.get_ident() == self._tid:
            # Put by the actor's own thread while it polls: nobody to wake.
            self.mailbox.append(item)
            return
        with self.cond:
            self.mailbox.append(item)
            self.cond.notify()

    @property
    def tid(self) -> int | None:
        """The thread's id (``threading.get_ident()``), once it has started."""
        return self._tid

    def start(self, handlers: Handlers) -> None:
        """Start the thread, which hands each item to ``handlers[type(item)]``."""
        self._handlers = handlers
        self.thread.start()

    def _main(self) -> None:
        try:
            self._tid = threading.get_ident()
            mailbox = self.mailbox
            wait = self._progress.wait
            serve = self._progress.serve
            has_mail = mailbox.__len__
            handlers = self._handlers
            while True:
                if not mailbox:
                    lane = self.lane
                    if lane is None:
                        wait(has_mail, self.cond)
                    elif serve is not None and serve(lane):
                        # Served in C: the calls the pump took ran there, one by
                        # one, until mail came (native/call.c, Spin.serve).
                        continue
                    else:
                        # Idle: the pump may take a call through a known
                        # site for this thread meanwhile (native/site.c).
                        lane.armed = True
                        try:
                            wait(lane.ready, self.cond)
                        finally:
                            lane.armed = False
                        if lane.run():  # the call taken, before any mail (it came first)
                            continue
                item = mailbox.popleft()
                if not handlers[type(item)](item, None):
                    break
                # Not held while waiting for the next: a call's received
                # buffers go back to the pool only once nothing refers to them.
                del item
        except BaseException as exc:  # last resort: never let the thread die silently
            self._crashed(exc, "actor thread")
        finally:
            self._lifecycle.stopped()
            self.finished.set()


class AsyncRunner:
    """An async actor's thread: an asyncio loop that awaits each item's coroutine before the next.

    Besides the mailbox it runs tasks of their own (``@concurrent_endpoint``
    calls, an awaitable ``__supervise__``), which stop cancels.

    Args:
        name: the thread's name.
        lifecycle: the actor's; STOPPED (unless FAILED) once the thread ends.
        crashed: told if the thread dies of an exception (a handler never lets one escape).
    """

    def __init__(self, name: str, lifecycle: Lifecycle, crashed: Crashed) -> None:
        import asyncio  # only async actors pay for it

        self.mailbox: deque[Item] = deque()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._main, name=name, daemon=True)
        #: set once the thread has ended
        self.finished = threading.Event()
        #: the tasks outside the mailbox, kept referenced until done
        self.tasks: set[asyncio.Task[None]] = set()
        self._lifecycle = lifecycle
        self._crashed = crashed
        self._handlers: Handlers = {}
        self._wake: asyncio.Event | None = None
        self._main_task: asyncio.Task[None] | None = None
        # set by abandon_current: the awaited coroutine was cancelled on purpose, go on
        self._abandon = False

    def put(self, item: Item) -> None:
        """Add ``item`` to the mailbox and wake the loop."""
        self.mailbox.append(item)
        try:
            self.loop.call_soon_threadsafe(self._notify)
        except RuntimeError:
            pass  # loop closed: the actor has stopped

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def call_soon(self, fn: Callable[..., object], *args: Any) -> bool:
        """Run ``fn(*args)`` on the loop, from any thread; False if the loop has closed (the actor has stopped)."""
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            return False
        return True

    def start_task(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as a task of its own (on the loop's thread)."""
        import asyncio

        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def cancel_tasks(self) -> None:
        """Cancel the tasks outside the mailbox and wait until they have ended."""
        import asyncio

        tasks = list(self.tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def abandon_current(self) -> None:
        """Cancel the coroutine the mailbox awaits (on the loop's thread): the next item is taken at once."""
        if self._main_task is not None:
            self._abandon = True
            self._main_task.cancel()

    def start(self, handlers: Handlers) -> None:
        """Start the thread, which hands each item to ``handlers[type(item)]``."""
        self._handlers = handlers
        self.thread.start()

    def _main(self) -> None:
        try:
            import asyncio

            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self._run())
        except BaseException as exc:  # last resort: never let the thread die silently
            self._crashed(exc, "actor thread")
        finally:
            self._lifecycle.stopped()
            self.finished.set()
            self.loop.close()

    async def _run(self) -> None:
        import asyncio

        self._wake = asyncio.Event()
        self._main_task = task = asyncio.current_task()
        mailbox = self.mailbox
        handlers = self._handlers
        while True:
            while not mailbox:
                self._wake.clear()
                if mailbox:
                    break
                await self._wake.wait()
            item = mailbox.popleft()
            pending: list[Any] = []
            keep = handlers[type(item)](item, pending)
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
            del item, pending  # (as in SyncRunner._main)
