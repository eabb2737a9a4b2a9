"""Waiting for several things at once: a countdown, a future of many, one deadline for many waits.

Stopping N actors, N meshes or N transfers ends the same way: do something
once the last of them is done, whichever thread sees it done.  That count is
:class:`Countdown`; :func:`when_all` is the countdown over futures.  A
bounded teardown waits for each of a list in turn under one bound for the
whole list, not one per item: :class:`Deadline`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future as _StdFuture
from typing import Any

from .future import Future

__all__ = ["Countdown", "Deadline", "when_all"]


class Countdown:
    """Runs ``done()`` once ``n`` events have been counted, whatever threads count them.

    ``done()`` runs exactly once, on the thread that counts the last event
    (at once, in the constructor, when ``n`` is 0), outside the lock.

    Args:
        n: how many events to wait for.
        done: what to run after the last.
    """

    __slots__ = ("_left", "_lock", "_done")

    def __init__(self, n: int, done: Callable[[], object]) -> None:
        self._left = n
        self._lock = threading.Lock()
        self._done = done
        if n == 0:
            done()

    def count(self, *_: object) -> None:
        """Count one event (any arguments are ignored: it serves as a done callback)."""
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._done()


def when_all(futures: Sequence[_StdFuture[Any]], what: str) -> Future[None]:
    """A future done once every one of ``futures`` is.

    It raises the exception of the first of ``futures``, in their order, that
    failed; it is done at once when there are none.

    Args:
        futures: the futures to wait for.
        what: the new future's name, for its repr and timeout messages.
    """
    out: Future[None] = Future(what)

    def settle() -> None:
        first = next((e for e in (f.exception(0) for f in futures) if e is not None), None)
        if first is None:
            out.set_result(None)
        else:
            out.set_exception(first)

    countdown = Countdown(len(futures), settle)
    for fut in futures:
        fut.add_done_callback(countdown.count)
    return out


class Deadline:
    """One bound for a sequence of waits: each gets what the earlier ones left.

    Args:
        timeout: seconds, from now, for all of them together.
    """

    __slots__ = ("end",)

    def __init__(self, timeout: float) -> None:
        self.end = time.monotonic() + timeout

    def left(self) -> float:
        """Seconds left until the deadline, never negative."""
        return max(0.0, self.end - time.monotonic())
