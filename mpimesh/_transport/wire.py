"""The wire: what makes the frame path's MPI calls, one class per backend, chosen once per process.

``MPIMESH_WIRE`` names the two (``mpimesh info`` reports which is in use):

* :class:`~.wire_mpi4py.Mpi4pyWire` makes every call through mpi4py;
* :class:`~.wire_native.NativeWire` makes the hot ones (receiving and
  dispatching, sending a frame that leaves at once) in C, through
  ``mpimesh._native``, on mpi4py's raw handles.

Both are complete: each receives, dispatches, sends, batches and keeps its
own statistics, and shares with the other only :class:`~.outbox.Outbox`
(batching, raw buffers, sends in flight) and the :mod:`.links`.  The router
(:class:`~.router.Router`) decides where a frame goes (which link, which
rank) and hands it to its wire through :class:`Wire`, the one interface
both answer.

Every MPI call of the runtime goes through the wire, under one of its two
locks: sends under the send lock, everything else (receiving, the data
plane's windows, spawning) under :attr:`Wire.lock`.  Two locks let a thread
that issues calls go on while another receives the replies (MPI is
initialised with ``MPI_THREAD_MULTIPLE``); with one lock, every collision
between them costs a thread hand-off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from .frames import Addr, Frame
from .links import Link, Tick

__all__ = ["Wire"]


class Wire(Protocol):
    """The frame path's MPI calls over a set of links: what a router asks of its wire."""

    #: held for receiving and every MPI call other than a send
    lock: threading.Lock
    #: held for every send
    send_lock: threading.Lock
    #: source -> when a frame from it last arrived, for the tracked sources; None: the controller only
    heard: dict[Addr, float] | None
    #: when a frame from the controller last arrived, while :attr:`heard` is None
    heard_controller: float
    #: rings a peer's doorbell after a frame that follows a pause
    ring: Callable[[Addr], None] | None
    #: called about once per millisecond of polling
    every_ms: Callable[[], None] | None
    #: called when a frame is held back for a batch and none was
    on_hold: Callable[[], None] | None

    @property
    def frames_in(self) -> int:
        """Frames received and dispatched."""

    @property
    def frames_out(self) -> int:
        """Frames sent, one per frame of a batch."""

    @property
    def batches_out(self) -> int:
        """BATCH messages sent."""

    @property
    def sent_at(self) -> float:
        """When this process last sent a frame (``time.monotonic``)."""

    @property
    def polls(self) -> int:
        """Polls made so far."""

    def add_link(self, link: Link) -> None:
        """Poll ``link`` from now on (lock held)."""

    def remove_link(self, link: Link) -> bool:
        """Stop polling ``link`` (lock held); whether it was polled."""

    def send(self, link: Link, rank: int, frame: Frame) -> None:
        """Send ``frame`` (no raw buffers) to ``rank`` on ``link``; returns at once."""

    def post(self, link: Link, rank: int, data: bytes, buffers: Sequence[Any], quiet: bool = False,
             unless: Callable[[], bool] | None = None) -> bool:
        """Send a pickled frame and its raw buffers (see :meth:`.outbox.Outbox.post`)."""

    def loop_back(self, data: bytes, buffers: Sequence[Any]) -> None:
        """Deliver a pickled frame this process sent itself at the next poll, with copies of its buffers."""

    def forget(self, link: Link) -> None:
        """Drop the frames held back for ``link``'s processes."""

    def poll(self, spin: float = 0.0) -> int:
        """Receive what has arrived and dispatch it; returns the number of frames, heartbeats not counted."""

    def flush(self) -> None:
        """Send every batch held back."""

    def drain(self, bound: float) -> bool:
        """Wait until every send posted so far has completed, at most ``bound`` seconds; whether they have."""

    def pending_sends(self) -> int:
        """Sends not yet complete (batches held back are sent first)."""

    def exclusive(self) -> AbstractContextManager[None]:
        """Hold :attr:`lock` for an MPI call other than a send, ahead of the pollers."""

    def watch(self, tick: Tick) -> None:
        """Call ``tick()`` under the lock on every poll until it returns a function, then call that."""
