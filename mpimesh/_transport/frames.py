"""What the transport knows of a frame: addresses, tags, and the kinds it handles itself.

Every frame is a pickled tuple ``(kind, bufsizes, *fields)``.  ``bufsizes`` is
``None`` or a tuple of byte counts: that many raw buffers follow the frame on
:data:`TAG_DATA` from the same sender, posted atomically with it, so the
receiver takes them right after the frame (MPI does not reorder messages
between one sender and one receiver on one tag).

The router reads only ``kind`` and ``bufsizes``, and opens the three kinds it
handles itself: it builds ``BATCH`` and ``FORWARD`` frames (with the
constructors below, the only ones of these kinds) and expands ``BATCH`` on receipt, and it does not count a
``PING`` as traffic.  ``LINK`` and ``MARK`` make and switch to direct links
between islands (:mod:`.peers`).  Every kind, with its fields, is declared in
``mpimesh._core.protocol``, which imports the codes below so that each kind
has one number.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "Addr", "BATCH", "BUFSIZES", "CONTROLLER", "FORWARD", "Frame", "KIND", "LINK", "MARK", "PING", "PULL", "TAG_DATA",
    "TAG_FRAME", "batch", "forward", "link", "mark", "pull",
]

#: A process's address ``(island, rank)``: island 0 is the launch world, island
#: ``k > 0`` the ``k``-th set of processes created with ``MPI_Comm_spawn``.
Addr = tuple[int, int]
#: A frame on the wire: ``(kind, bufsizes, *fields)``.
Frame = tuple[Any, ...]

#: Positions of the two fields every frame starts with.
KIND: Final = 0
BUFSIZES: Final = 1

#: The controller's address.
CONTROLLER: Final[Addr] = (0, 0)

#: Tag of pickled control frames.
TAG_FRAME: Final = 0x6D6D
#: Tag of raw out-of-band buffers that follow a frame.
TAG_DATA: Final = 0x6D6E

#: any -> controller: relay the inner frame to ``dest``: ``(dest, frame_bytes)``.
FORWARD: Final = 9
#: controller <-> worker heartbeat: ``(sequence,)``; it rings no doorbell.
PING: Final = 11
#: any -> any: several frames to one process in one message: ``([frame_bytes, ...],)``.
BATCH: Final = 15
#: controller <-> worker: a step in making a direct link between two islands: ``(op, peer, port)``.
LINK: Final = 21
#: worker -> worker, relayed: the last frame from ``sender`` on the relay path: ``(sender,)``.
MARK: Final = 22
#: reader -> an RDMABuffer's owner: send ``nbytes`` of the buffer of ``token`` on ``tag``: ``(token, nbytes, tag)``.
PULL: Final = 23


def pull(token: int, nbytes: int, tag: int) -> Frame:
    """A ``PULL`` frame: reader -> owner: send ``nbytes`` of the RDMABuffer of ``token`` on ``tag`` (``pulls``)."""
    return (PULL, None, token, nbytes, tag)


def batch(frames: list[bytes]) -> Frame:
    """A ``BATCH`` frame: several pickled frames to one process in one message."""
    return (BATCH, None, frames)


def forward(bufsizes: tuple[Any, ...] | None, dest: Addr, frame_bytes: bytes) -> Frame:
    """A ``FORWARD`` frame: the controller relays the pickled inner frame (and its raw buffers) to ``dest``."""
    return (FORWARD, bufsizes, dest, frame_bytes)


def link(op: str, peer: Addr, port: str | None) -> Frame:
    """A ``LINK`` frame: step ``op`` of making the direct link with ``peer`` (see :mod:`.peers`)."""
    return (LINK, None, op, peer, port)


def mark(sender: Addr) -> Frame:
    """A ``MARK`` frame: ``sender``'s frames after this one come on its direct link."""
    return (MARK, None, sender)
