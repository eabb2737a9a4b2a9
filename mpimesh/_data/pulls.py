"""Reads of another host's RDMABuffer as one two-sided message, served by the owner's polling thread.

Across hosts an :class:`~mpimesh.RDMABuffer` could be read through the
island's MPI window (``_windows``), but Open MPI serves a ``Get`` over TCP
with active messages that the *owner* handles inside its own MPI calls: a
64 MiB read measured 0.29x a raw ``Send`` between the same two hosts
(docs/design/hosts.md, 3.6).  A read is therefore a pull:

1. the reader posts ``Irecv`` straight into its destination, on a tag of
   its own (:data:`TAG_BASE` + a counter), and sends the owner a small
   ``PULL`` frame (the buffer's token, the byte count, the tag);
2. the owner's polling thread, not an actor, checks the token and
   sends (``Isend``) from the registered memory itself (no copy), on that tag;
   a buffer dropped meanwhile answers with an empty message.

The transfer runs at ``Send``/``Recv`` speed plus one wake-up of the owner,
whatever its actors do.  Both requests are tested on every poll
(``Router.watch``), which also keeps both routers polling tightly until they
complete.  Writes keep the window (``Put`` is native over TCP); same-host
reads keep kernel copies (``_cma``).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._transport.frames import Addr, Frame, pull
from .._transport.mpi import MPI
from . import buffers as _buffers
from .registry import registry
from .transfers import Transfer, abandoned

if TYPE_CHECKING:
    from .._transport.router import Router
    from ..future import Future

__all__ = ["MAX_BYTES", "Pull", "Pulls", "TAG_BASE"]

#: Tags of pulled data: TAG_BASE ... TAG_BASE + _TAGS - 1, taken in turn by each reader.
TAG_BASE = 0x1000
_TAGS = 0x1000
#: One message carries a pull (MPI-3 counts are C ints); larger reads use the window.
MAX_BYTES = (1 << 31) - 1

# Error classes that mean "the owner's process has failed" (ULFM).
_FAILED = {getattr(MPI, n) for n in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED") if hasattr(MPI, n)}
#: Seconds a read whose receive MPI failed (ULFM) waits for the controller's report of the owner's death,
#: which names the process, its host and the cause, before failing with MPI's poorer word.
_REPORT_GRACE = 1.0


class Pulls:
    """One process's pulls: the tags it reads on, and the owner's side (``on_pull``)."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self._tags = itertools.cycle(range(TAG_BASE, TAG_BASE + _TAGS))
        self._lock = threading.Lock()
        #: statistics: pulls served here, bytes sent, pulls refused (dropped buffer)
        self.served = self.bytes_served = self.refused = 0

    def reaches(self, owner: Addr) -> bool:
        """Whether this process has a direct MPI link to ``owner`` (a pull needs one)."""
        return self.router.link_of(owner) is not None

    def next_tag(self) -> int:
        with self._lock:
            return next(self._tags)

    def on_pull(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """PULL, on the owner's polling thread: send the bytes asked for straight from the registered memory."""
        _, _, token, nbytes, tag = frame
        link = self.router.link_of(src)
        if link is None:
            return  # the reader's link is gone (it died): nobody waits
        comm, rank = link
        entry = registry.valid(token)
        memory = entry.memory if entry is not None else None
        if memory is None or memory.device != "cpu" or nbytes > memory.nbytes:
            self.refused += 1
            data: Any = _EMPTY
        else:
            data = memory.array()[:nbytes]
        router = self.router
        try:
            with router.exclusive():
                request = comm.Isend([data, MPI.BYTE], rank, tag)
        except MPI.Exception:
            return  # the reader died: its Irecv dies with it
        if data is not _EMPTY:
            self.served += 1
            self.bytes_served += nbytes

        held = [data, memory]  # referenced by ``sent`` until the send completes: the buffer may be dropped meanwhile

        def sent() -> Callable[[], None] | None:
            try:
                if not request.Test():
                    return None
            except MPI.Exception:
                pass  # the reader died mid-transfer
            del held[:]
            return _done

        router.watch(sent)


_EMPTY: Any = bytearray()


def _done() -> None:
    pass


class Pull(Transfer):
    """One read of a remote buffer by pull, driven by the router's polls (see the module's docstring).

    Args:
        pulls: this process's pulls; the rest as :class:`~.transfers.Transfer`.
    """

    def __init__(self, pulls: Pulls, dead: dict[Addr, str], handle: Any, what: str, memory: _buffers.Memory,
                 nbytes: int, timeout: float, fut: Future[None], errors: Callable[..., BaseException]) -> None:
        super().__init__(dead, handle, what, "read", memory, nbytes, timeout, fut, errors)
        self.pulls = pulls
        self.status = MPI.Status()
        #: when MPI said the owner failed, and its words
        self.lost: tuple[float, str] | None = None

    def start(self) -> None:
        router = self.pulls.router
        owner = self.h.owner
        link = router.link_of(owner)
        if link is None:
            self._finish(ConnectionError(f"RDMABuffer.read_into: no MPI link to the owner of {self.what}"))
            return
        comm, rank = link
        tag = self.pulls.next_tag()
        self.local = self._local()
        try:
            with router.exclusive():
                self.request = comm.Irecv([self.local, MPI.BYTE], rank, tag)
            router.send(owner, pull(self.h.token, self.nbytes, tag))
        except (MPI.Exception, ConnectionError) as exc:
            error = exc if isinstance(exc, ConnectionError) else self._error(exc)
            if self.request is not None:
                abandoned.append(self._alive())
                self.staged = None
            self._finish(error)
            return
        router.watch(self.tick)

    def tick(self) -> Any:
        """Under the router's lock: test the receive; return a settle function when done."""
        if self.h.owner in self.dead:
            return self._abandon(self.errors("dead"))
        if self.lost is not None:
            if time.monotonic() < self.lost[0] + _REPORT_GRACE:
                return None  # the controller's report of the death is on its way
            return self._abandon(self.errors("dead", f"reported failed by MPI ({self.lost[1]})"))
        if time.monotonic() > self.deadline:
            return self._abandon(TimeoutError(
                f"RDMABuffer.read_into: {self.what} not read after {self.timeout:g} s; its owner's process "
                "must be polling (any running mpimesh process does): pass a larger timeout"
            ))
        try:
            if not self.request.Test(self.status):
                return None
        except MPI.Exception as exc:
            if exc.Get_error_class() in _FAILED:
                self.lost = (time.monotonic(), exc.Get_error_string())
                return None
            return self._settle(self._error(exc))
        if self.status.Get_count(MPI.BYTE) != self.nbytes:
            return self._settle(self.errors("dropped"))  # the owner sent nothing: the buffer was dropped
        return self._settle(None)

    def _abandon(self, error: BaseException) -> Any:
        try:
            self.request.Cancel()  # a receive can be cancelled (one-sided requests cannot)
        except MPI.Exception:
            pass
        return super()._abandon(error)
