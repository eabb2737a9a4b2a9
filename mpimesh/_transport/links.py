"""Links: the communicators a process polls and sends on, and a peer's failure on one.

A :class:`Link` is what the router routes to (island, or one peer) and what
a wire polls and sends on (the communicator and its raw handle).  Each link
keeps, per rank it sends to, that destination's coalescing state (an
:class:`Out`, or the native wire's ``_native.Out`` with the same members).

The tuning constants of the frame path, the same for both wires, are here
too; the figures behind them are in docs/design/transport.md.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..config import settings
from .buffers import pieces, recv_buffer
from .frames import TAG_DATA, Addr, Frame
from .mpi import MPI

__all__ = [
    "BURST", "EVERY_MS", "FAILED_CLASSES", "FRAMES_PER_POLL", "MAX_BATCH", "NO_BUFFERS", "Failed", "Handler",
    "Link", "Out", "Tick", "acknowledge",
]

#: ``handler(src, frame, buffers)``, called for every frame, in arrival order
Handler = Callable[[Addr, Frame, list[Any]], None]
#: ``failed(addrs, text)``, called when MPI reports peers failed
Failed = Callable[[list[Addr], str], None]
#: a pending one-sided operation: returns the function that settles it once done, else None
Tick = Callable[[], Callable[[], None] | None]

#: Error classes that mean "a peer process has failed" (ULFM).
FAILED_CLASSES = {
    getattr(MPI, name)
    for name in ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
    if hasattr(MPI, name)
}

#: Frames without out-of-band buffers share this (never mutated) list.
NO_BUFFERS: list[Any] = []

#: A frame sent this soon after the previous one to the same process, with no
#: poll in between, joins a batch instead of leaving at once.
BURST = 1e-3
#: A batch leaves when it holds this many frames, even before a poll
#: (MPIMESH_BATCH_FRAMES; 1: no batching).
MAX_BATCH = settings.batch_frames

#: Frames handled per poll before returning to the waiter loop, so that a
#: flood of incoming messages cannot starve the waiter's own check.
FRAMES_PER_POLL = 64

#: How often a polling thread runs the wire's every_ms hook.
EVERY_MS = 1e-3


class Link:
    """One communicator this process polls and sends on."""

    __slots__ = ("comm", "handle", "island", "fixed", "outs")

    def __init__(self, comm: MPI.Comm, island: int, fixed: Addr | None) -> None:
        self.comm = comm
        self.handle: int = comm.handle
        self.island = island
        # A link whose remote group is one process alone (a spawned worker's
        # parent intercommunicator, a direct link to a peer) maps every source to it.
        self.fixed = fixed
        # rank -> frames waiting to leave for it (an Out, or the native wire's)
        self.outs: dict[int, Any] = {}

    def source(self, rank: int) -> Addr:
        """The address of the process at ``rank`` on this link."""
        return self.fixed if self.fixed is not None else (self.island, rank)

    def recv_buffers(self, src: int, sizes: tuple[Any, ...]) -> list[Any]:
        """Receive the raw buffers of the frame just received from ``src`` (lock held): they follow it."""
        comm = self.comm
        buffers = []
        for size in sizes:
            # an int, or (size, offset) for a large buffer
            buf = recv_buffer(size) if type(size) is int else recv_buffer(*size)
            view = memoryview(buf).cast("B")
            for start, stop in pieces(view.nbytes):
                comm.Recv([view[start:stop], MPI.BYTE], src, TAG_DATA)
            buffers.append(buf)
        return buffers


class Out:
    """Frames waiting to leave for one process, and when it was last sent to.

    The native wire keeps a ``_native.Out`` instead, with the same members.
    """

    __slots__ = ("link", "rank", "last", "polls", "frames")

    def __init__(self, link: Link, rank: int) -> None:
        self.link = link
        self.rank = rank
        self.last = 0.0
        # the wire's poll count at the last send
        self.polls = -1
        self.frames: list[bytes] = []


def acknowledge(link: Link, exc: MPI.Exception) -> tuple[list[Addr], str]:
    """Acknowledge a peer's failure that ``exc`` reported on ``link`` (ULFM); who failed, and MPI's text.

    Acknowledging makes wildcard receives work again for the survivors.
    Called with the wire's lock held.
    """
    comm = link.comm
    text = exc.Get_error_string()
    try:
        comm.Ack_failed()
        group = comm.Get_failed()
        try:
            local = comm.Get_remote_group() if isinstance(comm, MPI.Intercomm) else comm.Get_group()
            ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), local)
        finally:
            group.Free()
    except (MPI.Exception, NotImplementedError, AttributeError):
        return [], text
    return [link.source(r) for r in ranks if r is not None and r >= 0], text
