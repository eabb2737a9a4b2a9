"""Direct links between processes of different islands, brokered by the controller.

A process reaches its own island and the controller directly; a frame to a
process of another island is relayed by the controller (``FORWARD``), which
costs the controller a receive and a send per frame.  The first time the
controller relays a frame between two processes of different islands, it
brokers a direct link between them (issue #16 item 4):

1. controller -> the sender ("acceptor"): ``LINK open``; the acceptor opens a
   port (``MPI_Open_port``), tells the controller (``LINK port``) and waits in
   ``MPI_Comm_accept`` on a thread of its own;
2. controller -> the receiver ("connector"): ``LINK connect`` with the port;
   it calls ``MPI_Comm_connect`` on a thread of its own;
3. each side, once its call returns, adopts the link (``Router.adopt``): the
   route changes, then a ``MARK`` leaves on the relay path; each polls the
   link only once the other's MARK has come, so the frames of each pair
   arrive in the order sent across the switch; each tells the controller
   ``LINK up``.

Frames keep flowing on the relay while a link is being made, so a slow or
failed connect delays nothing: the pair stays on the relay.  A connect that
fails (``LINK failed``) or a connector that dies leaves the acceptor waiting
in ``MPI_Comm_accept``, which has no timeout: the controller ends that wait
by connecting to the port itself; the acceptor sees that the process it got
is the controller (:meth:`.Router.is_controller`) and disconnects.  A process that leaves tells its direct peers (``LINK
drop``, on the link) so that they stop polling it; a peer that dies is
dropped with the death notice (:meth:`Peers.dead`), and frames to it fail as
frames to a dead process of the own island do.

The figures (connect times, what a dead peer does to a pending call) are in
docs/design/transport.md, "Direct links between islands".
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from ..config import settings
from .frames import CONTROLLER, Addr, Frame, link
from .mpi import MPI, dynamic, library
from .router import Router

__all__ = ["DISCONNECT_BOUND", "LinkStatistics", "Peers", "enabled"]

#: Seconds a leaving process waits for its direct peers to disconnect.
DISCONNECT_BOUND = 5.0


def enabled() -> bool:
    """Whether processes of different islands get direct links (``MPIMESH_ISLAND_LINKS``)."""
    choice = settings.island_links
    return choice == "always" or (choice == "auto" and library().startswith("Open MPI"))


@dataclass(frozen=True)
class LinkStatistics:
    """Counters of the direct links between islands (:meth:`Peers.statistics`)."""

    #: frames this process relayed for others (the controller's FORWARDs)
    relayed: int
    #: direct links this process made (both ends count one)
    links: int
    #: links that could not be made (the pair stays on the relay)
    failed: int
    #: calls to MPI_Comm_accept or MPI_Comm_connect of this process still waiting
    pending: int


class _Attempt:
    """The controller's record of one link being made."""

    __slots__ = ("acceptor", "connector", "port", "up", "woken")

    def __init__(self, acceptor: Addr, connector: Addr) -> None:
        self.acceptor = acceptor
        self.connector = connector
        self.port: str | None = None
        #: the ends that said ``up``
        self.up: set[Addr] = set()
        #: the controller connected to the port to end the accept (once: a second connect would wait for ever)
        self.woken = False


class Peers:
    """This process's part in making direct links: the controller brokers, workers accept and connect.

    Args:
        router: this process's router.
        on: make links at all (else the controller's relay serves every pair).
    """

    def __init__(self, router: Router, on: bool) -> None:
        self._router = router
        self.addr = router.addr
        self.on = on
        self._lock = threading.Lock()
        # controller: (lower address, higher address) -> the attempt
        self._pairs: dict[tuple[Addr, Addr], _Attempt] = {}
        # processes known dead or gone: no link is adopted to them
        self._gone: set[Addr] = set()
        self._links = 0
        self._failed = 0
        # workers: peer -> its accept and connect calls still waiting
        self._under_way: dict[Addr, int] = {}
        # leaving: no new link is started; left: the drops went out, a link that comes up now is dropped at once
        self._leaving = self._left = False
        self._settled = threading.Condition(self._lock)

    # --- the controller: brokering -----------------------------------------------------------

    def relayed(self, src: Addr, dest: Addr) -> None:
        """The controller relayed a frame from ``src`` to ``dest``: broker their link, the first time."""
        if not self.on or src == CONTROLLER or dest == CONTROLLER or src[0] == dest[0]:
            return
        pair = (src, dest) if src < dest else (dest, src)
        if pair in self._pairs:
            return
        with self._lock:
            if pair in self._pairs or src in self._gone or dest in self._gone:
                return
            self._pairs[pair] = _Attempt(src, dest)
        self._send(src, link("open", dest, None))

    def _wake(self, attempt: _Attempt) -> None:
        # End the acceptor's pending Accept by connecting to its port (thread of its own).
        port = attempt.port
        with self._lock:
            if (port is None or attempt.woken or attempt.acceptor in self._gone
                    or attempt.up & {attempt.acceptor, attempt.connector}):
                return  # no accept waits, or it ends otherwise
            attempt.woken = True
        def wake() -> None:
            try:
                with dynamic:  # not beside a spawn (see _transport.mpi)
                    MPI.COMM_SELF.Connect(port).Disconnect()
            except MPI.Exception:
                pass  # the acceptor died meanwhile: nothing waits

        threading.Thread(target=wake, name="mpimesh-link-wake", daemon=True).start()

    # --- workers: accepting and connecting ---------------------------------------------------

    def _accept(self, peer: Addr) -> None:
        # The acceptor's thread: open a port, tell the controller, wait for the peer.
        try:
            port = MPI.Open_port()
        except MPI.Exception as exc:
            self._give_up(peer, f"MPI_Open_port failed: {exc.Get_error_string()}")
            return
        self._send(CONTROLLER, link("port", peer, port))
        try:
            # Blocking, without the router's locks: other threads keep using
            # MPI meanwhile (MPI_THREAD_MULTIPLE; measured, see the module doc).
            comm = MPI.COMM_SELF.Accept(port)
        except MPI.Exception as exc:
            self._give_up(peer, f"MPI_Comm_accept failed: {exc.Get_error_string()}")
            return
        finally:
            try:
                MPI.Close_port(port)
            except MPI.Exception:
                pass
        if self._router.is_controller(comm):
            # The controller's connect, which ended the wait: the peer failed or died.
            comm.Disconnect()
            return
        self._adopt(peer, comm)

    def _connect(self, peer: Addr, port: str) -> None:
        # The connector's thread.
        try:
            comm = MPI.COMM_SELF.Connect(port)
        except MPI.Exception as exc:
            self._give_up(peer, f"MPI_Comm_connect failed: {exc.Get_error_string()}")
            return
        self._adopt(peer, comm)

    def _adopt(self, peer: Addr, comm: MPI.Intercomm) -> None:
        if peer in self._gone:
            return  # died while connecting: the link is never used
        try:
            self._router.adopt(peer, comm)
        except ConnectionError:
            return  # no relay left (this process is leaving)
        with self._lock:
            self._links += 1
            late = self._left
        self._send(CONTROLLER, link("up", peer, None))
        if late:
            # Up after leave() dropped the others (its wait for this call ran out): drop it too, or the
            # peer's MPI_Finalize waits for this end.
            self._drop([peer], time.monotonic() + DISCONNECT_BOUND)

    def _give_up(self, peer: Addr, why: str) -> None:
        with self._lock:
            self._failed += 1
        self._send(CONTROLLER, link("failed", peer, why))

    def _start(self, target: Any, peer: Addr, *args: Any) -> None:
        # A thread per call: MPI_Comm_accept and MPI_Comm_connect block, with no timeout.
        def run() -> None:
            try:
                target(peer, *args)
            finally:
                with self._lock:
                    self._under_way[peer] -= 1
                    if not self._under_way[peer]:
                        del self._under_way[peer]
                    self._settled.notify_all()

        with self._lock:
            self._under_way[peer] = self._under_way.get(peer, 0) + 1
        threading.Thread(target=run, name="mpimesh-link", daemon=True).start()

    # --- frames -------------------------------------------------------------------------------

    def on_link(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """LINK: a step of making a direct link (see the module's docstring)."""
        _, _, op, peer, port = frame
        if op in ("open", "connect") and self._leaving:
            # Too late for a link: the pair stays on the relay; the controller ends the acceptor's wait.
            self._give_up(peer, f"process {self.addr[0]}.{self.addr[1]} is leaving")
        elif op == "open":
            self._start(self._accept, peer)
        elif op == "connect":
            self._start(self._connect, peer, port)
        elif op == "drop":
            # It leaves: its last frame on the link was this, and it disconnects.
            comm = self._router.drop_peer(src)
            if comm is not None:
                self._disconnect(comm)
        else:
            self._broker(src, op, peer, port)

    def _broker(self, src: Addr, op: str, peer: Addr, port: str | None) -> None:
        # The controller's steps: a port to pass on, an end that is up, a failure.
        attempt = self._pairs.get((src, peer) if src < peer else (peer, src))
        if attempt is None:
            return
        if op == "port":
            attempt.port = port
            if attempt.connector in self._gone or not self._send(attempt.connector,
                                                                  link("connect", attempt.acceptor, port)):
                self._wake(attempt)
        elif op == "up":
            attempt.up.add(src)
            if len(attempt.up) == 2:
                with self._lock:
                    self._links += 1
        elif op == "failed":
            with self._lock:
                self._failed += 1
            if src == attempt.connector:
                self._wake(attempt)

    def on_mark(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """MARK: ``sender``'s next frames come on its direct link: poll it."""
        _, _, sender = frame
        self._router.marked(sender)

    # --- deaths and leaving -------------------------------------------------------------------

    def dead(self, addr: Addr) -> None:
        """``addr`` has died: drop its link; the controller ends an Accept that waits for it."""
        self.gone(addr)
        self._router.drop_peer(addr)

    def gone(self, addr: Addr) -> None:
        """``addr`` died or left: no link to it now; the controller ends an accept that waits for it."""
        with self._lock:
            self._gone.add(addr)
            self._settled.notify_all()
        for attempt in list(self._pairs.values()):
            if attempt.connector == addr:
                self._wake(attempt)

    def leave(self) -> None:
        """This process leaves: tell each direct peer (on the link), stop using the links, disconnect them.

        Blocks up to :data:`DISCONNECT_BOUND` seconds.  Each peer disconnects
        its end when the ``drop`` comes (``MPI_Comm_disconnect`` is
        collective); a link left connected makes ``MPI_Finalize`` wait for
        the peer's own, or crash (Open MPI's ``ompi_dpm_dyn_finalize``).
        """
        end = time.monotonic() + DISCONNECT_BOUND
        with self._lock:
            # Links under way finish first (a connect, or an accept the controller ends if the peer cannot
            # come), so that each that comes up is dropped with the rest.  A call whose peer died can wait
            # for ever: those are not waited for.
            self._leaving = True
            self._settled.wait_for(lambda: self._gone.issuperset(self._under_way), DISCONNECT_BOUND / 2)
            self._left = True
        self._drop(self._router.peers(), end)

    def _drop(self, peers: list[Addr], end: float) -> None:
        # Tell each of ``peers`` on its link, stop using the links, disconnect them (bounded by ``end``).
        comms = []
        for peer in peers:
            try:
                self._router.send(peer, link("drop", self.addr, None))
                self._router.flush()  # before the link is dropped with what it holds
            except ConnectionError:
                pass
        # The drops must be out before the disconnects start: a peer disconnects on its drop, and a drop
        # that is the first frame on its TCP link waits for this process's MPI calls, which the
        # disconnect does not make.  Without this the disconnect waited out DISCONNECT_BOUND and the
        # process went on to MPI_Finalize beside it: heap corruption (docs/design/transport.md).
        self._router.drain(max(0.0, min(DISCONNECT_BOUND / 2, end - time.monotonic())))
        for peer in peers:
            comm = self._router.drop_peer(peer)
            if comm is not None and peer not in self._gone:
                comms.append(comm)
        threads = [self._disconnect(comm) for comm in comms]
        for thread in threads:
            thread.join(max(0.0, end - time.monotonic()))

    def _disconnect(self, comm: MPI.Comm) -> threading.Thread:
        # MPI_Comm_disconnect on a thread of its own: it returns once the peer calls it too.
        def run() -> None:
            try:
                comm.Disconnect()
            except MPI.Exception:
                pass  # the peer died meanwhile: nothing to wait for

        thread = threading.Thread(target=run, name="mpimesh-link-disconnect", daemon=True)
        thread.start()
        return thread

    def statistics(self) -> LinkStatistics:
        """Counters: frames relayed for others, links made, links that failed, calls still waiting."""
        with self._lock:
            pending = sum(self._under_way.values())
        return LinkStatistics(self._router.relayed, self._links, self._failed, pending)

    def _send(self, dest: Addr, frame: Frame) -> bool:
        try:
            self._router.send(dest, frame)
        except ConnectionError:
            return False  # a dead end: its death notice settles the rest
        return True
