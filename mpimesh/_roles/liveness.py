"""The controller's liveness channel: who is still alive, and why not.

MPI alone cannot be trusted with this: without ULFM a dead rank aborts the
job, with ULFM a rank that calls ``os._exit(1)`` is not reported, and the
death of a spawned process is never reported to its parent
(../shared/reference/mpi-facts.md).  So the controller watches on its own:

* same-host workers through a ``pidfd`` each, polled with every MPI poll:
  a death is seen within milliseconds whatever its cause;
* every worker through heartbeats: one that has been silent for a while gets
  a PING, and one silent for ``MPIMESH_HEARTBEAT_TIMEOUT`` seconds is
  declared dead (hung in C code, stopped, on a lost node);
* ULFM's ``ERR_PROC_FAILED`` where the MPI has it (see ``_transport.router`` and ``_core.failures``).

The cause comes from the worker's *last words*: every worker points Python's
``faulthandler`` at a file of its own, so a fatal signal (SIGSEGV, SIGABRT,
SIGBUS, SIGFPE, SIGILL) leaves its name and stack there.  An ``os._exit``, a
SIGKILL or the OOM killer leaves nothing: the exit status belongs to the
launcher's daemon, which reaps the process, and is in the launcher's log.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import shutil
import time
from collections.abc import Iterable
from typing import IO, Protocol

from .._core import protocol
from .._core.protocol import Frame
from .._transport.bell import bell_path, job_dir
from ..config import settings

__all__ = ["Liveness", "Process", "job_dir", "last_words_path", "start_last_words", "stop_last_words"]

Addr = tuple[int, int]


class _Router(Protocol):
    def send_quiet(self, dest: Addr, frame: Frame) -> None: ...


class _Failures(Protocol):
    def declare_dead(self, addr: Addr, cause: str) -> None: ...


class Process(Protocol):
    """What liveness uses of the controller's runtime."""

    @property
    def host(self) -> str: ...

    @property
    def pid(self) -> int: ...

    @property
    def router(self) -> _Router: ...

    @property
    def failures(self) -> _Failures: ...

# A worker silent for a quarter of the heartbeat timeout (at most this long)
# gets a PING.
_PING_AFTER = 2.0

_last_words: IO[str] | None = None


def last_words_path(controller_pid: int, addr: Addr) -> str:
    """Where the worker at ``addr`` writes its last words."""
    return os.path.join(job_dir(controller_pid), f"{addr[0]}.{addr[1]}.txt")


def start_last_words(controller_pid: int, addr: Addr) -> None:
    """On a worker: dump fatal signals' tracebacks to this worker's file."""
    global _last_words
    path = last_words_path(controller_pid, addr)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        _last_words = open(path, "w")  # noqa: SIM115 - must outlive this call
    except OSError:
        return
    faulthandler.enable(file=_last_words, all_threads=True)


def stop_last_words(controller_pid: int, addr: Addr) -> None:
    """On a worker leaving normally: nothing to say."""
    global _last_words
    if _last_words is None:
        return
    faulthandler.disable()
    _last_words.close()
    _last_words = None
    try:
        os.unlink(last_words_path(controller_pid, addr))
    except OSError:
        pass


def leave_job_dir(controller_pid: int, dead: Iterable[Addr]) -> None:
    """On a worker leaving normally, after its own files went: remove the dead's, and the directory if empty.

    The controller removes the job directory of its own host at the end;
    on another host, the last worker to leave does, with the last words and
    bells of the processes that died there (the controller read those at
    the death, before anyone heard of it).
    """
    folder = job_dir(controller_pid)
    for addr in dead:
        for path in (last_words_path(controller_pid, addr), bell_path(controller_pid, addr)):
            with contextlib.suppress(OSError):
                os.unlink(path)
    with contextlib.suppress(OSError):
        os.rmdir(folder)  # fails while another process of the job still has files here


class Liveness:
    """Watches the workers of one controller.

    Args:
        runtime: the controller's runtime.
    """

    def __init__(self, runtime: Process) -> None:
        self.rt = runtime
        self.timeout = settings.heartbeat_timeout
        self.ping_after = min(_PING_AFTER, self.timeout / 4)
        self._poller = select.poll()
        self._fds: dict[int, Addr] = {}
        self._by_addr: dict[Addr, int] = {}
        self.last_heard: dict[Addr, float] = {}
        self._next_heartbeat = 0.0
        self._ping = 0
        # Every worker hears from the controller at least this often, so that
        # one on another node can tell when the controller is gone.
        self._pinged: dict[Addr, float] = {}

    def watch(self, addr: Addr, pid: int, host: str) -> None:
        """Start watching a worker (after its hello)."""
        self.last_heard[addr] = time.monotonic()
        if not pid or host != self.rt.host or not hasattr(os, "pidfd_open"):
            return  # another node: heartbeats only
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.rt.failures.declare_dead(addr, "was gone before it could be watched")
            return
        except OSError:
            return
        self._fds[fd] = addr
        self._by_addr[addr] = fd
        self._poller.register(fd, select.POLLIN)

    def watches(self, addr: Addr) -> bool:
        """Whether ``addr``'s exit is seen through a pidfd (a worker on this host)."""
        return addr in self._by_addr

    def forget(self, addr: Addr) -> None:
        """Stop watching (the worker said BYE, or is known dead)."""
        self.last_heard.pop(addr, None)
        self._pinged.pop(addr, None)
        fd = self._by_addr.pop(addr, None)
        if fd is not None:
            self._fds.pop(fd, None)
            try:
                self._poller.unregister(fd)
            finally:
                os.close(fd)

    def check(self) -> None:
        """Declare dead every watched process that has exited (cheap: one poll(2))."""
        if not self._fds:
            return
        for fd, _ in self._poller.poll(0):
            addr = self._fds.get(fd)
            if addr is not None:
                self.forget(addr)
                self.rt.failures.declare_dead(addr, self.cause(addr))

    def heartbeat(self) -> None:
        """PING quiet workers; declare dead those silent past the timeout."""
        now = time.monotonic()
        if now < self._next_heartbeat:
            return
        self._next_heartbeat = now + self.ping_after / 2
        for addr, heard in list(self.last_heard.items()):
            silent = now - heard
            if silent > self.timeout:
                self.forget(addr)
                self.rt.failures.declare_dead(
                    addr, f"stopped answering: silent for {silent:.1f} s (MPIMESH_HEARTBEAT_TIMEOUT={self.timeout:g})"
                )
            elif silent > self.ping_after or now - self._pinged.get(addr, 0.0) > self.timeout / 2:
                self._pinged[addr] = now
                self._ping += 1
                try:
                    self.rt.router.send_quiet(addr, protocol.ping(self._ping))
                except ConnectionError:
                    pass

    def cause(self, addr: Addr) -> str:
        """Why ``addr`` died, from its last words if it left any."""
        path = last_words_path(self.rt.pid, addr)
        try:
            with open(path) as f:
                words = f.read()
            os.unlink(path)
        except OSError:
            words = ""
        for line in words.splitlines():
            if line.startswith("Fatal Python error:"):
                return f"killed by a fatal signal ({line[len('Fatal Python error: '):].strip()})"
        return "exited without a word (os._exit, SIGKILL or the OOM killer; the launcher's log has its exit status)"

    def close(self) -> None:
        """Stop watching everything and remove the job's last-words directory."""
        for addr in list(self._by_addr):
            self.forget(addr)
        shutil.rmtree(job_dir(self.rt.pid), ignore_errors=True)
