"""The mpi4py wire: every MPI call of the frame path through mpi4py.

Receiving probes every link (``improbe``) and receives and unpickles in one
mpi4py call; the raw buffers that follow a frame are received into pooled
blocks (:mod:`.buffers`) that stay faulted in between messages.  Sending goes
through an :class:`~.outbox.Outbox`.  The native wire (:mod:`.wire_native`)
makes the same calls on mpi4py's raw handles, in C; this one needs nothing
but mpi4py, and serves where the native part does not fit the loaded MPI
(``MPIMESH_WIRE``, see :mod:`.native`).
"""

from __future__ import annotations

import pickle
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from .chores import Chores
from .frames import BATCH, CONTROLLER, PING, TAG_FRAME, Addr, Frame
from .links import EVERY_MS, FAILED_CLASSES, FRAMES_PER_POLL, NO_BUFFERS, Failed, Handler, Link, Out, Tick, acknowledge
from .mpi import MPI
from .outbox import Outbox

__all__ = ["Mpi4pyWire"]


class Mpi4pyWire:
    """Receives, dispatches and sends frames through mpi4py (a :class:`~.wire.Wire`).

    Args:
        addr: this process's address.
        handlers: frame kind -> ``handler(src, frame, buffers)``, called for
            every frame, in arrival order, by the thread that polls.
        failed: called as ``failed(addrs, text)`` when MPI reports peers failed.
        broken: called with a traceback's text when a handler or a poll
            raised (the polling thread must survive it).
        names: frame kind -> its name, for those reports (else the number).
    """

    def __init__(
        self,
        addr: Addr,
        handlers: dict[int, Handler],
        failed: Failed | None = None,
        broken: Callable[[str], None] | None = None,
        *,
        names: Mapping[int, str] | None = None,
    ) -> None:
        self.lock = threading.Lock()
        self._outbox = outbox = Outbox(Out, failed)
        self.send_lock = outbox.lock
        self._chores = Chores(addr, self.lock, broken, names)
        self._handlers = handlers
        self._failed = failed
        self.heard: dict[Addr, float] | None = None
        self.heard_controller = time.monotonic()
        self.every_ms: Callable[[], None] | None = None
        self._next_ms = 0.0
        # the links polled, in order; replaced, never changed in place
        self._links: list[Link] = []
        self._status = MPI.Status()
        self._frames_in = 0
        # what the outbox and the chores do is this wire's, bound once
        self.post = outbox.post
        self.flush = outbox.flush
        self.forget = outbox.forget
        self.drain = outbox.drain
        self.pending_sends = outbox.pending
        self.loop_back = self._chores.loop_back
        self.watch: Callable[[Tick], None] = self._chores.watch
        self.exclusive: Callable[[], AbstractContextManager[None]] = self._chores.exclusive

    # -- hooks and statistics, kept by the outbox and here -------------------

    @property
    def ring(self) -> Callable[[Addr], None] | None:
        """Rings a peer's doorbell (:mod:`.bell`) after a frame that follows a pause."""
        return self._outbox.ring

    @ring.setter
    def ring(self, ring: Callable[[Addr], None] | None) -> None:
        self._outbox.ring = ring

    @property
    def on_hold(self) -> Callable[[], None] | None:
        """Called when a frame is held back for a batch and none was (wake a poller)."""
        return self._outbox.on_hold

    @on_hold.setter
    def on_hold(self, on_hold: Callable[[], None] | None) -> None:
        self._outbox.on_hold = on_hold

    @property
    def frames_in(self) -> int:
        """Frames received and dispatched."""
        return self._frames_in

    @property
    def frames_out(self) -> int:
        """Frames sent, one per frame of a batch."""
        return self._outbox.frames_out

    @property
    def batches_out(self) -> int:
        """BATCH messages sent (each carrying 2..MAX_BATCH frames)."""
        return self._outbox.batches_out

    @property
    def sent_at(self) -> float:
        """When this process last sent a frame (``time.monotonic``)."""
        return self._outbox.sent_at

    @property
    def polls(self) -> int:
        """Polls made so far."""
        return self._outbox.polls

    # -- links and sending -------------------------------------------------

    def add_link(self, link: Link) -> None:
        """Poll ``link`` from now on (lock held)."""
        self._links = [*self._links, link]

    def remove_link(self, link: Link) -> bool:
        """Stop polling ``link`` (lock held); whether it was polled."""
        if link not in self._links:
            return False
        self._links = [k for k in self._links if k is not link]
        return True

    def send(self, link: Link, rank: int, frame: Frame) -> None:
        """Send ``frame`` (no raw buffers) to ``rank`` on ``link``; returns at once."""
        self.post(link, rank, pickle.dumps(frame, protocol=5), NO_BUFFERS)

    # -- receiving ---------------------------------------------------------

    def poll(self, spin: float = 0.0) -> int:
        """Receive what has arrived and dispatch it; returns the number of frames.

        Heartbeats are not counted: they must not keep an idle process out of
        its back-off.  An exception (an MPI error the wire does not know, a
        bug) is reported through ``broken`` and counts as nothing received.

        Args:
            spin: how long the caller would have this call keep probing for a
                frame; only the native wire spins (inside MPI, the GIL
                released), this one probes each link once.
        """
        try:
            return self._poll()
        except Exception:
            self._chores.report()
            return 0

    def _poll(self) -> int:
        outbox, chores = self._outbox, self._chores
        outbox.polls += 1
        if outbox.held:
            outbox.flush()
        got: list[tuple[Addr, Frame, list[Any]]] = []
        failures: list[tuple[list[Addr], str]] | None = None
        settle: list[Callable[[], None]] | None = None
        if chores.local:
            chores.take_local(got)
        outbox.reap_nowait()
        status = self._status
        with self.lock:
            if chores.ticks:
                settle = chores.tick()
            for link in self._links:
                comm = link.comm
                while len(got) < FRAMES_PER_POLL:
                    try:
                        msg = comm.improbe(MPI.ANY_SOURCE, TAG_FRAME, status)
                        if msg is None:
                            # Open MPI often matches a message only at the
                            # probe after the one whose progress pulled it
                            # in: a second probe saves a poll round per leg
                            # (docs/design/transport.md, "Receiving").
                            msg = comm.improbe(MPI.ANY_SOURCE, TAG_FRAME, status)
                    except MPI.Exception as exc:
                        if exc.Get_error_class() not in FAILED_CLASSES:
                            raise
                        if failures is None:
                            failures = []
                        failures.append(acknowledge(link, exc))
                        break
                    if msg is None:
                        break
                    src = status.Get_source()
                    # mpi4py receives and unpickles in one call, cheaper
                    # than Recv into a bytearray, then loads.
                    self._take(got, link, src, msg.recv())
        if settle:
            for fn in settle:
                fn()
        if failures and self._failed is not None:
            for addrs, text in failures:
                self._failed(addrs, text)
        now = time.monotonic()
        if now >= self._next_ms:
            self._next_ms = now + EVERY_MS
            if self.every_ms is not None:
                self.every_ms()
        if not got:
            # A pending one-sided operation or large send counts as traffic:
            # keep polling tight until it completes (both ends of an emulated
            # RMA need it; the reply to a large call follows its last byte).
            return 1 if chores.ticks or outbox.bulk else 0
        return self._deliver(got, now)

    @staticmethod
    def _take(got: list[tuple[Addr, Frame, list[Any]]], link: Link, src: int, frame: Frame) -> None:
        # One received frame into got: its raw buffers follow it on TAG_DATA;
        # a BATCH holds several frames.
        source = link.source(src)
        if frame[1]:
            got.append((source, frame, link.recv_buffers(src, frame[1])))
        elif frame[0] == BATCH:
            got.extend([(source, pickle.loads(data), NO_BUFFERS) for data in frame[2]])
        else:
            got.append((source, frame, NO_BUFFERS))

    def _deliver(self, got: list[tuple[Addr, Frame, list[Any]]], now: float) -> int:
        # Hand frames to their handlers; returns how many count as traffic.
        handlers = self._handlers
        heard = self.heard
        quiet = 0
        for source, frame, buffers in got:
            if heard is not None:
                if source in heard:
                    heard[source] = now
            elif source == CONTROLLER:
                self.heard_controller = now
            kind = frame[0]
            if kind == PING:
                quiet += 1
            try:
                handlers[kind](source, frame, buffers)
            except Exception:
                # A handler bug must not kill the polling thread (and with
                # it the process): report it and keep serving.
                if self._chores.broken is None:
                    raise
                self._chores.handler_failed(kind, source, traceback.format_exc())
        self._frames_in += len(got)
        return len(got) - quiet

