"""The actors living in this process: the handlers of the frames that create, call and stop them.

:class:`ActorHost` makes an :class:`~.actor_cell.ActorCell` for each SPAWN,
hands CALL and SITE_CALL frames to the mailbox of the actor they name (or
holds them until it exists, or refuses them once it is gone), and stops
actors, one or all.  What one actor is and does is ``actor_cell``; its
phases ``actor_lifecycle``; its thread ``actor_runner``; calling its
endpoints ``actor_invoke``; its mailbox's items ``actor_mail``.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from functools import partial
from typing import Any

from .._waits import Countdown, Deadline
from ..context import _context_var
from ..errors import MeshInternalError
from . import protocol
from .actor_cell import ActorCell
from .actor_invoke import Runtime
from .actor_lifecycle import Phase
from .actor_mail import Addr, Call, Init, Item, Site, SiteCall, as_point
from .actor_runner import SyncRunner
from .logs import debug
from .ports import gone
from .protocol import Frame, Key, Kind, PortRef, Status

__all__ = ["ActorHost"]

# The keyword arguments of every SITE_CALL (only unpacked, never changed).
_NO_KWARGS: dict[str, Any] = {}


class ActorHost:
    """The actors living in this process: creates them and hands them their messages."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.lock = threading.Lock()
        self.live: dict[Key, ActorCell] = {}
        # Calls that overtook their SPAWN (sent by another process than the
        # spawner): held until the actor exists.
        self.parked: dict[Key, list[Item]] = {}
        # key -> (mesh name, why it stopped), to refuse later calls
        self.tombstones: dict[Key, tuple[str, str]] = {}
        # call site -> (actor key, method, caller's address, message point), see protocol.site_call
        self.sites: dict[int, Site] = {}
        # call site -> its actor's key, for the sites offered to the pump
        # (serve_site), whether it took them or not
        self.served: dict[int, Key] = {}
        # the native wire's table of the sites its pump runs (None: another wire, or not asked yet)
        self.native_sites: dict[int, Any] | None = None
        # Every actor thread ever started: the process must not finalize MPI
        # while one of them is still on its way out (MPICH keeps per-thread
        # state and hangs in MPI_Finalize otherwise).
        self.threads: list[threading.Thread] = []

    def on_spawn(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """The SPAWN handler: start the actor's thread, its ``__init__`` first in its mailbox."""
        _, _, key, name, point, is_async, body, port, (creator, spawner), path = frame
        for entry in reversed(path):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        actor = ActorCell(self, self.runtime, key, name, as_point(point), is_async, creator, spawner)
        with self.lock:
            self.live[key] = actor
            parked = self.parked.pop(key, [])
        actor.init_port = port
        actor.put(Init(body, buffers, port))
        for item in parked:
            actor.put(item)
        self.threads = [t for t in self.threads if t.is_alive()]
        self.threads.append(actor.thread)
        actor.start()

    def on_call(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """The CALL handler: to the actor's mailbox, held until it exists, or refused if it is gone."""
        _, _, key, method, _, port, point, *site = frame
        if site:
            # (actor, method, caller, point) of later SITE_CALLs from the caller
            self.sites[site[0]] = Site(key, method, port[0], point)
            if self.served.pop(site[0], None) is not None and self.native_sites is not None:
                self.native_sites.pop(site[0], None)
        actor = self.live.get(key)
        tomb = None
        if actor is None:
            with self.lock:
                actor = self.live.get(key)
                if actor is None:
                    tomb = self.tombstones.get(key)
                    if tomb is None:
                        self.parked.setdefault(key, []).append(Call(frame, buffers))
                        return
        if actor is not None:
            actor.put(Call(frame, buffers))
        elif port is not None and tomb is not None:
            name, reason = tomb
            where = str(as_point(point)) if point[1] else ""
            report = gone(f"{name}.{method}", where, f"it is stopped ({reason})")
            self.runtime.reply(port, point[0], Status.FAILED, report)

    def on_site_call(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """The SITE_CALL handler: a call through a site that a CALL from ``src`` registered."""
        _, _, number, pid, args = frame
        site = self.sites.get(number)
        if site is None:
            # Cannot happen: the registering CALL travelled the same path first.
            raise MeshInternalError(f"SITE_CALL from {src} names call site {number}, which was never registered here")
        actor = self.live.get(site.key)
        if actor is not None and not actor.is_async:
            if site.fn is not None and number not in self.served:
                self.serve_site(number, site, actor)
            actor.put(SiteCall(site, pid, args))
            return
        # an async actor, or one not there (yet, or any more)
        call = protocol.call(None, site.key, site.method, (args, _NO_KWARGS), (site.caller, pid), site.point)
        self.on_call(src, call, buffers)

    def serve_site(self, number: int, site: Site, actor: ActorCell) -> None:
        """Offer the pump the later calls through ``site``, to run while ``actor`` idles (native/site.c).

        Once, after the first call through the site has bound its endpoint
        and context (on the actor's thread); only on the native wire, and
        for a caller reached directly.  The pump declines anything unusual,
        which then comes here as always.
        """
        self.served[number] = site.key
        runner = actor.runner
        router = self.runtime.router
        # Only the native wire has them, outside the Wire protocol that both wires answer
        # (tests/transport/test_router.py): the mpi4py wire keeps the Python path.
        serve = getattr(router.wire, "_serve_sites", None)
        route = router.direct_route(site.caller)
        if serve is None or route is None or not isinstance(runner, SyncRunner) or runner.tid is None:
            return
        from .. import _native  # only with the native wire (_serve_sites)

        if runner.lane is None:
            runner.lane = _native.Lane(runner.mailbox, actor.lifecycle, Phase.RUNNING, runner.tid)
        link, rank, routed, routes, peers = route
        dest = site.caller
        way = router.wire._site_way(link, rank)  # type: ignore[attr-defined]  # the native wire's (_serve_sites)
        way_failed = way.pop("send_failed")
        addr = self.runtime.addr

        def send_failed(exc: BaseException) -> None:
            try:
                way_failed(exc)
            except ConnectionError:
                debug(f"reply to {dest} dropped: it has failed", addr)

        self.native_sites = table = serve(Kind.SITE_CALL)
        table[number] = _native.Site(
            lane=runner.lane, fn=site.fn, var=_context_var, ctx=site.ctx, method=site.method,
            index=site.point[0], dest=dest, island=dest[0], rank=rank, routes=routes, routed=routed, peers=peers,
            dead=self.runtime.dead, reply_kind=Kind.REPLY, value_status=Status.VALUE,
            finish=partial(actor.invoker.site_done, site), send_failed=send_failed,
            slow=partial(actor.invoker.site_again, site), **way,
        )

    def on_stop(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """The STOP handler: stop one actor (or all) after its pending messages, then answer."""
        _, _, key, port, index, reason = frame
        if key is None:
            self.stop_all(reason, lambda: self._ack(port, index))
            return
        actor = self.live.get(key)
        if actor is None:
            self._ack(port, index)
            return
        actor.stop(reason, lambda: self._ack(port, index))

    def _ack(self, port: PortRef | None, index: int) -> None:
        if port is not None:
            self.runtime.reply(port, index, Status.OK, None)

    def stop_all(self, reason: str, done: Callable[[], Any], owned: bool = True) -> list[ActorCell]:
        """Stop every actor; ``done()`` runs once all have stopped.

        ``owned``: each actor first stops the meshes it spawned; not when the
        whole job ends, which stops them all anyway.
        """
        with self.lock:
            actors = list(self.live.values())
        countdown = Countdown(len(actors), done)
        for actor in actors:
            actor.stop(reason, countdown.count, owned)
        return actors

    def close_owned(self, owner: object, reason: str, timeout: float) -> list[BaseException]:
        """Close what ``owner`` (an actor of this process) made, bottom-up, within ``timeout`` seconds.

        Returns:
            The errors of the closes (see ``owners.Owners.close_actor``).
        """
        return self.runtime.owners.close_actor(owner, reason, timeout)

    def forget(self, key: Key, name: str, reason: str) -> None:
        """The actor of mesh ``key`` (named ``name``) has stopped: later calls to it are refused with ``reason``."""
        with self.lock:
            self.live.pop(key, None)
            self.tombstones[key] = (name, reason)
        # The pump lets go of the actor's endpoints (and so of the actor).
        for number in [n for n, k in list(self.served.items()) if k == key]:
            del self.served[number]
            if self.native_sites is not None:
                self.native_sites.pop(number, None)

    def wait_stopped(self, actors: list[ActorCell], timeout: float) -> list[ActorCell]:
        """Wait (bounded) for actors to finish; returns those still running."""
        deadline = Deadline(timeout)
        actors = [a for a in actors if not a.abandoned]  # stopped already, their __init__ may never return
        for actor in actors:
            actor.finished.wait(deadline.left())
        return [a for a in actors if not a.finished.is_set()]

    def join_threads(self, timeout: float) -> int:
        """Wait (bounded) until every actor thread has exited; returns how many still run."""
        deadline = Deadline(timeout)
        for thread in list(self.threads):
            thread.join(deadline.left())
        return sum(t.is_alive() for t in self.threads)
