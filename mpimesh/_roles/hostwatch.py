"""A worker's watch over the other workers of its host, for a controller on another host.

The controller learns how a worker of its own host ended through the
worker's pidfd: the wait status (``exits``) and the last words its
``faulthandler`` left in the host's job directory.  A worker on another host
is out of its reach: ULFM says only that the process failed.  So on every
other host one worker, the host's watcher, holds pidfds of that host's other
workers (the controller names them in ``WATCH`` frames), and when one exits
it reads the same two things there and sends the controller an ``EXITED``
frame with the cause, which the controller's report of the death then gives
(it waits a moment for it after ULFM's word: ``Failures.mpi_failed``).

A watcher only reports; it never declares a death.  Exits at the job's end
are reported too and mean nothing: the controller uses a cause only for a
process ULFM or the heartbeats found dead.
"""

from __future__ import annotations

import os
import select
from typing import TYPE_CHECKING, Any

from .._core import protocol
from .._transport.frames import CONTROLLER, Addr
from .exits import ended_status
from .liveness import exit_cause

if TYPE_CHECKING:
    from .._core.runtime import Runtime

__all__ = ["HostWatch"]


class HostWatch:
    """The pidfds of this host's other workers, checked on the polling thread about once per millisecond."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self._poller = select.poll()
        self._fds: dict[int, tuple[Addr, int]] = {}  # pidfd -> (worker, pid)
        #: statistics: exits reported to the controller
        self.reported = 0
        rt.every_ms(self.check)

    def add(self, peers: list[tuple[Addr, int]]) -> None:
        """Watch ``peers`` (address, pid); one already gone is reported at once, without a cause."""
        for addr, pid in peers:
            if addr == self.rt.addr or any(a == addr for a, _ in self._fds.values()):
                continue
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                self._report(addr, exit_cause(self.rt.controller_pid, addr, None))
                continue
            except OSError:
                continue  # no pidfds here (an old kernel, a sandbox): ULFM's word stays the report
            self._fds[fd] = (addr, pid)
            self._poller.register(fd, select.POLLIN)

    def check(self) -> None:
        """Report every watched worker that has exited (cheap when none has: one poll(2))."""
        if not self._fds:
            return
        for fd, _ in self._poller.poll(0):
            watched = self._fds.pop(fd, None)
            if watched is None:
                continue
            addr, pid = watched
            status = ended_status(fd, pid)  # while the pidfd is still open
            self._poller.unregister(fd)
            os.close(fd)
            self._report(addr, exit_cause(self.rt.controller_pid, addr, status))

    def _report(self, addr: Addr, cause: str) -> None:
        try:
            self.rt.send(CONTROLLER, protocol.exited(addr, cause))
            self.reported += 1
        except ConnectionError:
            pass  # the controller is gone: the job is ending

    def close(self) -> None:
        """Stop watching (this worker is leaving)."""
        for fd in list(self._fds):
            self._poller.unregister(fd)
            os.close(fd)
        self._fds.clear()

    def __repr__(self) -> str:
        watched: Any = sorted(a for a, _ in self._fds.values())
        return f"HostWatch({watched})"
