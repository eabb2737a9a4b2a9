"""One RDMABuffer transfer, whatever carries it: the local side, the deadline, giving up and settling.

A transfer moves bytes between a local :class:`~._buffers.Memory` and a
remote buffer with non-blocking MPI requests that the router's polls test
(``Router.watch``); its subclasses say which requests: through the island's
window (``_windows.WindowTransfer``), or pulled as one message from the
owner's polling thread (``_pulls.Pull``).  What they share is here:

* the local side is the memory itself, or for a CUDA buffer and an MPI that
  is not CUDA-aware a staging copy in host memory (copied in before a
  write, out after a read);
* a transfer given up on (timeout, dead owner) keeps every object MPI may
  still write into alive (:data:`abandoned`), and frees the staging copy
  only once it is settled;
* the future is settled once, outside the router's lock: ``tick`` returns a
  settle function, which the router calls after releasing it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import buffers as _buffers

if TYPE_CHECKING:
    from .._transport.frames import Addr
    from ..future import Future

__all__ = ["Transfer", "abandoned"]

#: Requests given up on keep their memory alive here: MPI may still write into it.
abandoned: list[Any] = []

_NAMES = {"read": "read_into", "write": "write_from", "drop": "drop"}


class Transfer:
    """The common part of one transfer; subclasses define ``start`` and ``tick``.

    Args:
        dead: the addresses of dead processes (``Runtime.dead``).
        handle: the buffer's handle (``owner``, ``token``, ...).
        what: the buffer's repr, for messages.
        op: ``"read"``, ``"write"`` or ``"drop"``.
        memory: the local side.
        nbytes: bytes to move.
        timeout: seconds before the future fails with ``TimeoutError``.
        fut: settled when done.
        errors: ``errors("dropped")``, ``errors("dead")``, or ``errors("dead", why)`` when only MPI
            has said the owner failed (its words): the exception for that case.
    """

    def __init__(self, dead: dict[Addr, str], handle: Any, what: str, op: str, memory: _buffers.Memory,
                 nbytes: int, timeout: float, fut: Future[None], errors: Callable[..., BaseException]) -> None:
        self.dead = dead
        self.h = handle
        self.what = what
        self.op = op
        self.name = _NAMES[op]
        self.memory = memory
        self.nbytes = nbytes
        self.timeout = timeout
        self.deadline = time.monotonic() + timeout
        self.fut = fut
        self.errors = errors
        self.staged: Any = None
        self.request: Any = None
        self.local: Any = None

    def _local(self) -> Any:
        """The buffer MPI reads or writes: the memory, or a host staging copy of a device buffer."""
        memory = self.memory
        if memory.device == "cpu":
            return memory.array()[: self.nbytes]
        if _buffers.cuda_support().aware:
            return memory.tensor()[: self.nbytes]
        self.staged = _buffers.take_staging(self.nbytes)
        if self.op == "write":
            self.staged[: self.nbytes].copy_(memory.tensor()[: self.nbytes])
        return self.staged[: self.nbytes].numpy()

    def _alive(self) -> tuple[Any, ...]:
        """What MPI may still write into once the transfer is given up on."""
        return (self.request, self.local, self.staged, self.memory)

    def _error(self, exc: Any) -> BaseException:
        return ConnectionError(f"RDMABuffer.{self.name}: MPI failed on {self.what}: {exc.Get_error_string()}")

    def _abandon(self, error: BaseException) -> Any:
        abandoned.append(self._alive())
        self.staged = None  # kept in `abandoned`, never given back for reuse
        return self._settle(error)

    def _settle(self, error: BaseException | None) -> Any:
        return lambda: self._finish(error)

    def _finish(self, error: BaseException | None) -> None:
        try:
            if error is None and self.staged is not None and self.op == "read":
                self.memory.tensor()[: self.nbytes].copy_(self.staged[: self.nbytes])
        except BaseException as exc:
            error = exc
        finally:
            if self.staged is not None:
                _buffers.give_staging(self.staged)
                self.staged = None
        if self.fut.done():
            return
        if error is None:
            self.fut.set_result(None)
        else:
            self.fut.set_exception(error)
