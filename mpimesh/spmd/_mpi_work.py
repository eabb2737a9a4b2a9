"""Asynchronous work of the ``"mpimesh"`` backend: nonblocking MPI requests, finished by a progress thread.

A collective starts its MPI requests at once, in the caller's thread (so
every rank starts its collectives in program order, as MPI requires), and
returns a :class:`MPIWork`.  One progress thread per process group tests the
pending requests, finishes each work whose requests completed (copies into
the caller's tensors, the division of an average) and completes its future:
DDP's gradient hooks chain on those futures while the backward pass goes on.
``wait()`` blocks on the work's completion, never longer than the group's
timeout; while requests are pending the thread also watches the world's
processes, so a dead peer fails every pending collective of the group at
once (a collective cannot be cancelled in MPI: the group is then broken,
and later collectives on it raise at once).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .._transport.mpi import MPI

__all__ = ["MPIWork", "Progress"]

#: Seconds between two looks at the world's liveness while requests are pending.
LIVENESS_PERIOD = 0.02
#: Seconds of testing without any completion before the thread starts to sleep between tests;
#: MPI moves a large message only while it is tested (no progress thread of its own), so
#: the thread keeps testing a running collective.
SPIN_S = 0.2
#: Longest sleep between tests once the spin has run out.
MAX_SLEEP_S = 0.001


class MPIWork(dist.Work):
    """One collective (or send/recv) of the backend: its requests, its finish, its future.

    Args:
        name: the collective's name, for errors.
        requests: the MPI requests it waits for.
        finish: run once they all completed, in the progress thread; returns the future's value.
        keep: what must stay alive until then (buffers MPI reads or writes).
        deadline: ``time.monotonic()`` after which it fails as timed out.
        statuses: filled with the requests' statuses when they complete (a receive's source), or None.
    """

    def __init__(self, name: str, requests: list[Any], finish: Callable[[], Any], keep: Any,
                 deadline: float, statuses: list[Any] | None = None) -> None:
        super().__init__()
        self.name = name
        self.requests = requests
        self.finish = finish
        self.keep = keep
        self.deadline = deadline
        self.statuses = statuses
        self.source = -1
        self._future: torch.futures.Future[Any] = torch.futures.Future()
        self._done = threading.Event()
        self._error: BaseException | None = None

    # --- completion, from the progress thread

    def complete(self, value: Any = None) -> None:
        """The collective finished: its future gets ``value``, its waiters go on."""
        self.keep = None
        self._future.set_result(value)
        self._done.set()

    def fail(self, error: BaseException) -> None:
        """The collective failed (or can never finish): its future and waiters raise ``error``."""
        if self._done.is_set():
            return
        self._error = error  # keep stays: MPI may still write into a request it never finished
        self._future.set_exception(error)
        self._done.set()

    # --- the Work API

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until the collective finished; returns True.

        Raises:
            DistBackendError: it failed (a peer died, MPI reported an error),
                or did not finish within ``timeout`` (or the group's timeout).
        """
        limit = self.deadline - time.monotonic()
        if timeout is not None and timeout.total_seconds() > 0:
            limit = min(limit, timeout.total_seconds())
        if not self._done.wait(max(limit, 0.0)):
            raise dist.DistBackendError(f"mpimesh backend: {self.name} did not finish within {max(limit, 0.0):.1f} s")
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        """Whether the collective finished (or failed); does not block."""
        return self._done.is_set()

    def is_success(self) -> bool:
        """Whether the collective finished without error; does not block."""
        return self._done.is_set() and self._error is None

    def exception(self) -> BaseException | None:
        """The error the collective failed with, if any."""
        return self._error

    def get_future(self) -> torch.futures.Future[Any]:
        """A future done with the collective's output tensors (what DDP's comm hooks chain on)."""
        return self._future

    def _source_rank(self) -> int:
        return self.source

    def source_rank(self) -> int:
        """The rank a ``recv`` from any source received from."""
        return self.source


class Progress:
    """The progress thread of one process group: tests pending requests, finishes works.

    Args:
        describe: names the group in errors.
        dead: the dead processes among the group's, as ``{group rank: report}``.
    """

    def __init__(self, describe: str, dead: Callable[[], dict[int, str]]) -> None:
        self._describe = describe
        self._dead = dead
        self._cond = threading.Condition()
        self._pending: list[MPIWork] = []
        self._broken: BaseException | None = None
        self._closed = False
        # works failed with their requests still pending: their buffers stay alive, as MPI may write them
        self._abandoned: list[MPIWork] = []
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        """Raise the error that broke the group, if one did (before a collective starts)."""
        if self._broken is not None:
            raise dist.DistBackendError(f"mpimesh backend: {self._describe} is broken: {self._broken}")

    def submit(self, work: MPIWork) -> MPIWork:
        """Have ``work`` finished when its requests complete; returns it."""
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"mpimesh-pg {self._describe}", daemon=True)
                self._thread.start()
            self._pending.append(work)
            self._cond.notify()
        return work

    def close(self) -> None:
        """Stop the thread; pending works fail."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def _run(self) -> None:
        idle_since = time.monotonic()
        next_look = idle_since + LIVENESS_PERIOD
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                    idle_since = time.monotonic()
                if self._closed:
                    pending, self._pending = self._pending, []
                    for work in pending:
                        work.fail(dist.DistBackendError(f"mpimesh backend: {self._describe} was shut down"))
                    return
                pending = list(self._pending)
            done = self._test(pending)
            now = time.monotonic()
            if done:
                idle_since = now
            if now >= next_look:
                next_look = now + LIVENESS_PERIOD
                self._look(pending, now)
            if not done:
                # yield the GIL (and the core) between tests; sleep once nothing has moved for a while
                time.sleep(0 if now - idle_since < SPIN_S else min(MAX_SLEEP_S, (now - idle_since) / 100))

    def _test(self, pending: list[MPIWork]) -> bool:
        finished = []
        for work in pending:
            try:
                if not MPI.Request.Testall(work.requests, work.statuses):
                    continue
                value = work.finish()
            except Exception as exc:  # an MPI error (a failed peer under ULFM), or the finish's own
                dead = self._dead()
                why = f"rank {min(dead)} of the group died ({dead[min(dead)]})" if dead else str(exc)
                self._break(f"{work.name} failed: {why}")
                work.fail(dist.DistBackendError(f"mpimesh backend: {work.name} on {self._describe} failed: {why}"))
                finished.append(work)
                continue
            work.complete(value)
            finished.append(work)
        if finished:
            with self._cond:
                self._pending = [w for w in self._pending if w not in finished]
        return bool(finished)

    def _look(self, pending: list[MPIWork], now: float) -> None:
        dead = self._dead()
        if dead:
            rank = min(dead)
            self._break(f"rank {rank} died: {dead[rank]}")
            self._abandoned.extend(pending)
            for work in pending:
                work.fail(dist.DistBackendError(
                    f"mpimesh backend: {work.name} on {self._describe} cannot finish: rank {rank} of the group "
                    f"died ({dead[rank]})"))
        for work in pending:
            if now > work.deadline and not work.is_completed():
                self._abandoned.append(work)
                self._break(f"{work.name} timed out")
                work.fail(dist.DistBackendError(
                    f"mpimesh backend: {work.name} on {self._describe} did not finish within the group's timeout"))
        with self._cond:
            self._pending = [w for w in self._pending if not w.is_completed()]

    def _break(self, why: str) -> None:
        if self._broken is None:
            self._broken = RuntimeError(why)
