"""The native wire: the frame path's hot MPI calls in C, through ``mpimesh._native``.

The mpi4py wire (:mod:`.wire_mpi4py`) builds a few Python objects per frame
(a Message, a Status, a Request).  The native part (``mpimesh._native``,
bound by :mod:`.native`) makes the same calls on mpi4py's raw handles, and
takes the two halves every round trip goes through:

* receiving and dispatching (``_native.Pump``, native/pump.c): probe every
  link, receive, unpickle, expand ``BATCH`` frames, take the raw buffers
  that follow a frame, note who was heard from and call each frame's
  handler, in one call; a poll that spins keeps probing inside MPI with the
  GIL released, so a waiting thread sees its reply as soon as MPI does;
* sending a frame that leaves at once (``_native.Sender``, native/post.c):
  pickle, ``Isend``, test, ring a doorbell after a pause and reap, in one
  call; a frame to be held for a batch comes back, for the outbox.

The rest is Python, in the outbox (:mod:`.outbox`: batches, raw buffers,
relayed frames, heartbeats) and the chores (:mod:`.chores`: frames to this
very process, one-sided operations).  While any of those is pending, a poll
does not spin: it does them, then probes once.  Each field lives in one
place: who was heard from in the pump, the doorbell in the outbox and the
sender, the statistics split between the C halves and the Python ones.
What the native part was worth is in docs/design/transport.md.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from .. import _native
from . import native
from .bell import RING_AFTER
from .chores import Chores
from .frames import BATCH, CONTROLLER, PING, TAG_FRAME, Addr, Frame
from .links import (
    BURST,
    EVERY_MS,
    FAILED_CLASSES,
    FRAMES_PER_POLL,
    MAX_BATCH,
    NO_BUFFERS,
    Failed,
    Handler,
    Link,
    Tick,
    acknowledge,
)
from .mpi import MPI
from .outbox import Outbox

__all__ = ["NativeWire"]


class NativeWire:
    """Receives, dispatches and sends frames through the native part (a :class:`~.wire.Wire`).

    Same arguments as :class:`~.wire_mpi4py.Mpi4pyWire`, same behaviour;
    :func:`mpimesh._transport.make_router` binds the native part first.

    Raises:
        RuntimeError: the native part cannot be used (``native.why_not`` says why).
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
        if not native.bind():
            raise RuntimeError(f"the native frame path cannot be used: {native.why_not}; make an Mpi4pyWire instead")
        # Native locks: the pump and Sender.post take them with a C call (native/lock.c).
        self.lock = _native.Lock()
        self.send_lock = _native.Lock()
        self._sender = sender = _native.Sender(
            self.send_lock, TAG_FRAME, MAX_BATCH > 1, BURST, RING_AFTER, tuple(FAILED_CLASSES)
        )
        self._outbox = outbox = Outbox(_native.Out, failed, _native.wire_isend, sender, self.send_lock)
        self._chores = Chores(addr, self.lock, broken, names)
        on_error = self._handler_failed if broken is not None else None
        self._pump = _native.Pump(
            self.lock, handlers, self._take_buffers, on_error, NO_BUFFERS, TAG_FRAME, BATCH, PING, FRAMES_PER_POLL
        )
        self._addr = addr
        self._handlers = handlers
        self._failed = failed
        self.every_ms: Callable[[], None] | None = None
        self._next_ms = 0.0
        # the links polled, in the pump's order (its buffer and error indices
        # name them); replaced, never changed in place
        self._links: list[Link] = []
        # frames this process sent itself, dispatched here rather than by the pump
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

    # -- hooks and statistics, kept by the native halves and the Python ones --

    @property
    def heard(self) -> dict[Addr, float] | None:
        """Source -> when a frame from it last arrived, for the tracked sources (kept by the pump)."""
        heard: dict[Addr, float] | None = self._pump.heard
        return heard

    @heard.setter
    def heard(self, heard: dict[Addr, float] | None) -> None:
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
        """Rings a peer's doorbell (:mod:`.bell`) after a frame that follows a pause, from either sender."""
        return self._outbox.ring

    @ring.setter
    def ring(self, ring: Callable[[Addr], None] | None) -> None:
        self._outbox.ring = ring
        self._sender.ring = None if ring is None else (lambda out: ring(out.link.source(out.rank)))

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
        return self._frames_in + int(self._pump.frames_in)

    @property
    def frames_out(self) -> int:
        """Frames sent, one per frame of a batch."""
        return self._outbox.frames_out + int(self._sender.frames_out)

    @property
    def batches_out(self) -> int:
        """BATCH messages sent (each carrying 2..MAX_BATCH frames)."""
        return self._outbox.batches_out

    @property
    def sent_at(self) -> float:
        """When this process last sent a frame (``time.monotonic``)."""
        return max(self._outbox.sent_at, float(self._sender.sent_at))

    @property
    def polls(self) -> int:
        """Polls made so far."""
        return self._outbox.polls

    # -- links and sending -------------------------------------------------

    def add_link(self, link: Link) -> None:
        """Poll ``link`` from now on (lock held)."""
        self._set_links([*self._links, link])

    def remove_link(self, link: Link) -> bool:
        """Stop polling ``link`` (lock held); whether it was polled."""
        if link not in self._links:
            return False
        self._set_links([k for k in self._links if k is not link])
        return True

    def _set_links(self, links: list[Link]) -> None:
        # The pump polls the same links, in the same order.
        self._links = links
        self._pump.set_links(tuple(k.handle for k in links), tuple(k.fixed or k.island for k in links))

    def send(self, link: Link, rank: int, frame: Frame) -> None:
        """Send ``frame`` (no raw buffers) to ``rank`` on ``link``; returns at once."""
        out = link.outs.get(rank)
        if out is None:
            # setdefault: atomic, so that two threads meeting a new
            # destination share one state (this is outside the lock)
            out = link.outs.setdefault(rank, _native.Out(link, rank))
        outbox = self._outbox
        try:
            data = self._sender.post(out, frame, outbox.polls)
        except MPI.Exception as exc:
            outbox.send_failed(link, rank, exc)
            return
        if data is not None:
            self.post(link, rank, data, NO_BUFFERS)  # to be held back for a batch

    # -- call sites run by the pump (native/site.c) --------------------------

    def _serve_sites(self, kind: int) -> dict[int, Any]:
        """The table of call sites the pump offers their ``kind`` (SITE_CALL) frames to first.

        Site number -> ``_native.Site``, filled and emptied by the caller
        (``_core.actors.ActorHost``); a site that declines a frame leaves
        it to the frame's handler.
        """
        sites: dict[int, Any] | None = self._pump.sites
        if sites is None:
            sites = self._pump.sites = {}
            self._pump.site_kind = kind
        return sites

    def _site_way(self, link: Link, rank: int) -> dict[str, Any]:
        """The keyword arguments a ``_native.Site`` sends with to ``rank`` on ``link``, as :meth:`send` does.

        ``send_failed(exc)`` raises ConnectionError when the peer has failed.
        """
        link.outs.setdefault(rank, _native.Out(link, rank))
        outbox = self._outbox

        def hold(data: bytes) -> None:
            self.post(link, rank, data, NO_BUFFERS)

        def send_failed(exc: BaseException) -> None:
            if not isinstance(exc, MPI.Exception):
                raise exc
            outbox.send_failed(link, rank, exc)

        return {"outs": link.outs, "sender": self._sender, "outbox": outbox, "hold": hold, "send_failed": send_failed}

    # -- the controller's call sites (native/call.c) ---------------------------

    def _call_site(self, link: Link, dest: int, failed: Callable[[Any, int, str], None], **fields: Any) -> Any:
        """A call site's sender (``_native.CallSite``, native/call.c): frames to ``dest`` on ``link``, as :meth:`send`.

        ``failed(future, port id, report)`` is called when a send finds its
        peer failed (``Outbox.send_failed`` raised ConnectionError); the
        other ``fields`` are the Site's.  None when the native part predates it.
        """
        if not hasattr(_native, "CallSite"):
            return None
        out = link.outs.get(dest)
        if out is None:
            out = link.outs.setdefault(dest, _native.Out(link, dest))
        outbox = self._outbox

        def hold(data: bytes) -> None:
            self.post(link, dest, data, NO_BUFFERS)

        def send_failed(fut: Any, port_id: int, exc: BaseException) -> None:
            if not isinstance(exc, MPI.Exception):
                raise exc
            try:
                outbox.send_failed(link, dest, exc)
            except ConnectionError as err:
                failed(fut, port_id, str(err))

        return _native.CallSite(self._sender, out, outbox, hold, send_failed, **fields)

    def _spinner(self, progress: Any, token: Any, leaders: list[object], spin: float, chunk: float,
                 yield_every: int) -> Any:
        """``Progress.wait``'s spin for a leader in C (a ``_native.Spin``, native/call.c), polling ``progress._poll``.

        Its ``wait(future)`` spins for one future, its ``serve(lane)`` is a sync
        actor's idle wait.  None when the native part predates it.
        """
        if not hasattr(_native, "Spin"):
            return None
        main = threading.main_thread().ident or 0
        return _native.Spin(progress, token, leaders, spin, chunk, yield_every, main)

    # -- receiving ---------------------------------------------------------

    def poll(self, spin: float = 0.0) -> int:
        """Receive what has arrived and dispatch it; returns the number of frames, heartbeats not counted.

        A poll that spins keeps probing up to ``spin`` seconds (the GIL
        released) and returns with the first frame.  While frames to this
        process, sends or one-sided operations are pending, it does those
        and probes once, without spinning.  An exception is reported through
        ``broken`` and counts as nothing received.
        """
        chores = self._chores
        if chores.wanted:
            return 0  # another thread waits for the lock (exclusive())
        outbox = self._outbox
        try:
            outbox.polls += 1
            if outbox.held:
                outbox.flush()
            handled = 0
            if chores.local or chores.ticks or outbox.sends or self._sender.pending:
                handled = self._chores_due()
                spin = 0.0
            # The millisecond tick before the pump, not after: what follows
            # the pump is on the path of the frame it received (B1's round
            # trip runs through it on both sides).
            now = time.monotonic()
            if now >= self._next_ms:
                self._next_ms = now + EVERY_MS
                if self.every_ms is not None:
                    self.every_ms()
            # The links the pump's error indices refer to: a handler (a
            # death notice) may drop a link before they are read.  Links
            # change only under the lock, and the list is replaced, never
            # changed in place.
            links = self._links
            received = self._pump.poll(spin)
            if not isinstance(received, int):
                received, errors = received
                self._link_errors(errors, links)
            handled += received
            if not handled and (outbox.bulk or chores.ticks):
                # A large send or one-sided operation pending counts as
                # traffic: keep polling tight until it completes.
                return 1
            return handled
        except Exception:
            chores.report()
            return 0

    def _chores_due(self) -> int:
        # Frames this process sent itself, sends to reap, one-sided
        # operations to test; returns the frames dispatched, heartbeats not counted.
        chores = self._chores
        self._outbox.reap_nowait()
        if chores.ticks:
            with self.lock:
                settle = chores.tick()
            for fn in settle:
                fn()
        if not chores.local:
            return 0
        got: list[tuple[Addr, Frame, list[Any]]] = []
        chores.take_local(got)
        now = time.monotonic()
        heard = self._pump.heard
        if heard is not None:
            if self._addr in heard:
                heard[self._addr] = now
        elif self._addr == CONTROLLER:
            self._pump.heard_controller = now
        handlers, quiet = self._handlers, 0
        for source, frame, buffers in got:
            kind = frame[0]
            if kind == PING:
                quiet += 1
            try:
                handlers[kind](source, frame, buffers)
            except Exception:
                if chores.broken is None:
                    raise
                chores.handler_failed(kind, source, traceback.format_exc())
        self._frames_in += len(got)
        return len(got) - quiet

    def _link_errors(self, errors: list[tuple[int, int]], links: list[Link]) -> None:
        # The pump's probe failed on these links: a peer died (ULFM) or worse.
        failures = []
        with self.lock:
            for index, code in errors:
                exc = MPI.Exception(code)
                if exc.Get_error_class() not in FAILED_CLASSES:
                    raise exc
                failures.append(acknowledge(links[index], exc))
        if self._failed is not None:
            for addrs, text in failures:
                self._failed(addrs, text)

    def _take_buffers(self, index: int, src: int, sizes: tuple[Any, ...]) -> list[Any]:
        # The pump's take_buffers (lock held): the raw buffers that follow a frame.
        return self._links[index].recv_buffers(src, sizes)

    def _handler_failed(self, kind: int, source: Addr, exc: BaseException) -> None:
        # The pump's on_error: a handler raised; report it and keep serving.
        self._chores.handler_failed(kind, source, "".join(traceback.format_exception(exc)))
