"""The send half both wires keep in Python: batching, raw buffers, sends in flight.

Small frames to one process in a burst are coalesced.  A frame leaves at once
unless it follows another to the same process within ``BURST`` seconds with
no poll in between (a caller issuing calls without waiting, an actor
answering a backlog); such frames wait, up to ``MAX_BATCH``, and leave
together as one ``BATCH`` message at the next poll of any thread of this
process, which every waiting thread does at once.  A call followed by a wait
(``call_one().get()``) is never held back.  An MPI message costs several
times what pickling a small frame costs, so without batching a pipelined
caller and an actor answering a backlog spend most of their time in MPI.

Sends are non-blocking (``Isend``): two ranks flooding each other with
blocking sends while neither receives would deadlock.  A send that does not
complete at once is kept, with the bytes it reads, until MPI is done with
them.  Raw buffers (the data plane's out-of-band tensors and arrays) are sent
from the caller's memory without a copy, right after their frame.

The mpi4py wire sends every frame through an :class:`Outbox`; the native wire
sends a frame that leaves at once in C (``_native.Sender``) and everything
else (held frames, raw buffers, relayed frames, heartbeats) through one.
"""

from __future__ import annotations

import pickle
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from .bell import RING_AFTER
from .buffers import pieces
from .frames import CONTROLLER, TAG_DATA, TAG_FRAME, Addr, batch
from .links import BURST, FAILED_CLASSES, MAX_BATCH, Failed, Link
from .mpi import MPI

__all__ = ["Outbox"]

# Raw buffers from this size on keep the sender polling tight until they are sent.
_BULK = 1 << 20

_monotonic = time.monotonic


class _Sender(Protocol):
    """Another sender whose sends in flight count with an outbox's (the native wire's ``_native.Sender``)."""

    @property
    def pending(self) -> int:
        """Sends in flight."""

    def reap(self) -> int:
        """Drop the completed sends; returns those still in flight."""


class Outbox:
    """Sends frames, holds bursts back for batches, and keeps the sends in flight.

    Args:
        out_type: one destination's coalescing state, made as ``out_type(link, rank)``.
        failed: called as ``failed(addrs, text)`` when a send to a direct link
            finds its peer failed.
        isend: ``isend(handle, data, rank, tag)`` -> ``None`` (sent) or a request
            handle, to start a frame's send on raw handles; ``None``: through mpi4py.
        also: another sender whose sends in flight are reaped and counted with these.
        lock: the send lock, when ``also`` holds it too (else a new one).
    """

    def __init__(self, out_type: Callable[[Link, int], Any], failed: Failed | None = None,
                 isend: Callable[[int, bytes, int, int], int | None] | None = None,
                 also: _Sender | None = None, lock: threading.Lock | None = None) -> None:
        #: held for every send
        self.lock = lock if lock is not None else threading.Lock()
        self.out_type = out_type
        self._failed = failed
        self._isend = isend
        self._also = also
        #: sends in flight: (request, the bytes it reads, whether it is bulk)
        self.sends: deque[tuple[MPI.Request, Any, bool]] = deque()
        #: large sends in flight: the answer to them comes soon, keep polling tight
        self.bulk = 0
        #: destinations (their coalescing states) with frames held back for a batch
        self.held: list[Any] = []
        #: polls so far; a frame sent to where one went since the last poll may be held
        self.polls = 0
        #: statistics: frames sent (one per frame of a batch), BATCH messages sent
        self.frames_out = 0
        self.batches_out = 0
        #: when this process last sent a frame (``time.monotonic``)
        self.sent_at = 0.0
        #: called when a frame is held back for a batch and none was (wake a poller)
        self.on_hold: Callable[[], None] | None = None
        #: rings a peer's doorbell (:mod:`.bell`) after a frame that follows a pause
        self.ring: Callable[[Addr], None] | None = None

    def post(self, link: Link, rank: int, data: bytes, buffers: Sequence[Any], quiet: bool = False,
             unless: Callable[[], bool] | None = None) -> bool:
        """Send or hold one pickled frame (and its raw ``buffers``) for ``rank`` on ``link``.

        Args:
            link: the link to send on.
            rank: the destination's rank on it.
            data: the pickled frame.
            buffers: its raw buffers, sent right after it.
            quiet: a heartbeat: it rings no doorbell and counts as no send
                (see :meth:`~.router.Router.send_quiet`).
            unless: checked under the send lock: when it says so, nothing is
                sent (a relayed frame must not follow its sender's MARK).

        Returns:
            Whether the frame was sent or held (False only through ``unless``).

        Raises:
            ConnectionError: the process at ``rank`` has failed.
        """
        now = _monotonic()
        lock = self.lock
        lock.acquire()  # not `with`: cheaper on every frame (docs/design/transport.md, "The locks")
        try:
            if unless is not None and unless():
                return False
            self.frames_out += 1
            if not quiet:
                self.sent_at = now
            out = link.outs.get(rank)
            if out is None:
                out = link.outs.setdefault(rank, self.out_type(link, rank))
            if (out.frames or (out.polls == self.polls and now - out.last < BURST)) and self._hold(
                out, data, buffers, now
            ):
                return True
            if quiet:
                paused = False
            else:
                paused = now - out.last > RING_AFTER
                out.last = now
                out.polls = self.polls
            if buffers:
                self._start_with_buffers(link.comm, rank, data, buffers)
            else:
                self._start(link, rank, data)
            if paused and self.ring is not None:
                self.ring(link.source(rank))
            if self.sends:
                self._reap()
        except MPI.Exception as exc:
            self.send_failed(link, rank, exc)
        finally:
            lock.release()
        return True

    def send_failed(self, link: Link, rank: int, exc: MPI.Exception) -> None:
        """A send found its peer failed: raise ConnectionError, or report a direct link's peer as failed.

        On a direct link to another island the frame is dropped, as a
        relayed one would be, and the failure reported as a failed probe's
        is: the controller's report of the death (pid, host, cause) fails
        what waits on the peer, as it did before the switch.

        Raises:
            ConnectionError: the process at ``rank`` has failed.
            MPI.Exception: ``exc``, when it is not a peer's failure.
        """
        if exc.Get_error_class() not in FAILED_CLASSES:
            raise exc
        peer = link.fixed
        if peer is not None and peer != CONTROLLER and self._failed is not None:
            self._failed([peer], exc.Get_error_string())
            return
        raise ConnectionError(f"process {link.source(rank)} has failed: {exc.Get_error_string()}") from None

    def _hold(self, out: Any, data: bytes, buffers: Sequence[Any], now: float) -> bool:
        # A frame in a burst to one process (send lock held): hold it for a
        # batch and return True, or send what is held and return False.
        if out.frames:
            if not buffers:
                out.last = now
                out.frames.append(data)
                if len(out.frames) >= MAX_BATCH:
                    self._release(out)
                return True
            self._release(out)  # frames leave in order
            return False
        if buffers or MAX_BATCH <= 1:
            return False
        out.last = now
        out.frames.append(data)
        self.held.append(out)
        if self.on_hold is not None:
            self.on_hold()
        return True

    def _start(self, link: Link, rank: int, data: bytes) -> None:
        # Send one pickled frame (send lock held); a send that does not
        # complete at once (most small ones do: eager protocol) is kept with
        # its bytes until MPI is done with them.
        isend = self._isend
        if isend is None:
            req = link.comm.Isend(data, rank, TAG_FRAME)
            if req.Test():
                return
        else:
            handle = isend(link.handle, data, rank, TAG_FRAME)
            if handle is None:
                return
            req = MPI.Request.fromhandle(handle)
        self.sends.append((req, data, False))

    def _start_with_buffers(self, comm: MPI.Comm, rank: int, data: bytes, buffers: Sequence[Any]) -> None:
        # A frame and its raw buffers, posted together (send lock held), so
        # that the buffers are the next messages from this process on TAG_DATA.
        sends = self.sends
        sends.append((comm.Isend(data, rank, TAG_FRAME), data, False))
        for buf in buffers:
            view = memoryview(buf).cast("B")
            bulk = view.nbytes >= _BULK
            for start, stop in pieces(view.nbytes):
                self.bulk += bulk
                sends.append((comm.Isend([view[start:stop], MPI.BYTE], rank, TAG_DATA), buf, bulk))

    def _release(self, out: Any) -> None:
        # Send the frames held for one process as one message (send lock held).
        frames = out.frames
        out.frames = []
        if len(frames) == 1:
            data = frames[0]
        else:
            data = pickle.dumps(batch(frames), protocol=5)
            self.batches_out += 1
        self._start(out.link, out.rank, data)

    def flush(self) -> None:
        """Send every batch held back; a failed peer's batch is dropped (liveness reports it)."""
        if not self.held:
            return
        with self.lock:
            held, self.held = self.held, []
            for out in held:
                if not out.frames:
                    continue
                try:
                    self._release(out)
                except MPI.Exception as exc:
                    if exc.Get_error_class() not in FAILED_CLASSES:
                        raise

    def forget(self, link: Link) -> None:
        """Drop the frames held for ``link``'s processes: they go nowhere now (the link is gone)."""
        with self.lock:
            for out in link.outs.values():
                out.frames.clear()
            link.outs.clear()

    def in_flight(self) -> int:
        """Sends not yet complete (read without the send lock: a hint, except under it)."""
        if self._also is not None:
            return len(self.sends) + self._also.pending
        return len(self.sends)

    def drain(self, bound: float) -> bool:
        """Wait until every send posted so far has completed, at most ``bound`` seconds; whether they have.

        A send completes only inside MPI calls of this process, and the first
        frame on a new TCP link (a direct link to another island) needs
        several: one posted just before a blocking call that does not drive
        it (``MPI_Comm_disconnect``) would wait for that call to return.
        """
        end = _monotonic() + bound
        while True:
            with self.lock:
                self._reap()
                if not self.in_flight():
                    return True
            if _monotonic() >= end:
                return False
            time.sleep(1e-4)

    def pending(self) -> int:
        """Sends not yet complete (batches held back are sent first)."""
        self.flush()
        with self.lock:
            self._reap()
            return self.in_flight()

    def reap_nowait(self) -> None:
        """Free completed sends, unless a thread is sending (it does it itself)."""
        if self.in_flight() and self.lock.acquire(blocking=False):
            try:
                self._reap()
            finally:
                self.lock.release()

    def _reap(self) -> None:
        # Drop the completed sends at the front (send lock held).
        also = self._also
        if also is not None and also.pending:
            also.reap()
        sends = self.sends
        while sends:
            try:
                if not sends[0][0].Test():
                    return
            except MPI.Exception as exc:
                if exc.Get_error_class() not in FAILED_CLASSES:
                    raise
            self.bulk -= sends.popleft()[2]
