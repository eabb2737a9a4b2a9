"""The SIGINT that ends a job after an unhandled failure, sent again while it is lost.

An unhandled failure ends the job with a KeyboardInterrupt in the script's
main thread (``EndOfJob._after_unhandled``): one ``pthread_kill(SIGINT)``.
One signal can be lost: the main thread in ``threading.Event().wait()``
drops the GIL before it blocks in ``sem_clockwait``; a SIGINT that lands in
that gap runs the C handler (the flag is set) but interrupts no system
call, so the wait sleeps on, the Python handler does not run, and the job
ended only at ``MPIMESH_SHUTDOWN_TIMEOUT``, without the script's ``finally``
(CI: ``test_default_hook_ends_the_job[spawned]``, status 1 after 2.6 s).

So the controller's main thread gets, at boot, a SIGINT handler of its own,
:class:`SigintHandler`: Python's (a KeyboardInterrupt), plus a count of its
runs.  :class:`Interruption` sends the first SIGINT, and sends it again
every :data:`RESEND_EVERY` seconds until that handler has run; never after:
a second KeyboardInterrupt would break into the script's ``finally``.
While the script's own handler is SIGINT's, nothing tells whether the
signal arrived, so nothing is sent again until the script puts ours back (a
script that keeps its own gets one SIGINT, as before).  Either way the end
stays bounded: ``EndOfJob`` ends the job itself if the script has not begun
to leave ``MPIMESH_SHUTDOWN_TIMEOUT`` after the first SIGINT.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

__all__ = ["RESEND_EVERY", "Interruption", "SigintHandler", "install_sigint_handler"]

#: Seconds between two SIGINTs of one :class:`Interruption`, while the first seems lost.
RESEND_EVERY = 0.05


class SigintHandler:
    """The controller's SIGINT handler: Python's own, plus a count of its runs.

    It raises KeyboardInterrupt as :func:`signal.default_int_handler` does,
    so Ctrl-C behaves as without it; :class:`Interruption` reads
    :attr:`runs` to know whether its SIGINT arrived.
    """

    def __init__(self) -> None:
        #: how many SIGINTs this handler has run for
        self.runs = 0
        # set by Interruption.resend: the runs count before its first SIGINT
        self._resent_since: int | None = None

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        """Count this run, then raise KeyboardInterrupt (:func:`signal.default_int_handler`).

        Once an :class:`Interruption` has sent SIGINT again, only the first
        run after its first SIGINT raises: a re-sent SIGINT that arrives
        after it is dropped.  The check and the send of a re-send are not
        atomic: the KeyboardInterrupt can land between them, and the next
        one would break into the script's ``finally``.  (A Ctrl-C then is
        dropped too: the job ends within ``MPIMESH_SHUTDOWN_TIMEOUT`` of the
        first SIGINT regardless.)
        """
        self.runs += 1
        if self._resent_since is not None and self.runs > self._resent_since + 1:
            return
        signal.default_int_handler(signum, frame)

    def resending(self, since: int) -> None:
        """An :class:`Interruption` whose first SIGINT found :attr:`runs` at ``since`` sends SIGINT again."""
        self._resent_since = since

    def __repr__(self) -> str:
        return f"SigintHandler(runs={self.runs})"


def install_sigint_handler() -> SigintHandler | None:
    """Install a :class:`SigintHandler` for SIGINT, if this is the main thread and SIGINT's handler is Python's own.

    Returns:
        The handler installed, or None when nothing was installed (another
        thread, or a handler that is not ``signal.default_int_handler``: a
        Jupyter kernel's, the script's own, SIGINT ignored).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return None
    handler = SigintHandler()
    signal.signal(signal.SIGINT, handler)
    return handler


def _pthread_sigint(thread: threading.Thread) -> None:
    if thread.ident is not None:
        signal.pthread_kill(thread.ident, signal.SIGINT)


class Interruption:
    """One interrupt of the main thread: a SIGINT now, sent again while it is lost.

    The first SIGINT is sent by the constructor.  It is sent again only
    while ``handler`` is SIGINT's handler (see :meth:`lost`).

    Args:
        main: the thread to interrupt (the script's main thread).
        leaving: set once the script has begun to leave; no SIGINT after it.
        handler: the handler installed at boot (:func:`install_sigint_handler`),
            or None: one SIGINT only.
        send: sends SIGINT to a thread (``pthread_kill``; tests pass a fake).
    """

    def __init__(self, main: threading.Thread, leaving: threading.Event, handler: SigintHandler | None, *,
                 send: Callable[[threading.Thread], None] = _pthread_sigint) -> None:
        self.main = main
        self.leaving = leaving
        self.handler = handler
        self._send = send
        self._since = handler.runs if handler is not None else 0
        #: SIGINTs sent so far
        self.sent = 0
        #: time.monotonic() of the first SIGINT
        self.started = time.monotonic()
        self.sent += 1
        send(main)

    def lost(self) -> bool:
        """Whether every SIGINT sent so far may be lost, and one more is safe to send.

        True while ``handler`` has not run since the first SIGINT, the
        script has not begun to leave, the main thread is alive, and
        SIGINT's handler is ``handler`` (the script's own handler may have
        taken the signal).  Once ``handler`` has run it is never true
        again: another SIGINT would break into the script's ``finally``.
        """
        handler = self.handler
        return (handler is not None and handler.runs == self._since and not self.leaving.is_set()
                and self.main.is_alive() and signal.getsignal(signal.SIGINT) is handler)

    def wait_left(self, timeout: float, *, every: float = RESEND_EVERY) -> bool:
        """Wait for the script to begin leaving, sending SIGINT again every ``every`` s while :meth:`lost`.

        Blocks at most ``timeout`` seconds from the first SIGINT.

        Returns:
            Whether ``leaving`` was set within ``timeout``.
        """
        deadline = self.started + timeout
        while True:
            left = deadline - time.monotonic()
            if self.leaving.wait(max(0.0, min(every, left))):
                return True
            if left <= every:
                return False
            if self.handler is not None and self.lost():
                self.handler.resending(self._since)
                self.sent += 1
                self._send(self.main)

    def __repr__(self) -> str:
        return f"Interruption(sent={self.sent}, handler={self.handler!r})"
