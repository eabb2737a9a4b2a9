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
#: Seconds the thread leaves a new work to a caller who may wait for it at once (a synchronous
#: collective is then finished in the caller's thread, without two threads contending for it).
HANDOFF_S = 0.001
#: Seconds without work after which the thread waits to be woken rather than looking every HANDOFF_S.
IDLE_S = 0.2
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
        run: instead of requests, a blocking MPI call that the group's runner thread makes (in order).
    """

    def __init__(self, name: str, requests: list[Any], finish: Callable[[], Any], keep: Any,
                 deadline: float, statuses: list[Any] | None = None, run: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.name = name
        self.requests = requests
        self.finish = finish
        self.keep = keep
        self.deadline = deadline
        self.statuses = statuses
        self.run = run
        self.source = -1
        self.progress: Progress | None = None  # set when submitted
        self.submitted = time.monotonic()
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
        limit = max(limit, 0.0)
        done = self.progress.drive(self, limit) if self.progress is not None else self._done.wait(limit)
        if not done:
            raise dist.DistBackendError(f"mpimesh backend: {self.name} did not finish within {limit:.1f} s")
        if self._error is not None:
            raise self._error
        return True

    def wait_done(self, seconds: float) -> bool:
        """Block up to ``seconds`` for the work to finish or fail; whether it did."""
        return self._done.wait(seconds)

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
    """The progress of one process group: tests pending requests, finishes works.

    One round of it (:meth:`poll`) runs in the group's thread, or in a
    caller blocked in ``wait()``: while a caller drives it, the thread
    sleeps, so that one thread per process spins on MPI, not two (a
    synchronous collective then finishes in the caller's thread, without
    a hand-over).

    Args:
        describe: names the group in errors.
        dead: the dead processes among the group's, as ``{group rank: report}``.
    """

    def __init__(self, describe: str, dead: Callable[[], dict[int, str]]) -> None:
        self._describe = describe
        self._dead = dead
        self._cond = threading.Condition()
        # one poll at a time (MPI requests are not shared between threads); re-entered by a future's callback
        # that waits for another work of the group
        self._poll_lock = threading.RLock()
        self._pending: list[MPIWork] = []
        self._drivers = 0  # callers in drive()
        self._asleep = False  # the thread waits for a submit's notify (it was idle for IDLE_S)
        self._broken: BaseException | None = None
        self._closed = False
        # works failed with their requests still pending: their buffers stay alive, as MPI may write them
        self._abandoned: list[MPIWork] = []
        self._thread: threading.Thread | None = None
        self._next_look = 0.0
        self._runs: list[MPIWork] = []  # blocking calls not yet made, in order
        self._runner: threading.Thread | None = None

    def check(self) -> None:
        """Raise the error that broke the group, if one did (before a collective starts)."""
        if self._broken is not None:
            raise dist.DistBackendError(f"mpimesh backend: {self._describe} is broken: {self._broken}")

    def submit(self, work: MPIWork) -> MPIWork:
        """Have ``work`` finished when its requests complete; returns it."""
        work.progress = self
        with self._cond:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"mpimesh-pg {self._describe}", daemon=True)
                self._thread.start()
            self._pending.append(work)
            if work.run is not None:
                self._runs.append(work)
                if self._runner is None:
                    self._runner = threading.Thread(target=self._run_blocking, name=f"mpimesh-pg-run {self._describe}",
                                                    daemon=True)
                    self._runner.start()
                self._cond.notify_all()
            elif self._asleep:  # else it looks again within HANDOFF_S: a wake-up here would only take the GIL
                self._cond.notify()
        return work

    def close(self) -> None:
        """Stop the threads; pending works fail."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)

    def drive(self, work: MPIWork, limit: float) -> bool:
        """Poll in the calling thread until ``work`` is done or ``limit`` seconds passed; whether it is done."""
        end = time.monotonic() + limit
        with self._cond:
            self._drivers += 1
        try:
            while not work.is_completed():
                now = time.monotonic()
                if now > end:
                    return False
                if work.run is not None:  # the runner makes a blocking call: no spinning beside it
                    if not work.wait_done(min(LIVENESS_PERIOD, end - now)):
                        self.poll()  # the liveness look
                elif not self.poll():
                    time.sleep(0)  # yield the GIL to the threads that compute meanwhile
            return True
        finally:
            with self._cond:
                self._drivers -= 1
                self._cond.notify()

    def poll(self) -> bool:
        """One round: test every pending work, finish those done; look at the world's liveness when due.

        Returns whether a work finished.
        """
        if not self._poll_lock.acquire(blocking=False):
            return False
        try:
            with self._cond:
                pending = list(self._pending)
            done = self._test(pending) if pending else False
            now = time.monotonic()
            if pending and now >= self._next_look:
                self._next_look = now + LIVENESS_PERIOD
                self._look(pending, now)
            return done
        finally:
            self._poll_lock.release()

    def _run(self) -> None:
        idle_since = time.monotonic()
        while True:
            with self._cond:
                while not self._closed:
                    if not self._pending and time.monotonic() - idle_since > IDLE_S:
                        self._asleep = True
                        self._cond.wait()
                        self._asleep = False
                    elif not self._pending:
                        self._cond.wait(HANDOFF_S)
                        continue
                    elif self._drivers:
                        self._cond.wait(0.05)
                    elif all(w.run is not None for w in self._pending):
                        # only the runner's calls: nothing to test, only the liveness to look at
                        self._cond.wait(LIVENESS_PERIOD)
                        if self._pending and not self._drivers:
                            break
                    else:
                        # a work this young is likely waited for at once (async_op=False): leave it to its caller
                        age = time.monotonic() - min(w.submitted for w in self._pending)
                        if age >= HANDOFF_S:
                            break
                        self._cond.wait(HANDOFF_S - age)
                    idle_since = time.monotonic()
                if self._closed:
                    pending, self._pending = self._pending, []
                    for work in pending:
                        work.fail(dist.DistBackendError(f"mpimesh backend: {self._describe} was shut down"))
                    return
            done = self.poll()
            now = time.monotonic()
            if done:
                idle_since = now
            else:
                # yield the GIL (and the core) between tests; sleep once nothing has moved for a while
                time.sleep(0 if now - idle_since < SPIN_S else min(MAX_SLEEP_S, (now - idle_since) / 100))

    def _run_blocking(self) -> None:
        # Large all-reduces: MPI's blocking algorithms move them about twice as fast as its
        # nonblocking ones (Open MPI's tuned against libnbc, docs/design/spmd-mpi.md); made
        # here, in order, on a communicator of their own, while waiters watch the deadline
        # and the peers' liveness.
        while True:
            with self._cond:
                while not self._runs and not self._closed:
                    self._cond.wait()
                if self._closed and not self._runs:
                    return
                work = self._runs.pop(0)
            if work.is_completed() or self._broken is not None:
                work.fail(dist.DistBackendError(f"mpimesh backend: {self._describe} is broken: {self._broken}"))
                continue
            try:
                work.run()  # type: ignore[misc]
                value = work.finish()
            except Exception as exc:
                dead = self._dead()
                why = f"rank {min(dead)} of the group died ({dead[min(dead)]})" if dead else str(exc)
                self._break(f"{work.name} failed: {why}")
                work.fail(dist.DistBackendError(f"mpimesh backend: {work.name} on {self._describe} failed: {why}"))
            else:
                if not work.is_completed():
                    work.complete(value)
            with self._cond:
                self._cond.notify_all()

    def _test(self, pending: list[MPIWork]) -> bool:
        finished = []
        for work in pending:
            if work.is_completed():  # finished by a poll that this one's callbacks re-entered, or the runner
                finished.append(work)
                continue
            if work.run is not None:  # the runner makes its call
                continue
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
                self._pending = [w for w in self._pending if not w.is_completed()]
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
