"""MPI windows of the data plane: one dynamic window per island.

Windows are collective, so each is made at boot, on the communicator every
process of an island already shares (``_roles.boot.boot_controller`` /
``boot_pool`` for island 0, ``boot_spawned`` for a spawned island).  It is a
*dynamic* window (``MPI_Win_create_dynamic``): any memory may be attached
later, by one process alone, so an :class:`~mpimesh.RDMABuffer` made at any
time can be reached one-sidedly by the other processes of its island.  A
passive epoch to every rank is opened once (``Lock_all(MODE_NOCHECK)``) and
never closed, so no operation waits on a lock.

Every MPI call goes through the router's lock.  Operations are non-blocking
(``Rget``/``Rput``); the router tests them on each poll (``Router.watch``),
and a caller waits on an :class:`~mpimesh.Future`.  Only the remote
completion of a write (``Win_flush``) blocks, once the data has left.

This is the cross-host path.  On the PyPI Open MPI and MPICH stacks, a
dynamic window on one host is served by messages that the owner handles when
it polls MPI, so same-host buffers use ``_cma`` instead (see there for
figures).  Windows span one island: two islands share no communicator.

``MPIMESH_RMA_WINDOWS`` decides whether an island gets a window: ``auto``
(the default) when its processes run on more than one host, ``always``, or
``never``.  Skipping it on one host saves the boot its window and keeps
Open MPI quiet: with fault tolerance on (a singleton controller, ``mpimesh
run``) it warns at every window that osc/rdma "is not tested for
post-failure operation".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._transport.mpi import MPI
from ..config import settings
from . import buffers as _buffers
from .transfers import Transfer

if TYPE_CHECKING:
    from .._transport.router import Router
    from ..future import Future

__all__ = ["Window", "WindowTransfer", "mode", "open_island", "window", "unavailable"]

Addr = tuple[int, int]


class Window:
    """This process's dynamic window over its island's communicator."""

    def __init__(self, router: Router, comm: MPI.Intracomm, island: int, win: MPI.Win) -> None:
        self.router = router
        self.comm = comm
        self.island = island
        self.win = win
        self.rank = comm.Get_rank()
        self.attached: dict[int, Any] = {}

    def reaches(self, owner: Addr) -> bool:
        """``owner`` is in this window's island."""
        return owner[0] == self.island

    def attach(self, memory: Any, addr: int) -> bool:
        """Expose ``memory`` (starting at ``addr``) to the island; False if MPI refuses."""
        with self.router.exclusive():
            try:
                self.win.Attach(memory)
            except (MPI.Exception, NotImplementedError, TypeError, BufferError):
                return False
        self.attached[addr] = memory
        return True

    def detach(self, addr: int) -> None:
        """Stop exposing the memory attached at ``addr``."""
        memory = self.attached.pop(addr, None)
        if memory is None:
            return
        with self.router.exclusive():
            try:
                self.win.Detach(memory)
            except MPI.Exception:
                pass

    def get(self, rank: int, local: Any, remote: int, nbytes: int) -> MPI.Request:
        """Start reading ``nbytes`` at ``remote`` of ``rank`` into ``local``."""
        with self.router.exclusive():
            return self.win.Rget([local, nbytes, MPI.BYTE], rank, [remote, nbytes, MPI.BYTE])

    def put(self, rank: int, local: Any, remote: int, nbytes: int) -> MPI.Request:
        """Start writing ``nbytes`` of ``local`` to ``remote`` of ``rank``."""
        with self.router.exclusive():
            return self.win.Rput([local, nbytes, MPI.BYTE], rank, [remote, nbytes, MPI.BYTE])

    def flush(self, rank: int) -> None:
        """Complete every operation to ``rank`` at ``rank`` (blocks until it has)."""
        self.win.Flush(rank)  # called from a watch tick: the router lock is held


_window: Window | None = None
_why_not = "no window: this process has not booted the mpimesh runtime"


def mode() -> str:
    """``MPIMESH_RMA_WINDOWS`` (``auto``, ``always`` or ``never``; see ``config``)."""
    return settings.rma_windows


def open_island(router: Router, comm: MPI.Intracomm, island: int) -> None:
    """Create the island's dynamic window if it needs one; collective over ``comm``.

    An MPI without one-sided support leaves the window absent (every rank
    fails alike); same-host buffers still work through ``_cma``.
    """
    global _window, _why_not
    how = mode()
    if how == "auto":
        from .._transport.mpi import hostname

        if len(set(comm.allgather(hostname()))) == 1:
            _why_not = "its island runs on one host, where same-host copies serve (MPIMESH_RMA_WINDOWS=auto)"
            return
    elif how == "never":
        _why_not = "MPIMESH_RMA_WINDOWS=never"
        return
    try:
        win = MPI.Win.Create_dynamic(comm=comm)
        win.Set_errhandler(MPI.ERRORS_RETURN)
        win.Lock_all(MPI.MODE_NOCHECK)
    except (MPI.Exception, NotImplementedError) as exc:
        text = exc.Get_error_string() if isinstance(exc, MPI.Exception) else str(exc)
        _why_not = f"this MPI cannot create a dynamic window ({text})"
        return
    _window = Window(router, comm, island, win)


def window() -> Window | None:
    """This process's window, if the runtime made one."""
    return _window


def unavailable() -> str:
    """Why :func:`window` is ``None``."""
    return _why_not


# ---------------------------------------------------------------------------
# transfers


class WindowTransfer(Transfer):
    """One read, write or drop of an RDMABuffer through the owner's island window, driven by the router's polls.

    Phase 1 reads the buffer's token slot; phase 2 moves the data (a drop
    writes 0 to the slot instead).  Each phase is one non-blocking request.

    Args:
        win: this process's window (it reaches the owner); the rest as
            :class:`~.transfers.Transfer` (``handle`` also has ``addr`` and ``slot``).
    """

    def __init__(self, win: Window, dead: dict[Addr, str], handle: Any, what: str, op: str,
                 memory: _buffers.Memory, nbytes: int, timeout: float, fut: Future[None],
                 errors: Callable[..., BaseException]) -> None:
        import numpy as np

        super().__init__(dead, handle, what, op, memory, nbytes, timeout, fut, errors)
        self.win = win
        self.rank = handle.owner[1]
        self.token = np.zeros(1, np.uint64)
        self.phase = 1

    def start(self) -> None:
        self.local = self._local()
        try:
            self.request = self.win.get(self.rank, self.token, self.h.slot, 8)
        except MPI.Exception as exc:
            self._finish(self._error(exc))
            return
        self.win.router.watch(self.tick)

    def tick(self) -> Any:
        """Under the router's lock: test the request; start the next phase; return a settle function when done."""
        h = self.h
        if h.owner in self.dead:
            return self._abandon(self.errors("dead"))
        if time.monotonic() > self.deadline:
            return self._abandon(TimeoutError(
                f"RDMABuffer.{self.name}: {self.what} not done after {self.timeout:g} s through the MPI window; "
                "its owner must poll MPI for the transfer to progress: pass a larger timeout"
            ))
        win = self.win.win
        try:
            if not self.request.Test():
                return None
            if self.phase == 1:
                if int(self.token[0]) != h.token:  # dropped already: nothing to do for a drop
                    return self._settle(None if self.op == "drop" else self.errors("dropped"))
                self.phase = 2
                if self.op == "read":
                    self.request = win.Rget([self.local, MPI.BYTE], self.rank, [h.addr, self.nbytes, MPI.BYTE])
                elif self.op == "write":
                    self.request = win.Rput([self.local, MPI.BYTE], self.rank, [h.addr, self.nbytes, MPI.BYTE])
                else:
                    self.request = win.Rput([self.local, MPI.BYTE], self.rank, [h.slot, 8, MPI.BYTE])
                return None
            if self.op != "read":
                self.win.flush(self.rank)
        except MPI.Exception as exc:
            return self._settle(self._error(exc))
        return self._settle(None)

    def _alive(self) -> tuple[Any, ...]:
        return (*super()._alive(), self.token)
