"""What a poll does besides receiving from MPI, the same on both wires.

* frames this process sent itself, delivered at its next poll with private
  copies of their raw buffers, as they would come from another process;
* the data plane's pending one-sided operations, tested under the wire's
  lock on every poll until they complete (:meth:`Chores.watch`);
* the threads waiting for the lock for an MPI call other than a send
  (:meth:`Chores.exclusive`), ahead of the pollers;
* the report of a handler that raised, which must not kill the polling
  thread (and with it the process).
"""

from __future__ import annotations

import contextlib
import pickle
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from .buffers import copy_buffer
from .frames import Addr, Frame
from .links import FRAMES_PER_POLL, Tick

__all__ = ["Chores"]


class Chores:
    """Frames to this very process, pending one-sided operations, the lock's waiters, handler reports.

    Args:
        addr: this process's address (the source of the frames it sends itself).
        lock: the wire's lock (receiving and every MPI call other than a send).
        broken: called with a traceback's text when a handler raised.
        names: frame kind -> its name, for those reports (else the number).
    """

    __slots__ = ("addr", "lock", "local", "ticks", "wanted", "broken", "_names")

    def __init__(self, addr: Addr, lock: threading.Lock, broken: Callable[[str], None] | None,
                 names: Mapping[int, str] | None) -> None:
        self.addr = addr
        self.lock = lock
        #: frames this process sent itself: (source, pickled frame, buffers)
        self.local: deque[tuple[Addr, bytes, list[Any]]] = deque()
        #: pending one-sided operations of the data plane (see watch())
        self.ticks: list[Tick] = []
        #: one entry per thread waiting in exclusive()
        self.wanted: list[None] = []
        #: called with a traceback's text when a handler or a poll raised
        self.broken = broken
        self._names: Mapping[int, str] = names if names is not None else {}

    def loop_back(self, data: bytes, buffers: Sequence[Any]) -> None:
        """Deliver a pickled frame this process sent itself at the next poll; the receiver gets its own copy."""
        self.local.append((self.addr, data, [copy_buffer(b) for b in buffers]))

    def take_local(self, got: list[tuple[Addr, Frame, list[Any]]]) -> None:
        """Move frames this process sent itself into ``got``, up to a poll's share."""
        local = self.local
        while local and len(got) < FRAMES_PER_POLL:
            here, payload, carried = local.popleft()
            got.append((here, pickle.loads(payload), carried))

    def watch(self, tick: Tick) -> None:
        """Call ``tick()`` under the lock on every poll until it returns a function.

        The data plane's non-blocking window operations test their requests
        this way; the returned function (which settles a future) runs after
        the lock is released (see :meth:`tick`).
        """
        with self.lock:
            self.ticks.append(tick)

    def tick(self) -> list[Callable[[], None]]:
        """Test every pending one-sided operation (lock held); the functions that settle the completed ones."""
        keep, settle = [], []
        for tick in self.ticks:
            done = tick()
            if done is None:
                keep.append(tick)
            else:
                settle.append(done)
        self.ticks = keep
        return settle

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the lock for an MPI call other than a send (a window, a spawn).

        A poller that spins in MPI (the native wire's) holds the lock for
        its whole spin and takes it again at once: while somebody waits
        here, it stops polling.
        """
        self.wanted.append(None)
        try:
            with self.lock:
                yield
        finally:
            self.wanted.pop()

    def handler_failed(self, kind: int, source: Addr, text: str) -> None:
        """Report a handler's exception (the traceback's ``text``) through ``broken``, named by kind and source."""
        assert self.broken is not None
        self.broken(f"error handling {self._names.get(kind, kind)} from {source}:\n{text}")

    def report(self) -> None:
        """Report the exception being handled (a poll raised) through ``broken``; re-raise it without one."""
        if self.broken is None:
            raise
        self.broken(traceback.format_exc())
