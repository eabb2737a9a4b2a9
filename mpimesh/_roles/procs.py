"""The controller's table of its worker processes, and what it does to a set of them.

Every worker the controller knows, launch-pool rank or spawned, has one
:class:`ProcInfo` row, made when the worker is known (at boot for the pool,
at the spawn for an island) and never removed: its flags say where it is in
its life (said hello, handed to a mesh, said BYE, dead).  The pool
(``_roles.pool``), the islands (``_roles.islands``), the host watchers
(``_roles.hostwatchers``) and the end of the job (``_roles.end_of_job``) all
read and change the same rows, under :attr:`Procs.lock`, and wait on
:attr:`Procs.cond` for hellos, BYEs and deaths.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass

from .._core import protocol
from .._core.logs import warn
from .._core.ports import Gather
from .._core.runtime import Runtime
from ..future import Future
from ..shape import Shape

__all__ = ["ProcInfo", "Procs"]

Addr = tuple[int, int]


@dataclass
class ProcInfo:
    """What the controller knows about one worker process."""

    addr: Addr
    host: str
    pid: int
    hello: bool = True
    bye: bool = False
    allocated: bool = False
    dead: bool = False

    @property
    def gone(self) -> bool:
        """Whether it has left (BYE) or died."""
        return self.bye or self.dead


class Procs:
    """Every worker process of the job, by address.

    Args:
        runtime: the controller's runtime.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        #: guards the table's rows and the islands' bookkeeping
        self.lock = threading.RLock()
        #: notified when a worker says hello, says BYE or dies (:meth:`changed`)
        self.cond = threading.Condition()
        self._rows: dict[Addr, ProcInfo] = {}
        #: declared dead on another host without proof: only an Abort ends them
        self.unconfirmed: set[Addr] = set()

    def add(self, proc: ProcInfo) -> None:
        """Know one more worker."""
        with self.lock:
            self._rows[proc.addr] = proc

    def __getitem__(self, addr: Addr) -> ProcInfo:
        return self._rows[addr]

    def get(self, addr: Addr) -> ProcInfo | None:
        """The worker at ``addr``, if the controller knows one there."""
        return self._rows.get(addr)

    def values(self) -> list[ProcInfo]:
        """Every worker (a copy: safe to read while another thread adds)."""
        return list(self._rows.values())

    def __len__(self) -> int:
        return len(self._rows)

    def live(self) -> list[Addr]:
        """Workers that said hello and have neither left nor died."""
        return [a for a, p in list(self._rows.items()) if p.hello and not p.gone]

    def all_left(self, addrs: Iterable[Addr]) -> bool:
        """Whether every worker of ``addrs`` has said BYE or died."""
        return all(self._rows[a].gone for a in addrs)

    def changed(self) -> None:
        """Wake the threads that wait for hellos, BYEs and deaths."""
        with self.cond:
            self.cond.notify_all()

    def wait_left(self, addrs: list[Addr], timeout: float) -> bool:
        """Wait (driving progress) until every worker of ``addrs`` has left or died; whether they all have."""
        return self.rt.wait(lambda: self.all_left(addrs), self.cond, timeout)

    # --- what the controller does to workers ------------------------------------------------------

    def stop_actors(self, addrs: list[Addr], reason: str, timeout: float) -> None:
        """Stop every actor on ``addrs`` (STOP, each ``__cleanup__``); waits at most ``timeout`` for the answers.

        Processes that are gone or stuck are not waited for: what follows
        (closing an island, killing what still runs) deals with them.
        """
        rt = self.rt
        fut: Future[None] = Future("stop")
        shape = Shape.row_major(("procs",), (len(addrs),))
        receiver = Gather(fut, "stop", shape, addrs, values=False)
        port = (rt.addr, rt.ports.open(receiver))
        for i, addr in enumerate(addrs):
            if addr in rt.dead:
                receiver.fail(addr, rt.dead[addr])
                continue
            try:
                rt.multicast.post(addr, protocol.stop(None, port, i, reason))
            except ConnectionError as exc:
                receiver.fail(addr, str(exc))
        if receiver.count >= receiver.n:
            rt.ports.close(port[1])
        try:
            fut.get(timeout)
        except Exception:
            pass  # processes gone or stuck: the caller closes them regardless

    def send_shutdown(self, addrs: Iterable[Addr], code: int) -> None:
        """Tell every worker of ``addrs`` that has neither left nor died to stop and exit with ``code``."""
        frame = protocol.shutdown(code, bool(self.rt.dead))
        for addr in addrs:
            if self._rows[addr].gone:
                continue
            try:
                self.rt.send(addr, frame)
            except ConnectionError:
                pass

    def kill(self, proc: ProcInfo) -> bool:
        """SIGKILL ``proc`` if it runs on this host; returns whether it does."""
        if not proc.pid or proc.host != self.rt.host:
            return False
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return True

    def wait_exited(self, addrs: list[Addr], timeout: float) -> None:
        """Wait at most ``timeout`` for the exit of those of ``addrs`` on this host (a pidfd each)."""
        fds = []
        for addr in addrs:
            proc = self._rows[addr]
            if proc.pid and proc.host == self.rt.host and hasattr(os, "pidfd_open"):
                try:
                    fds.append(os.pidfd_open(proc.pid))
                except OSError:
                    pass  # gone already
        deadline = time.monotonic() + timeout
        try:
            for fd in fds:
                if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    warn(f"a stopped process did not exit within {timeout:g} s (MPIMESH_SHUTDOWN_TIMEOUT)")
                    break
        finally:
            for fd in fds:
                os.close(fd)
