"""The controller role, rank 0: a thin role over the pool, the islands, the host watchers and the end of the job.

The controller hands out launch-pool ranks while it has room (``pool``) and
otherwise creates processes with ``MPI_Comm_spawn``, one *island* per spawn
(``islands``).  It relays frames between islands, declares deaths
(``liveness``, ``hostwatchers``) and runs the unhandled fault hook, which
ends the job when it raises.  The end of the job, from whichever side it
comes, is ``end_of_job``: every process stopped in bounded time.

Its handlers answer the workers' requests (ALLOCATE, JOB_HOSTS, NAMED_ACTOR,
RELEASE) on one service thread, off the polling thread: each may block.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._core import serialize as _serialize
from .._core.logs import Printer
from .._core.named import Registry as NamedActors
from .._core.protocol import Frame, Kind, PortRef, Status, ping, unreachable
from .._core.runtime import Runtime
from .._transport.mpi import fault_tolerant
from ..config import settings
from ..future import Future
from ..supervision import MeshFailure
from .base import BaseRole
from .end_of_job import EndOfJob
from .hostwatchers import HostWatchers
from .islands import Islands, prepare_singleton
from .job_status import write_status_file
from .liveness import Liveness
from .pool import Pool
from .procs import Addr, Procs

__all__ = ["Controller"]

#: Seconds a spare has to echo a PING before a heal passes it by (an idle rank echoes within milliseconds;
#: the idle spares of a host lost a moment ago are not known dead yet: ULFM's detector needs ~2 s).
_SPARE_ANSWER = 1.0


class Controller(BaseRole):
    """Process management on rank 0.

    Args:
        runtime: the controller's runtime.
        pool: ``(addr, host, pid)`` of every launch-pool worker.
    """

    name = "controller"

    def __init__(self, runtime: Runtime, pool: list[tuple[Addr, str, int]]) -> None:
        super().__init__(
            runtime,
            {
                Kind.HELLO: self.on_hello,
                Kind.BYE: self.on_bye,
                Kind.FORWARD: self.on_forward,
                Kind.ALLOCATE: self.on_allocate,
                Kind.JOB_HOSTS: self.on_job_hosts,
                Kind.NAMED_ACTOR: self.on_named_actor,
                Kind.RELEASE: self.on_release,
                Kind.LOG: self.on_log,
                Kind.PING: self.on_ping,
                Kind.EXITED: self.on_exited,
            },
        )
        #: every worker of the job, launch pool and spawned alike
        self.procs = Procs(runtime)
        self.pool = Pool(self.procs, runtime.host, pool)
        self.islands = Islands(runtime, self.procs, self.pool)
        #: on each other host, the workers that watch every other worker's exit there
        self.watchers = HostWatchers(runtime, self.procs)
        self.end = EndOfJob(runtime, self.procs, self.pool, self.islands, self._stop_serving)
        #: get_or_spawn_controller's singletons: name -> actor mesh in this process
        self.named = NamedActors()
        self._service = ThreadPoolExecutor(1, thread_name_prefix="mpimesh-service")
        # the background waiter: polls while no other thread does
        self._thread = threading.Thread(
            target=self._loop, args=(0.1, self._between_polls), name="mpimesh-progress", daemon=True
        )
        self.printer = Printer(settings.log_fold)
        self.fault_tolerant = fault_tolerant()
        #: the workers' liveness, watched from start() on
        self.liveness: Liveness | None = None
        runtime.every_ms(self._check_liveness)
        runtime.role = self

    def start(self) -> None:
        """Start watching the pool and the background progress thread."""
        # Until the job's end writes its real status, a job cut short (a lost host: PRRTE SIGKILLs
        # every rank and exits 0) has failed: what ``mpimesh run`` and the Slurm templates report.
        write_status_file(1)
        if not self.pool.ranks:
            prepare_singleton(self.fault_tolerant)
        rt = self.rt
        self.liveness = liveness = Liveness(rt)
        rt.router.heard = liveness.last_heard
        for proc in self.procs.values():
            liveness.watch(proc.addr, proc.pid, proc.host)
            self.watchers.add(proc)
        self._thread.start()

    def _between_polls(self) -> None:
        if self.liveness is not None and self.end.running:
            with self.rt.progress.holding():
                self.liveness.heartbeat()
        if self.printer.fold > 0:
            self.printer.flush(due_only=True)

    def _check_liveness(self) -> None:
        if self.liveness is not None:
            self.liveness.check()

    def _stop_serving(self, code: int) -> None:
        # The end of the job's last step: the controller's own threads (each bounded).
        self.printer.flush()
        self.request_stop(code)
        self._thread.join(1.0)
        self._service.shutdown(wait=False, cancel_futures=True)
        if self.liveness is not None:
            self.liveness.close()

    # --- processes for meshes (the Role protocol) -------------------------------------------------

    def job_hosts(self) -> list[str]:
        """The job's hosts in launch order: the controller's, then each new one of the pool's ranks."""
        return list(self.pool.hosts)

    def allocate(self, per_host: int, hosts: list[str]) -> list[tuple[Addr, str]]:
        """``per_host`` worker processes on each of ``hosts``, host by host, as ``(addr, host)``.

        On each host, the launch pool's free ranks of that host come first
        (in rank order); the rest are spawned there, all in one
        ``MPI_Comm_spawn_multiple``.
        """
        rows, missing = self.pool.take(per_host, hosts)
        if missing:
            try:
                spawned = self.islands.spawn(missing)
            except BaseException:
                self.pool.give_back([a for row in rows for a in row])
                raise
            new = iter(spawned)  # in the order of ``missing``: host by host
            for row in rows:
                row.extend(next(new) for _ in range(per_host - len(row)))
        return [(a, self.procs[a].host) for row in rows for a in row]

    def replace(self, hosts: list[str]) -> list[tuple[Addr, str]]:
        """A new process for each of ``hosts``, to replace a dead one there (``ProcMesh.heal``); ``(addr, host)``.

        Spares first (``Pool.take_spares``: a free pool rank of that host,
        else of another); the rest are spawned, on their host if it still
        runs a process of the job, else on the controller's.
        """
        picked = self._live_spares(hosts)
        wanted = [host if self.pool.host_lives(host) else self.rt.host
                  for host, addr in zip(hosts, picked, strict=True) if addr is None]
        if wanted:
            counts = list(dict.fromkeys(wanted))
            try:
                spawned = iter(self.islands.spawn([(host, wanted.count(host)) for host in counts]))
            except BaseException as exc:
                self.pool.give_back([a for a in picked if a is not None])
                raise RuntimeError(
                    f"cannot heal: {len(wanted)} dead processes have no spare rank to take over and spawning failed "
                    f"({exc}); launch with spare ranks, e.g. `mpimesh run --spares-per-host 1 ...` or more srun tasks"
                ) from exc
            by_host = {host: [next(spawned) for _ in range(wanted.count(host))] for host in counts}
            for i, addr in enumerate(picked):
                if addr is None:
                    picked[i] = by_host[wanted.pop(0)].pop(0)
        return [(a, self.procs[a].host) for a in picked if a is not None]

    def _live_spares(self, hosts: list[str]) -> list[Addr | None]:
        """``Pool.take_spares(hosts)``, each spare checked alive: it must echo a PING within ``_SPARE_ANSWER`` s.

        The idle spares of a host lost a moment ago are not known dead yet
        (nothing talked to them, ULFM's detector needs ~2 s): one that does
        not echo is passed by and the next spare taken.  It stays allocated,
        so no later heal takes it either; the detectors declare it dead soon.
        """
        picked = self.pool.take_spares(hosts)
        if self.liveness is None:
            return picked
        heard = self.liveness.last_heard
        checked: set[Addr] = set()
        while True:
            fresh = [a for a in picked if a is not None and a not in checked]
            if not fresh:
                return picked
            asked = time.monotonic()
            for addr in fresh:
                try:
                    self.rt.router.send(addr, ping(0))
                except ConnectionError:
                    pass
            deadline = asked + _SPARE_ANSWER
            while time.monotonic() < deadline and not all(
                    heard.get(a, 0.0) >= asked or a in self.rt.dead for a in fresh):
                time.sleep(0.002)
            checked.update(fresh)
            silent = [i for i, a in enumerate(picked)
                      if a in fresh and (heard.get(a, 0.0) < asked or a in self.rt.dead)]
            if not silent:
                return picked
            # a silent spare says its host is likely lost with the dead process: any host's next
            more = self.pool.take_spares(["" for _ in silent])
            for i, spare in zip(silent, more, strict=True):
                picked[i] = spare

    def named_actor(self, name: str, body: bytes) -> Any:
        """The singleton actor mesh ``name`` in this process, spawned from ``body`` (class, args) if new."""
        return self.named.get_or_spawn(name, body)

    def release(self, addrs: list[Addr], reason: str) -> Future[None]:
        """Stop every actor on ``addrs`` and give the processes back, on the service thread."""
        fut: Future[None] = Future("ProcMesh.stop()")

        def run() -> None:
            try:
                self._release(addrs, reason)
            except BaseException as exc:
                fut.set_exception(exc)
            else:
                fut.set_result(None)

        self._service.submit(run)
        return fut

    def _release(self, addrs: list[Addr], reason: str) -> None:
        # Stop every actor on ``addrs``, give the processes back, and close
        # the islands no mesh holds any more (blocking, each step bounded).
        self.procs.stop_actors(addrs, reason, settings.shutdown_timeout)
        self.pool.give_back(addrs)
        self.islands.close_unheld({a[0] for a in addrs if a[0] != 0})

    # --- frames -----------------------------------------------------------------------------------

    def on_hello(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """HELLO: a spawned worker has started."""
        _, _, host, pid = frame
        proc = self.procs[src]
        proc.host, proc.pid, proc.hello = host, pid, True
        if self.liveness is not None:
            self.liveness.watch(src, pid, host)
        self.watchers.add(proc)
        self.procs.changed()

    def on_exited(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """EXITED: a host watcher saw a worker of its host exit, and why; the death's report gives it."""
        _, _, addr, cause = frame
        self.watchers.exited(addr, cause)
        self.rt.failures.settle_reported(addr, cause)

    def on_bye(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """BYE: a worker is leaving."""
        self.procs[src].bye = True
        self.rt.peers.gone(src)  # a link it was to make: the acceptor's wait is ended
        if self.liveness is not None:
            self.liveness.forget(src)
        self.procs.changed()

    def on_ping(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """PING: a worker's echo; the router has noted that it was heard."""

    def on_log(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """LOG: print a worker's output lines."""
        _, _, stream, lines = frame
        self.printer.on_log(stream, lines)

    def on_forward(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """FORWARD: relay a frame between islands."""
        _, _, dest, data = frame
        try:
            self.rt.router.relay(dest, data, buffers)
        except ConnectionError as exc:
            # Its island is gone: the sender fails its waits on ``dest`` with the error this process's own
            # send there gets, instead of waiting out its timeout for a frame dropped here.
            try:
                self.rt.send(src, unreachable(dest, str(exc)))
            except ConnectionError:
                pass  # the sender is gone too: nobody waits
            return
        self.rt.peers.relayed(src, dest)

    def on_allocate(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """ALLOCATE: a worker's request for processes for a new mesh (:meth:`allocate`)."""
        _, _, per_host, hosts, port = frame
        self._serve(port, lambda: self.allocate(per_host, hosts))

    def on_job_hosts(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """JOB_HOSTS: a worker asks for the job's hosts (:meth:`job_hosts`)."""
        _, _, port = frame
        self._serve(port, self.job_hosts)

    def on_named_actor(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """NAMED_ACTOR: a worker asks for a singleton actor mesh (:meth:`named_actor`)."""
        _, _, name, body, port = frame
        self._serve(port, lambda: self.named_actor(name, body))

    def on_release(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """RELEASE: a worker gives processes back (:meth:`release`); answered once they are stopped."""
        _, _, addrs, reason, port = frame
        self._serve(port, lambda: self._release(addrs, reason))

    def _serve(self, port: PortRef, request: Callable[[], Any]) -> None:
        # A worker's request, run on the service thread (it may block), answered on ``port``.
        def run() -> None:
            try:
                value = request()
            except Exception as exc:
                payload = _serialize.error_payload(exc, f"### controller on {self.rt.host}", 0, {}, self.rt.host)
                self.rt.reply(port, 0, Status.ERROR, payload)
            else:
                self.rt.reply(port, 0, Status.OK, value)

        self._service.submit(run)

    # --- deaths (the Role protocol) ---------------------------------------------------------------

    def record_death(self, addr: Addr, cause: str) -> str:
        """Bookkeeping for a dead worker; returns the report everyone gets."""
        proc = self.procs.get(addr)
        if proc is None:
            return f"process {addr[0]}.{addr[1]} died: {cause}"
        proc.dead = True
        # Declared dead for silence (stopped, hung in C): make it so, or it
        # would keep the job from ending.
        if not self.procs.kill(proc) and "stopped answering" in cause:
            self.procs.unconfirmed.add(addr)
        if self.liveness is not None:
            self.liveness.lost(addr, cause)
        self.watchers.died(proc)
        self.procs.changed()
        return f"process {addr[0]}.{addr[1]} (pid {proc.pid}) on {proc.host} died: {cause}"

    def settle_mpi_report(self, addr: Addr, text: str) -> bool:
        """ULFM's report of ``addr``: settled now unless a pidfd will soon say more."""
        proc = self.procs.get(addr)
        if proc is not None and proc.bye:
            # It said BYE and left: a survivor of an earlier death skips
            # MPI_Finalize, so ULFM reports its exit, which is no death.
            return True
        liveness = self.liveness
        if liveness is None or not liveness.watches(addr):
            # another node: its host's watcher tells how it ended (now, or within the grace)
            cause = self.watchers.take_cause(addr)
            if cause is None and self.watchers.watched(addr):
                return False
            self.rt.failures.declare_dead(addr, cause or f"reported failed by MPI ({text})")
            return True
        liveness.check()
        return addr in self.rt.dead

    def live_addrs(self) -> list[Addr]:
        """Workers that said hello and have neither left nor died."""
        return self.procs.live()

    def fatal(self, report: str) -> None:
        """A process died in a job that cannot survive it: end the job now, with the report."""
        self.end.fatal(report)

    def unhandled(self, failure: MeshFailure) -> None:
        """A failure reached the top: run ``mpimesh.unhandled_fault_hook`` off the progress path."""
        self.end.unhandled(failure)

    # --- the end (``end_of_job``) -----------------------------------------------------------------

    @property
    def failed_unhandled(self) -> bool:
        """Whether an unhandled failure is ending the job (it exits 1)."""
        return self.end.failed_unhandled

    def leave(self, code: int) -> int:
        """End this process once every worker has stopped; the status to exit with (:meth:`EndOfJob.leave`)."""
        return self.end.leave(code)
