"""The one Future type of mpimesh.

:class:`Future` is a :class:`concurrent.futures.Future`, so ``wait``,
``as_completed`` and ``result(timeout)`` work unchanged (mpi4py.futures makes
the same choice).  It adds Monarch's ``get(timeout)`` and ``await``.  A thread
blocked in ``get`` drives MPI itself, so the reply it waits for is received on
that very thread.
"""

from __future__ import annotations

import concurrent.futures
import math
import sys
import threading
import time
from collections.abc import Callable, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from .config import settings

if TYPE_CHECKING:
    import asyncio

__all__ = ["Future"]

R = TypeVar("R")

# States in which a future never changes again (concurrent.futures' names).
_SETTLED = frozenset(("FINISHED", "CANCELLED", "CANCELLED_AND_NOTIFIED"))
_FINISHED = "FINISHED"
_PENDING = "PENDING"

# The attributes concurrent.futures.Future.__init__ sets that are created on
# first use here (tests/test_future.py pins the list against the stdlib).
_LAZY = ("_condition", "_waiters", "_done_callbacks")
# Orders a lazy creation against a settle that finds none (see set_result).
_lazy_lock = threading.Lock()

#: How a wait drives the runtime's progress: ``wait(done, cond, timeout) -> bool``;
#: ``cond`` is called for the condition to sleep on, only if the wait sleeps.
Driver = Callable[[Callable[[], bool], Callable[[], threading.Condition], float | None], bool]

# Set by set_driver, when a runtime is installed; None: waits only sleep.
_driver: Driver | None = None
# The driver's spin for one future in C, ``spin(future) -> bool`` (``Progress.spin``, with
# the native wire), or None: a get() without a timeout tries it before the driver.
_spin: Callable[[Future[Any]], bool] | None = None


def set_driver(driver: Driver | None) -> None:
    """Make every wait on a future drive ``driver`` (``_core.current.install``, at boot)."""
    global _driver, _spin
    _driver = driver
    _spin = getattr(getattr(driver, "__self__", None), "spin", None)
    # Future.get in C where the spin is (native/getter.c): the same method without its Python frame,
    # which calls the one below for all it does not cover.
    front = getattr(getattr(_spin, "__self__", None), "getter", None)
    Future.get = front(_get, _FINISHED) if front is not None else _get  # type: ignore[method-assign]


class _Lazy:
    """One of ``_LAZY``: made, with the other two, the first time it is read.

    A descriptor rather than ``__getattr__``: a class with ``__getattr__``
    loses CPython's specialised attribute access on all its attributes
    (docs/design/runtime.md, "Future: figures").  Once made, the instance's
    own attribute hides the descriptor.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        with _lazy_lock:
            if not obj._made:
                # instance attributes: they hide the descriptors from now on
                obj._condition = threading.Condition()
                obj._waiters = []
                obj._done_callbacks = []
                obj._made = True
        return vars(obj)[self.name]


class Future(concurrent.futures.Future, Generic[R]):  # type: ignore[type-arg]
    """The result of a remote call, available later.

    Users do not create futures; endpoints, ports and meshes return them.
    ``get()`` and ``result()`` block the calling thread (driving MPI progress
    meanwhile); ``await fut`` suspends a coroutine instead.  A timeout does
    not consume the future: call ``get`` again to keep waiting.
    """

    # concurrent.futures.Future.__init__'s other attributes, until set
    _state = _PENDING
    _result = None
    _exception = None

    def __init__(self, what: str = "") -> None:
        # Not super().__init__(): its Condition (an RLock, a deque and seven
        # bound methods) is the largest cost of issuing a call, and most
        # futures are settled before anybody sleeps on them.  The condition,
        # the waiter list and the callbacks are made on first use; the state,
        # result and exception are the class's until set.
        self._what = what

    _condition = _Lazy()
    _waiters = _Lazy()
    _done_callbacks = _Lazy()
    # whether they have been made (an attribute: reading __dict__ would
    # materialise it, which slows every later access)
    _made = False

    def _cond(self) -> threading.Condition:
        cond: threading.Condition = self._condition
        return cond

    def _settle_unwatched(self, result: Any, exception: BaseException | None) -> bool:
        # Settle without a condition if none exists yet: nobody can be
        # sleeping on one, waiting in concurrent.futures.wait, or holding a
        # callback.  Under the lock that creation takes, so that a thread
        # creating the condition now sees the state already settled.
        if self._made:
            return False
        lock = _lazy_lock
        lock.acquire()  # not `with`: cheaper, and this runs on every reply
        try:
            if self._made:
                return False
            if self._state in _SETTLED:
                raise concurrent.futures.InvalidStateError(f"{self._state}: {self!r}")
            self._result = result
            self._exception = exception
            self._state = _FINISHED
        finally:
            lock.release()
        return True

    def set_result(self, result: Any) -> None:
        """Settle with a value (the runtime calls this, users do not)."""
        if not self._settle_unwatched(result, None):
            super().set_result(result)

    def set_exception(self, exception: BaseException | None) -> None:
        """Settle with an exception (the runtime calls this, users do not)."""
        if not self._settle_unwatched(None, exception):
            super().set_exception(exception)

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<mpimesh.Future {self._what or hex(id(self))} {state}>"

    def done(self) -> bool:
        """Whether the future has a value or an exception (never blocks)."""
        # Read without the condition's lock: the state is one attribute,
        # written once, and this is asked at every poll of a waiting thread.
        return self._state in _SETTLED

    def _wait(self, timeout: float | None) -> None:
        if self._state in _SETTLED:
            return
        driver = _driver
        if driver is None:
            ok = bool(concurrent.futures.wait([self], timeout).done)
        elif settings.show_waits > 0:
            ok = self._wait_showing(driver, timeout, settings.show_waits)
        else:
            ok = driver(self.done, self._cond, timeout)
        if not ok:
            raise TimeoutError(
                f"{self!r} not done after {timeout:g} s; call get() again to keep waiting, or raise the timeout"
            )

    def _wait_showing(self, driver: Callable[..., bool], timeout: float | None, every: float) -> bool:
        # MPIMESH_SHOW_WAITS: say on stderr what a long wait is waiting for.
        start = time.monotonic()
        end = math.inf if timeout is None else start + timeout  # as _core.progress.deadline
        while True:
            chunk = min(every, end - time.monotonic())
            if driver(self.done, self._cond, max(0.0, chunk)):
                return True
            now = time.monotonic()
            if now >= end:
                return False
            print(f"mpimesh: still waiting for {self._what or 'a future'} after {now - start:.0f} s",
                  file=sys.stderr, flush=True)

    def get(self, timeout: float | None = None) -> R:
        """Block until the value is ready and return it.

        Args:
            timeout: seconds to wait; ``None`` waits as long as it takes.

        Raises:
            TimeoutError: not ready within ``timeout`` (the future stays usable).
            ActorError: the remote endpoint raised.
            SupervisionError: the remote process or actor failed.
        """
        if self._state != _FINISHED:
            # The spin in C first (B1: no Python frame per poll); what it does not
            # cover, and every wait with a timeout, is _wait's.
            spin = _spin
            if timeout is not None or spin is None or not spin(self):
                self._wait(timeout)
        if self._state == _FINISHED and self._exception is None:
            # Without the stdlib's result(): it takes the condition, which
            # would make it for a future nobody ever slept on.
            return self._result  # type: ignore[return-value]
        return super().result(0)  # type: ignore[no-any-return]

    def result(self, timeout: float | None = None) -> R:
        """Same as :meth:`get` (``concurrent.futures`` name)."""
        return self.get(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """Block until done; return the exception raised, or ``None``.

        Raises:
            TimeoutError: not done within ``timeout``.
        """
        self._wait(timeout)
        if self._state == _FINISHED:
            return self._exception
        return super().exception(0)

    def __await__(self) -> Generator[Any, None, R]:
        import asyncio  # lazily: scripts that never await do not pay its import

        return asyncio.wrap_future(self).__await__()

    def as_asyncio(self) -> asyncio.Future[R]:
        """This future as an :class:`asyncio.Future` of the running loop (repeatable)."""
        import asyncio

        return asyncio.wrap_future(self)

    @classmethod
    def completed(cls, value: R, what: str = "") -> Future[R]:
        """A future that is already done with ``value``."""
        fut: Future[R] = cls(what)
        fut.set_result(value)
        return fut


#: Future.get as written above: set_driver puts its native front in its place, and back.
_get = Future.get
