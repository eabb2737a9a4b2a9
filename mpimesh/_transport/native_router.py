"""The router with its hot halves in C: :class:`NativeRouter`.

:class:`~.router.Router` makes every MPI call through mpi4py, which builds a
few Python objects per frame (a Message, a Status, a Request).  The native
part (``mpimesh._native``, bound by :mod:`.native`) makes the same calls on
mpi4py's raw handles, and takes over the two halves every round trip goes
through:

* receiving and dispatching (``_native.Pump``, native/pump.c): probe every
  link, receive, unpickle, expand ``BATCH`` frames, take the raw buffers
  that follow a frame, note who was heard from and call each frame's
  handler, in one call; a poll that spins keeps probing inside MPI with the
  GIL released, so a waiting thread sees its reply as soon as MPI does;
* sending a frame that leaves at once (``_native.Sender``, native/post.c):
  pickle, ``Isend``, test, ring a doorbell after a pause and reap, in one
  call; a frame to be held for a batch comes back to the router's batching.

Everything else stays the router's: frames to this very process, raw buffers,
batches, relayed frames, heartbeats, one-sided operations.  While any of those
is under way (frames to itself waiting, sends or one-sided operations to
complete), :meth:`NativeRouter.poll` takes the router's own poll.

The native part keeps its own copies of a few of the router's fields (who was
heard from, the doorbell, the statistics); the properties below keep the two
in step.  What the native part was worth is in docs/design/transport.md.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from .. import _native
from . import native
from .bell import RING_AFTER
from .frames import BATCH, PING, TAG_FRAME, Addr, Frame
from .mpi import MPI
from .router import _BATCH, _BURST, _FAILED_CLASSES, _MAX_BATCH, _NO_BUFFERS, Failed, Handler, Router, _Link

__all__ = ["NativeRouter"]


class NativeRouter(Router):
    """A :class:`~.router.Router` that receives and sends its frames through the native part.

    Same arguments, same behaviour; construct it through
    :func:`mpimesh._transport.make_router`, which binds the native part first.

    Raises:
        RuntimeError: the native part cannot be used (``native.why_not`` says why).
    """

    _out_type: ClassVar[type[Any]] = _native.Out

    def __init__(
        self,
        addr: Addr,
        handlers: dict[int, Handler],
        failed: Failed | None = None,
        broken: Callable[[str], None] | None = None,
        *,
        names: Mapping[int, str] | None = None,
    ) -> None:
        if not native.bind():
            raise RuntimeError(f"the native frame path cannot be used: {native.why_not}; make a Router instead")
        super().__init__(addr, handlers, failed, broken, names=names)
        on_error = self._handler_failed if broken is not None else None
        self._pump = _native.Pump(
            self.lock, handlers, self._take_buffers, on_error, _NO_BUFFERS, TAG_FRAME, BATCH, PING, _BATCH
        )
        self._sender = _native.Sender(
            self._send_lock, TAG_FRAME, _MAX_BATCH > 1, _BURST, RING_AFTER, tuple(_FAILED_CLASSES)
        )

    def _relink(self) -> None:
        # The links changed (lock held): the pump polls the same links, in
        # the same order (take_buffers and link errors name them by index).
        self._pump.set_links(tuple(k.handle for k in self._links), tuple(k.fixed or k.island for k in self._links))

    # -- the fields the native part keeps ------------------------------------

    @property
    def heard(self) -> dict[Addr, float] | None:
        """Source -> when a frame from it last arrived, for the tracked sources (see :attr:`Router.heard`)."""
        return self._heard

    @heard.setter
    def heard(self, heard: dict[Addr, float] | None) -> None:
        self._heard = heard
        self._pump.heard = heard

    @property
    def heard_controller(self) -> float:
        """When a frame from the controller last arrived (``time.monotonic``), while :attr:`heard` is None."""
        return float(self._pump.heard_controller)

    @heard_controller.setter
    def heard_controller(self, when: float) -> None:
        self._pump.heard_controller = when

    @property
    def ring(self) -> Callable[[Addr], None] | None:
        """Rings a peer's doorbell (:mod:`.bell`) after a frame that follows a pause."""
        return self._ring

    @ring.setter
    def ring(self, ring: Callable[[Addr], None] | None) -> None:
        self._ring = ring
        self._sender.ring = None if ring is None else (lambda out: ring(out.link.source(out.rank)))

    @property
    def frames_in(self) -> int:
        """Frames received and dispatched (statistics)."""
        return self._frames_in + self._pump.frames_in

    @property
    def frames_out(self) -> int:
        """Frames sent, one per frame of a batch (statistics)."""
        return self._frames_out + self._sender.frames_out

    @property
    def sent_at(self) -> float:
        """When this process last sent a frame (``time.monotonic``)."""
        return max(self._sent_at, float(self._sender.sent_at))

    # -- sending -----------------------------------------------------------

    def send(self, dest: Addr, frame: Frame, buffers: Sequence[Any] = ()) -> None:
        """Send ``frame`` (and raw ``buffers``) to ``dest``; returns at once."""
        if not buffers:
            link = self._routes.get(dest[0])
            rank = dest[1]
            if link is None and self._peers:
                # a direct link to a process of another island (see Router.adopt)
                link = self._peers.get(dest)
                rank = 0
            if link is not None and dest != self.addr:
                out = link.outs.get(rank)
                if out is None:
                    # setdefault: atomic, so that two threads meeting a new
                    # destination share one state (this is outside the lock)
                    out = link.outs.setdefault(rank, _native.Out(link, rank))
                try:
                    data = self._sender.post(out, frame, self._polls)
                except MPI.Exception as exc:
                    self._send_failed(link, rank, exc)
                    return
                if data is not None:
                    self._post(link, rank, data, _NO_BUFFERS)  # to be held back for a batch
                return
        super().send(dest, frame, buffers)

    def _start(self, link: _Link, rank: int, data: bytes) -> None:
        # Router._start through the native call (send lock held).
        handle = _native.wire_isend(link.handle, data, rank, TAG_FRAME)
        if handle is not None:
            self._sends.append((MPI.Request.fromhandle(handle), data, False))

    def _in_flight(self) -> int:
        return len(self._sends) + self._sender.pending

    def _reap(self) -> None:
        if self._sender.pending:
            self._sender.reap()
        super()._reap()

    # -- receiving ---------------------------------------------------------

    def poll(self, spin: float = 0.0) -> int:
        """Receive what has arrived and dispatch it; returns the number of frames.

        As :meth:`Router.poll`, through the pump; a poll that spins keeps
        probing up to ``spin`` seconds (the GIL released) and returns with
        the first frame.  While frames to this process, sends or one-sided
        operations are pending, the router's own poll, which handles them.
        """
        if self._wanted:
            return 0  # another thread waits for the lock (exclusive())
        if self._local or self._sends or self._ticks or self._sender.pending:
            return super().poll(spin)
        try:
            self._polls += 1
            if self._held:
                self.flush()
            # The links the pump's error indices refer to: a handler (a
            # death notice) may drop a link before they are read.  Links
            # change only under the lock, and the list is replaced, never
            # changed in place.
            links = self._links
            handled = self._pump.poll(spin)
            if not isinstance(handled, int):
                handled, errors = handled
                self._link_errors(errors, links)
            now = time.monotonic()
            if now >= self._next_ms:
                self._every_ms(now)
            if not handled and self._bulk:
                return 1
            return handled
        except Exception:
            self._report()
            return 0

    def _link_errors(self, errors: list[tuple[int, int]], links: list[_Link]) -> None:
        # The pump's probe failed on these links: a peer died (ULFM) or worse.
        failures = []
        with self.lock:
            for index, code in errors:
                exc = MPI.Exception(code)
                if exc.Get_error_class() not in _FAILED_CLASSES:
                    raise exc
                failures.append(self._acknowledge(links[index], exc))
        if self._failed is not None:
            for addrs, text in failures:
                self._failed(addrs, text)

    def _take_buffers(self, index: int, src: int, sizes: tuple[Any, ...]) -> list[Any]:
        # The pump's take_buffers (lock held): the raw buffers that follow a frame.
        return self._recv_buffers(self._links[index].comm, src, sizes)

    def _handler_failed(self, kind: int, source: Addr, exc: BaseException) -> None:
        # The pump's on_error: a handler raised; report it and keep serving (see Router._deliver).
        text = "".join(traceback.format_exception(exc))
        assert self._broken is not None
        self._broken(f"error handling {self._names.get(kind, kind)} from {source}:\n{text}")
