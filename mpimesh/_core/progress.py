"""Who drives MPI, and how a waiting thread waits.

MPI makes progress only inside MPI calls, and a blocking ``MPI_Recv`` burns a
whole core on every stack measured here.  So nobody blocks in MPI: threads
that wait for something (a future, an actor's mailbox, the end of the job)
take turns polling.  Whoever holds the *progress token* polls and dispatches
what arrives; the others sleep on their own condition and are woken when their
event happens.  This is the leader/follower pattern: the thread that waits for
a reply receives it itself, so a round trip costs no thread hand-off (a hand-off
costs ~50 us here, against ~3 us for the MPI round trip).

Polling is tight for ``MPIMESH_SPIN_US`` after each message, then backs off
exponentially to ``MPIMESH_IDLE_SLEEP_US``.  After ``MPIMESH_LEADER_IDLE_MS``
without traffic, a thread waiting for its own event leaves polling to the
*background* waiter (the controller's progress thread, a worker's main loop),
which polls only while no other thread leads, and stays out while a thread has
sent or polled in the last ``_ACTIVE_WINDOW``: two threads spinning in one
process on a small node double the round trip (measured: 200 us against 55),
and two taking turns at MPI fight over the GIL.  The background waiter naps
up to ``MPIMESH_DEEP_SLEEP_US`` once the process has been quiet for half a
second, on this process's doorbell (``_bell``) when it has one, so that a
same-host sender wakes it at once.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from .._data import windows as _windows
from ..config import settings

if TYPE_CHECKING:
    from .._transport.bell import Bell

__all__ = ["Progress", "Waitable"]

#: What a waiter sleeps on: a condition, or a function that makes it on demand.
Waitable = threading.Condition | Callable[[], threading.Condition]

# A follower re-checks the token this often even if nobody wakes it, so that a
# leader that leaves is always replaced.  Its own event wakes it at once.
_FOLLOWER_WAIT = 0.05
# The background poller stays out while a foreground thread has polled or
# sent within this window: two threads of one process taking turns at MPI
# fight over the GIL at every MPI call (a pipelined caller issued its calls
# 2.5x slower while the background thread received the replies).
_ACTIVE_WINDOW = 0.002
# A spinning leader yields the CPU every this many empty polls.
_YIELD_EVERY = 4
# A spinning leader's poll may keep probing this long inside MPI (the native
# frame path, GIL released): a reply is seen as soon as MPI has it.  Events
# that do not come through MPI (a frame to this very process, another
# thread's wake-up) are seen at the end of the probe at the latest.
_SPIN_CHUNK = 50e-6
# After this long without any traffic the background poller sleeps up to
# MPIMESH_DEEP_SLEEP_US between polls.  Idle CPU is set by wake-ups: each
# costs 30-100 us of CPU on the VMs measured, so 1 ms naps cost ~5 % of a
# core and 8 ms naps ~1 %, for at most 8 ms more on a first call after idle.
_DEEP_AFTER = 0.5


def _exposed() -> bool:
    """Whether this process has memory in its island's MPI window (an RDMABuffer another host may read).

    Open MPI 5 serves one-sided reads across hosts (osc/rdma over the TCP
    BTL: gets emulated with active messages) only inside the owner's MPI
    calls, and the reads are not this runtime's traffic: in deep naps (8 ms)
    a 32 MiB read took 0.21-0.27x a Send's time, in 1 ms naps about twice
    as fast (issue #13).  Such an owner stays out of the deep naps.
    """
    win = _windows.window()
    return win is not None and bool(win.attached)


def _tighten_timer_slack() -> None:
    # Linux rounds short sleeps up by the thread's timer slack (50 us by
    # default), which would make the first back-off naps 3x longer than
    # asked.  Threads created later inherit the value.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(29, 5000)  # PR_SET_TIMERSLACK, ns
    except (OSError, AttributeError):  # pragma: no cover - not Linux
        pass


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
        #: this process's doorbell (``_bell``): the background waiter sleeps on it
        self.bell: Bell | None = None
        self._token = threading.Lock()
        self._spin = settings.spin_us * 1e-6
        self._max_sleep = settings.idle_sleep_us * 1e-6
        self._leader_idle = settings.leader_idle_ms * 1e-3
        # One entry per thread currently leading (waiting for its own event
        # and polling): list append and pop are atomic, a counter under a
        # lock cost two lock round trips per wait.
        self._leaders: list[None] = []
        # Threads in a background wait (0 or 1): followers rely on them.
        self._background = 0
        self._background_cond: threading.Condition | None = None
        self._last_traffic = time.monotonic()
        self._background_sleep = self._max_sleep
        #: statistics: polls made by the background waiter
        self.background_polls = 0
        self._deep_sleep = max(self._max_sleep, settings.deep_sleep_us * 1e-6)
        self._count_lock = threading.Lock()

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
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        last_traffic = now
        sleep = 0.0
        spins = 0
        # A leader's first polls spin in MPI (see _SPIN_CHUNK).
        chunk = _SPIN_CHUNK if self._spin > 0 else 0.0
        token = self._token
        poll = self._poll
        leaders = self._leaders
        leaders.append(None)
        leading = True
        try:
            while True:
                if done():
                    return True
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    return False
                idle = now - last_traffic
                if leading and idle >= self._leader_idle and self._background:
                    # Quiet for a while: leave polling to the background waiter.
                    leading = False
                    leaders.pop()
                    # A reply is still expected: the background waiter must
                    # not be in its deep back-off (it added up to 2 deep naps,
                    # ~16 ms, to a first call after an idle second).
                    self._background_sleep = 2e-5
                    self._last_traffic = now
                    self._wake_background()
                elif not leading and not self._background:
                    # Nobody polls in the background (a worker still booting,
                    # a controller shutting down): lead again.
                    leading = True
                    last_traffic = now
                    leaders.append(None)
                if leading and token.acquire(blocking=False):
                    try:
                        handled = poll(chunk)
                    finally:
                        token.release()
                    self._polled_at = now
                    if handled:
                        if done():
                            return True  # most often: the reply this thread waited for
                        last_traffic = time.monotonic()
                        sleep = 0.0
                        continue
                    if idle < self._spin:
                        # Spin, but let the other processes of an
                        # oversubscribed node (and our other threads) run.
                        chunk = min(_SPIN_CHUNK, self._spin - idle)
                        spins += 1
                        if spins % _YIELD_EVERY == 0:
                            os.sched_yield()
                        continue
                    chunk = 0.0
                    sleep = min(self._max_sleep, max(2e-5, sleep * 2))
                    pause = sleep
                else:
                    pause = self._max_sleep if leading else _FOLLOWER_WAIT
                if deadline is not None:
                    pause = min(pause, max(0.0, deadline - now))
                sleeper = cond if isinstance(cond, threading.Condition) else cond()
                with sleeper:
                    if not done():
                        sleeper.wait(pause)
        finally:
            if leading:
                leaders.pop()

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
        # showed as 1-2.5 ms tails on round trips of 50 us.
        now = time.monotonic()
        deadline = None if timeout is None else now + timeout
        # The back-off survives between calls: the serve loop returns every
        # few hundred ms to check on its controller.
        while True:
            sleep = self._background_sleep
            if done():
                return True
            now = time.monotonic()
            if deadline is not None and now >= deadline:
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
                try:
                    handled = self._poll(0.0)
                finally:
                    self._token.release()
                self.background_polls += 1
                if handled:
                    self._last_traffic = time.monotonic()
                    self._background_sleep = 2e-5
                    continue
                quiet = now - self._last_traffic
                ceiling = self._deep_sleep if quiet > _DEEP_AFTER and not _exposed() else self._max_sleep
                pause = self._background_sleep = min(ceiling, max(2e-5, sleep * 2))
            else:
                pause = self._max_sleep
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - now))
            bell = self.bell
            if bell is not None:
                # Rung by a peer that sends after a pause, or by a thread here.
                if not done() and bell.sleep(pause):
                    # A message is on its way, but Open MPI may show it only
                    # after a few polls: back off from the start again.
                    self._background_sleep = 2e-5
                    self._last_traffic = time.monotonic()
                continue
            with cond:
                if not done():
                    cond.wait(pause)
