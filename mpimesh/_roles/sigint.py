"""The SIGINT that ends a job after an unhandled failure, sent again while it is lost.

An unhandled failure ends the job with a KeyboardInterrupt in the script's
main thread (``EndOfJob._after_unhandled``): one ``pthread_kill(SIGINT)``.
One signal can be lost: the main thread in ``threading.Event().wait()``
drops the GIL before it blocks in ``sem_clockwait``; a SIGINT that lands in
that gap runs the C handler (the flag is set) but interrupts no system
call, so the wait sleeps on, the Python handler does not run, and the job
ended only at ``MPIMESH_SHUTDOWN_TIMEOUT``, without the script's ``finally``
(CI: ``test_default_hook_ends_the_job[spawned]``, status 1 after 2.6 s).

No SIGINT handler of ours tells whether the signal arrived: one installed at
boot would change ``asyncio.run`` in the script (it installs its own, the
one that cancels the main task, only over ``signal.default_int_handler``),
and a Monarch program must run unchanged.  So :class:`Interruption` tells a
lost SIGINT from where the main thread is.  At the first SIGINT it records
the main thread's top Python frame (the object, so that a new frame cannot
pass for it) and that frame's ``f_lasti``.  Every :data:`RESEND_EVERY`
seconds, while the script has not begun to leave and its main thread
lives, it sends SIGINT again if that frame is still on top at the same
instruction: no KeyboardInterrupt was raised there.  The first time the
position differs it stops for good: the interrupt was taken, and another
would break into the script's ``finally``.  (The position is sampled: a
script that catches the KeyboardInterrupt and is back in the same frame at
the same instruction by the next sample, e.g. a module-level loop around a
wait, gets SIGINT again, as it would from a second Ctrl-C.)  A handler of the script's own
that returns (it swallows SIGINT) leaves the wait where it was, so it gets
SIGINT again; the end stays bounded: ``EndOfJob`` ends the job itself if
the script has not begun to leave ``MPIMESH_SHUTDOWN_TIMEOUT`` after the
first SIGINT.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType

__all__ = ["RESEND_EVERY", "Interruption", "position"]

#: Seconds between two SIGINTs of one :class:`Interruption`, while the first seems lost.
RESEND_EVERY = 0.05


def position(thread: threading.Thread) -> tuple[FrameType, int] | None:
    """The top Python frame of ``thread`` and its ``f_lasti``; None if it has none (ended, not started)."""
    if thread.ident is None:
        return None
    frame = sys._current_frames().get(thread.ident)
    return None if frame is None else (frame, frame.f_lasti)


def _pthread_sigint(thread: threading.Thread) -> None:
    if thread.ident is not None:
        signal.pthread_kill(thread.ident, signal.SIGINT)


class Interruption:
    """One interrupt of the main thread: a SIGINT now, sent again while it is lost.

    The first SIGINT is sent by the constructor, which records where the
    main thread was (:func:`position`); it is sent again only while the
    main thread has not moved from there (see :meth:`lost`).

    Args:
        main: the thread to interrupt (the script's main thread).
        leaving: set once the script has begun to leave; no SIGINT after it.
        send: sends SIGINT to a thread (``pthread_kill``; tests pass a fake).
    """

    def __init__(self, main: threading.Thread, leaving: threading.Event, *,
                 send: Callable[[threading.Thread], None] = _pthread_sigint) -> None:
        self.main = main
        self.leaving = leaving
        self._send = send
        # The main thread's top frame and instruction at the first SIGINT;
        # None once it has moved (or had no frame): nothing is sent again.
        self._at: tuple[FrameType, int] | None = position(main)
        #: SIGINTs sent so far
        self.sent = 1
        #: time.monotonic() of the first SIGINT
        self.started = time.monotonic()
        send(main)

    def lost(self) -> bool:
        """Whether every SIGINT sent so far may be lost, and one more is safe to send.

        True while the script has not begun to leave, the main thread is
        alive, and its top frame is the one of the first SIGINT, at the same
        instruction.  The first time it is not, it never is again (and the
        frame is let go): the interrupt was taken, and another SIGINT would
        break into the script's ``finally``.
        """
        at = self._at
        if at is None:
            return False
        now = position(self.main) if self.main.is_alive() and not self.leaving.is_set() else None
        if now is None or now[0] is not at[0] or now[1] != at[1]:
            self._at = None
            return False
        return True

    def wait_left(self, timeout: float, *, every: float = RESEND_EVERY) -> bool:
        """Wait for the script to begin leaving, sending SIGINT again every ``every`` s while :meth:`lost`.

        Blocks at most ``timeout`` seconds from the first SIGINT.

        Returns:
            Whether ``leaving`` was set within ``timeout``.
        """
        deadline = self.started + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                if self.leaving.wait(max(0.0, min(every, left))):
                    return True
                if left <= every:
                    return False
                if self.lost():
                    self.sent += 1
                    self._send(self.main)
        finally:
            self._at = None  # no frame of the script kept alive by us

    def __repr__(self) -> str:
        return f"Interruption(sent={self.sent}, lost={self._at is not None})"
