"""Who drives MPI, and how a waiting thread waits.

MPI makes progress only inside MPI calls, and a blocking ``MPI_Recv`` burns a
whole core.  So nobody blocks in MPI: threads that wait for something (a
future, an actor's mailbox, the end of the job) take turns polling.  Whoever
holds the *progress token* polls and dispatches what arrives; the others sleep
on their own condition and are woken when their event happens.  This is the
leader/follower pattern: the thread that waits for a reply receives it itself,
so a round trip costs no thread hand-off, which costs far more than the MPI
round trip it would wrap (docs/design/runtime.md, "Progress: figures").

Polling is tight for ``MPIMESH_SPIN_US`` after each message, then backs off
exponentially (:class:`Backoff`) to ``MPIMESH_IDLE_SLEEP_US``.  After
``MPIMESH_LEADER_IDLE_MS`` without traffic, a thread waiting for its own event
leaves polling to the *background* waiter (the controller's progress thread, a
worker's main loop), which polls only while no other thread leads, and stays
out while a thread has sent or polled in the last ``_ACTIVE_WINDOW``: two
threads spinning in one process on a small node double the round trip, and two
taking turns at MPI fight over the GIL.  The background waiter naps up to
``MPIMESH_DEEP_SLEEP_US`` once the process has been quiet for half a second,
on this process's doorbell (``_transport.bell``) when it has one, so that a
same-host sender wakes it at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .._data.registry import registry as _registry
from ..config import settings

if TYPE_CHECKING:
    from .._transport.bell import Bell

__all__ = ["Backoff", "Progress", "Waitable", "deadline"]

#: What a waiter sleeps on: a condition, or a function that makes it on demand.
Waitable = threading.Condition | Callable[[], threading.Condition]

# A follower re-checks the token this often even if nobody wakes it, so that a
# leader that leaves is always replaced.  Its own event wakes it at once.
_FOLLOWER_WAIT = 0.05
# The background poller stays out while a foreground thread has polled or
# sent within this window: two threads of one process taking turns at MPI
# fight over the GIL at every MPI call, which slows a pipelined caller down
# (docs/design/runtime.md, "Progress: figures").
_ACTIVE_WINDOW = 0.002
# A spinning leader yields the CPU every this many empty polls.
_YIELD_EVERY = 4
# A spinning leader's poll may keep probing this long inside MPI (the native
# frame path, GIL released): a reply is seen as soon as MPI has it.  Events
# that do not come through MPI (a frame to this very process, another
# thread's wake-up) are seen at the end of the probe at the latest.
_SPIN_CHUNK = 50e-6
# After this long without any traffic the background poller sleeps up to
# MPIMESH_DEEP_SLEEP_US between polls.  Idle CPU is set by the number of
# wake-ups, so longer naps cost less CPU and add at most one nap to a first
# call after idle (docs/design/runtime.md, "Progress: figures").
_DEEP_AFTER = 0.5
# The shortest back-off nap of a foreground waiter; the background waiter's
# start at twice this.
_NAP_MIN = 20e-6


def deadline(timeout: float | None, now: float) -> float:
    """When a wait of ``timeout`` seconds from ``now`` ends (``time.monotonic``).

    ``inf`` for no limit, so that ``now >= end`` and ``end - now`` need no
    ``None`` check in the loops.
    """
    return math.inf if timeout is None else now + timeout


class Backoff:
    """Exponential back-off between empty polls (mpi4py.futures' ``Backoff``).

    Each nap doubles, from ``floor`` up to the ceiling the caller passes (the
    background waiter raises its ceiling once the process is quiet).

    Args:
        floor: the first nap after :meth:`reset`, in seconds.
        start: the last nap taken before the first :meth:`nap`.
    """

    __slots__ = ("_floor", "_last")

    def __init__(self, floor: float = _NAP_MIN, start: float = 0.0) -> None:
        self._floor = floor
        self._last = start

    def reset(self) -> None:
        """Traffic: the next nap is the shortest again."""
        self._last = 0.0

    def nap(self, ceiling: float) -> float:
        """The next nap, in seconds: twice the last, between the floor and ``ceiling``."""
        self._last = nap = min(ceiling, max(self._floor, self._last * 2))
        return nap

    @property
    def last(self) -> float:
        """The last nap taken, in seconds (0 after :meth:`reset`); set it to go on from a nap saved before a reset."""
        return self._last

    @last.setter
    def last(self, nap: float) -> None:
        self._last = nap


def _tighten_timer_slack() -> None:
    # Linux rounds short sleeps up by the thread's timer slack (50 us by
    # default), which would make the first back-off naps several times
    # longer than asked.  Threads created later inherit the value.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 5000)  # PR_SET_TIMERSLACK, ns
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


def _sleep_on(cond: threading.Condition, done: Callable[[], object], pause: float) -> None:
    """``cond.wait(pause)`` unless ``done()``; an interrupt anywhere in it comes out as itself.

    CPython's ``Condition.wait`` releases the lock before entering the ``try``
    that takes it back: a KeyboardInterrupt landing in between (a notebook's
    interrupt of a cell in ``fut.get()``; seen in CI) leaves it released, and
    the ``with`` then raised "cannot release un-acquired lock" over the
    interrupt.  That interrupt is raised instead.  The lock is taken and
    released by a ``with`` on the lock itself, not on the condition: its
    ``__enter__`` and ``__exit__`` are Python functions, where an interrupt
    can land before the lock's own, and leave it held for good (every later
    settling of the future would hang on it).
    """
    lock: Any = cond._lock  # type: ignore[attr-defined]
    try:
        with lock:
            if not done():
                cond.wait(pause)
    except RuntimeError as error:
        interrupt = error.__context__
        if interrupt is None or cond._is_owned():  # type: ignore[attr-defined]
            raise
        raise interrupt from None


class Progress:
    """The progress token and the waiting discipline around it.

    Args:
        poll: ``poll(spin)`` receives and dispatches whatever has arrived,
            probing up to ``spin`` seconds for it; returns the number of
            frames handled.  Called only by the token holder.
        sent_at: when this process last sent something (``time.monotonic``).
    """

    def __init__(self, poll: Callable[[float], int], sent_at: Callable[[], float] = lambda: 0.0) -> None:
        _tighten_timer_slack()
        self._poll = poll
        self._sent_at = sent_at
        # when a foreground thread last polled
        self._polled_at = 0.0
        #: this process's doorbell (``_transport.bell``): the background waiter sleeps on it
        self.bell: Bell | None = None
        self._token = threading.Lock()
        self._spin = settings.spin_us * 1e-6
        self._max_sleep = settings.idle_sleep_us * 1e-6
        self._leader_idle = settings.leader_idle_ms * 1e-3
        # One entry per thread currently leading (waiting for its own event
        # and polling): list append and remove are atomic, where a counter
        # would need a lock, twice per wait.  Each wait's entry is its own,
        # so that its ``finally`` can remove it whatever line an interrupt
        # (KeyboardInterrupt, e.g. a notebook's) lands on.
        self._leaders: list[object] = []
        # Threads in a background wait (0 or 1): followers rely on them.
        self._background = 0
        self._background_cond: threading.Condition | None = None
        self._last_traffic = time.monotonic()
        # The background waiter's back-off survives between its waits: the
        # serve loop returns every few hundred ms to check on its controller.
        self._background_backoff = Backoff(2 * _NAP_MIN, start=self._max_sleep)
        #: statistics: polls made by the background waiter
        self.background_polls = 0
        self._deep_sleep = max(self._max_sleep, settings.deep_sleep_us * 1e-6)
        self._count_lock = threading.Lock()
        # frames of the background waiter's current poll that asked for no more traffic (see quiet)
        self._quiet = 0
        # the background waiter's last nap when the bell rang for frames not seen yet: taken
        # up again if they are only looks; None when a reply is expected
        self._rung: float | None = None
        #: Whether the main thread may poll (receive and dispatch) itself.  An
        #: interactive controller (a notebook) says no: an interrupt landing
        #: in the main thread between a receive and its dispatch lost that
        #: message (a reply never came; seen in CI), so there the main thread
        #: only waits and the background waiter receives.
        self.main_thread_polls = True
        #: Whether a spinning waiter yields the CPU every ``_YIELD_EVERY`` empty
        #: polls: set by ``_core.crowding`` (only where the job crowds its host).
        self.yields = True
        #: This wait's spinning phase in C, for a leader waiting on one future
        #: (the native wire's, native/site.c): ``spin(future) -> bool``, False
        #: where :meth:`wait` must go on (a follower, the naps, the step back).
        #: ``Future.get`` tries it first; None on the mpi4py wire.
        self.spin: Callable[[Any], bool] | None = None
        #: A sync actor's idle wait in C, ``serve(lane) -> bool`` (native/call.c): as the leader, it runs
        #: each call the pump takes for the actor's known sites (``_native.Lane``) as it comes, with no
        #: Python frame per call; True once the mailbox has mail, False where :meth:`wait` must go on.
        #: None on the mpi4py wire.
        self.serve: Callable[[Any], bool] | None = None
        spinner = getattr(getattr(poll, "__self__", None), "_spinner", None)
        if spinner is not None and self._spin > 0:
            # within the leader's idle time, as in wait(): it never steps back while spinning
            waiter = spinner(self, self._token, self._leaders, min(self._spin, self._leader_idle), _SPIN_CHUNK,
                             _YIELD_EVERY)
            if waiter is not None:
                self.spin = waiter.wait
                self.serve = getattr(waiter, "serve", None)

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """Hold the progress token (blocking): nothing is dispatched meanwhile."""
        with self._token:
            yield

    def poll_once(self) -> int:
        """Poll once if nobody else is polling; returns frames handled (0 if busy)."""
        if not self._token.acquire(blocking=False):
            return 0
        try:
            return self._poll(0.0)
        finally:
            self._token.release()

    def wait(
        self,
        done: Callable[[], object],
        cond: Waitable,
        timeout: float | None = None,
        *,
        background: bool = False,
    ) -> bool:
        """Wait until ``done()`` is true, driving MPI progress while waiting.

        Args:
            done: the condition waited for; must be cheap and thread-safe.
            cond: notified by whoever makes ``done()`` true, or a function
                returning it, called only if the wait has to sleep.
            timeout: seconds, or ``None`` for no limit.
            background: the thread that polls when nobody else does: it stays
                quiet while another thread leads, and never spins.

        Returns:
            ``done()`` at the end: ``False`` only on timeout.
        """
        if background:
            assert isinstance(cond, threading.Condition), "the background waiter sleeps on a real condition"
            return self._wait_background(done, cond, timeout)
        if done():
            return True
        now = last_traffic = time.monotonic()
        end = math.inf if timeout is None else now + timeout  # deadline(), inline: every round trip waits
        backoff: Backoff | None = None  # made at the first nap
        spins = 0
        chunk = _SPIN_CHUNK if self._spin > 0 else 0.0  # a leader's first polls spin in MPI
        token = self._token
        poll = self._poll
        mine = object()  # this wait's entry in _leaders
        leading = self.main_thread_polls or threading.current_thread() is not threading.main_thread()
        try:
            if leading:
                self._leaders.append(mine)
            else:  # a reply is awaited: the background waiter leaves its deep naps
                self._rung = None
                self._background_backoff.reset()
                self._wake_background()
            # done() and the clock are read at the end of each turn, not at
            # its start: the first turn uses the reads above (one of each
            # fewer per round trip, on both sides of B1).
            while True:
                if now >= end:
                    return False
                idle = now - last_traffic
                if leading and idle >= self._leader_idle and self._background:
                    leading = False  # quiet for a while: leave polling to the background waiter
                    self._step_back(now, mine)
                elif not leading and not self._background:
                    # Nobody polls in the background (a worker still booting,
                    # a controller shutting down): lead (again), interruptible or not.
                    leading = True
                    last_traffic = now
                    self._leaders.append(mine)
                if leading and token.acquire(blocking=False):
                    try:
                        handled = poll(chunk)
                    finally:
                        token.release()
                    self._polled_at = now
                    if handled:
                        if done():
                            return True  # most often: the reply this thread waited for
                        now = last_traffic = time.monotonic()
                        if backoff is not None:
                            backoff.reset()
                        continue
                    if idle < self._spin:
                        # Spin, but let the other processes of an
                        # oversubscribed node (and our other threads) run.
                        chunk = min(_SPIN_CHUNK, self._spin - idle)
                        spins += 1
                        if spins % _YIELD_EVERY == 0 and self.yields:
                            os.sched_yield()
                        if done():  # another thread's doing
                            return True
                        now = time.monotonic()
                        continue
                    chunk = 0.0
                    backoff = backoff or Backoff()
                    pause = backoff.nap(self._max_sleep)
                else:
                    pause = self._max_sleep if leading else _FOLLOWER_WAIT
                sleeper = cond if isinstance(cond, threading.Condition) else cond()
                _sleep_on(sleeper, done, min(pause, end - now))
                if done():
                    return True
                now = time.monotonic()
        finally:
            # Not `if leading`: an interrupt between setting it and the list's
            # change would leave a leader for good, and no background polling.
            if mine in self._leaders:
                self._leaders.remove(mine)

    def _step_back(self, now: float, mine: object) -> None:
        # A leader leaves polling to the background waiter.  A reply is still
        # expected, so the background waiter must not stay in its deep
        # back-off: its next naps are the shortest.
        self._leaders.remove(mine)
        self._rung = None
        self._background_backoff.reset()
        self._last_traffic = now
        self._wake_background()

    def quiet(self) -> None:
        """The frame being handled asks for no more traffic (a dashboard's look): it keeps this process in its naps.

        Called by its handler on the polling thread.  A poll of the
        background waiter that handled only such frames leaves its back-off
        as the bell that announced them found it, so a process looked at
        once a second stays in its deep naps (docs/design/dashboard.md, "Cost").
        """
        self._quiet += 1

    def kick(self) -> None:
        """Make sure somebody polls soon (frames wait in a batch): wake the background waiter if nobody leads."""
        if not self._leaders:
            self._wake_background()

    def wake(self) -> None:
        """Wake the background waiter (its ``done()`` may have become true)."""
        self._wake_background()

    def _wake_background(self) -> None:
        if self.bell is not None:
            self.bell.ring()
        bg = self._background_cond
        if bg is not None:
            with bg:
                bg.notify_all()

    def _wait_background(
        self, done: Callable[[], object], cond: threading.Condition, timeout: float | None
    ) -> bool:
        with self._count_lock:
            self._background += 1
            self._background_cond = cond
        try:
            return self._poll_background(done, cond, timeout)
        finally:
            with self._count_lock:
                self._background -= 1

    def _poll_background(
        self, done: Callable[[], object], cond: threading.Condition, timeout: float | None
    ) -> bool:
        # Never spins: a spinning background thread takes the GIL from the
        # thread that leads (or that an arriving message just woke), which
        # shows as long tails on round trips.
        end = deadline(timeout, time.monotonic())
        backoff = self._background_backoff
        while True:
            if done():
                return True
            now = time.monotonic()
            if now >= end:
                return False
            active = max(self._polled_at, self._sent_at())
            if self._leaders:
                # Another thread polls; a leader that steps back wakes us.
                pause = self._leader_idle
            elif now - active < _ACTIVE_WINDOW:
                # A foreground thread is busy with MPI (an actor between two
                # messages, a caller issuing calls): let it receive too.
                pause = _ACTIVE_WINDOW - (now - active)
            elif self._token.acquire(blocking=False):
                self._quiet = 0
                try:
                    handled = self._poll(0.0)
                finally:
                    self._token.release()
                self.background_polls += 1
                if handled:
                    rung, self._rung = self._rung, None
                    if handled > self._quiet:
                        self._last_traffic = time.monotonic()
                        backoff.reset()
                    elif rung is not None:  # only looks: back to the naps the bell broke
                        backoff.last = rung
                    continue
                quiet = now - self._last_traffic
                # An owner of window memory stays out of the deep naps: Open MPI
                # serves a one-sided get over TCP only inside the target's own
                # MPI calls (docs/design/hosts.md, 3.6), so its naps are the
                # reader's wait.
                deep = quiet > _DEEP_AFTER and not _registry.attached
                pause = backoff.nap(self._deep_sleep if deep else self._max_sleep)
            else:
                pause = self._max_sleep
            pause = min(pause, end - now)
            bell = self.bell
            if bell is not None:
                # Rung by a peer that sends after a pause, or by a thread here.
                if not done() and bell.sleep(pause):
                    # A message is on its way, but Open MPI may show it only
                    # after a few polls: back off from the start again.  Not
                    # traffic yet: a peer rings after its frame, which may
                    # have come in the last poll already.
                    if self._rung is None:
                        self._rung = backoff.last
                    backoff.reset()
                continue
            _sleep_on(cond, done, pause)
