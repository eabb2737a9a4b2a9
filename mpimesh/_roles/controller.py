"""The controller role, rank 0: the launch pool, spawned islands, deaths, shutdown.

The controller hands out launch-pool ranks while it has room and otherwise
creates processes with ``MPI_Comm_spawn`` (one *island* per spawn).  It
relays frames between islands, declares deaths (``liveness``) and runs the
unhandled fault hook, which ends the job when it raises.  At the end of the
job it stops every process in bounded time: SHUTDOWN, wait for BYE, and abort
the job if a launch-pool worker does not answer.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .._core import protocol
from .._core import serialize as _serialize
from .._core.logs import Printer, warn
from .._core.named import Registry as NamedActors
from .._core.ports import Gather
from .._core.protocol import Frame, Kind, Status
from .._core.runtime import Runtime
from .._transport.mpi import MPI, dynamic, fault_tolerant, library
from ..config import settings
from ..future import Future
from ..shape import Shape
from ..supervision import MeshFailure, Unhandled, current_hook, default_unhandled_fault_hook
from .base import BaseRole
from .interactive import interactive_session, report_and_go_on
from .job_status import set_job_exit_status
from .liveness import Liveness

__all__ = ["Controller", "ProcInfo"]

Addr = tuple[int, int]


#: Workers per other host that watch the others' exits there (two: each sees the other's death).
_WATCHERS = 2


@dataclass
class ProcInfo:
    """What the controller knows about one worker process."""

    addr: Addr
    host: str
    pid: int
    hello: bool = True
    bye: bool = False
    allocated: bool = False
    dead: bool = False


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
                Kind.PROCS: self.on_procs,
                Kind.LOG: self.on_log,
                Kind.PING: self.on_ping,
                Kind.EXITED: self.on_exited,
            },
        )
        self.lock = threading.RLock()
        self.cond = threading.Condition()
        self.procs: dict[Addr, ProcInfo] = {a: ProcInfo(a, h, p) for a, h, p in pool}
        self.free: list[Addr] = [a for a, _, _ in pool]
        #: get_or_spawn_controller's singletons: name -> actor mesh in this process
        self.named = NamedActors()
        #: the job's hosts in launch order (the controller's first)
        self.hosts: list[str] = list(dict.fromkeys([runtime.host, *(h for _, h, _ in pool)]))
        self.islands: dict[int, list[Addr]] = {}
        self._next_island = 1
        self._service = ThreadPoolExecutor(1, thread_name_prefix="mpimesh-service")
        # the background waiter: polls while no other thread does
        self._thread = threading.Thread(
            target=self._loop, args=(0.1, self._between_polls), name="mpimesh-progress", daemon=True
        )
        self._closed = False
        self._supervisor = ThreadPoolExecutor(1, thread_name_prefix="mpimesh-supervisor")
        #: an unhandled failure is ending the job (see _end_job): it exits 1
        self.failed_unhandled = False
        # set once the script's thread has begun to leave (see _end_job)
        self._leaving = threading.Event()
        # leave() runs from atexit (an embedded controller): atexit is already running
        self._at_exit = False
        self.printer = Printer(settings.log_fold)
        self.fault_tolerant = fault_tolerant()
        # declared dead on another host without proof: only an Abort ends them
        self.unconfirmed: set[Addr] = set()
        #: the workers' liveness, watched from start() on
        self.liveness: Liveness | None = None
        #: on each other host, the two workers that watch every other worker's exit there, and each other
        #: (``hostwatch``): a watcher's own death is seen too
        self.watchers: dict[str, list[Addr]] = {}
        #: how workers of other hosts ended, as their host's watcher reported (``on_exited``)
        self.exit_causes: dict[Addr, str] = {}
        runtime.every_ms(self._check_liveness)
        runtime.role = self

    def start(self) -> None:
        """Start watching the pool and the background progress thread."""
        if not self.procs:
            _remove_stale_sessions()
            if self.fault_tolerant:
                _recoverable_spawns()
        rt = self.rt
        self.liveness = liveness = Liveness(rt)
        rt.router.heard = liveness.last_heard
        for proc in self.procs.values():
            liveness.watch(proc.addr, proc.pid, proc.host)
            self._watch_remote(proc)
        self._thread.start()

    def _between_polls(self) -> None:
        if self.liveness is not None and not self._closed:
            with self.rt.progress.holding():
                self.liveness.heartbeat()
        if self.printer.fold > 0:
            self.printer.flush(due_only=True)

    def _check_liveness(self) -> None:
        if self.liveness is not None:
            self.liveness.check()

    # --- allocation -------------------------------------------------------------------------------

    def job_hosts(self) -> list[str]:
        """The job's hosts in launch order: the controller's, then each new one of the pool's ranks."""
        return list(self.hosts)

    def allocate(self, per_host: int, hosts: list[str]) -> list[tuple[Addr, str]]:
        """``per_host`` worker processes on each of ``hosts``, host by host, as ``(addr, host)``.

        On each host, the launch pool's free ranks of that host come first
        (in rank order); the rest are spawned there, all in one
        ``MPI_Comm_spawn_multiple``.
        """
        return [(p.addr, p.host) for p in self._allocate(per_host, hosts)]

    def _allocate(self, per_host: int, hosts: list[str]) -> list[ProcInfo]:
        rows: list[list[Addr]] = []
        missing: list[tuple[str, int]] = []
        with self.lock:
            self.free = [a for a in self.free if not self.procs[a].dead]
            for host in hosts:
                take = [a for a in self.free if self.procs[a].host == host][:per_host]
                for addr in take:
                    self.free.remove(addr)
                    self.procs[addr].allocated = True
                rows.append(take)
                if len(take) < per_host:
                    missing.append((host, per_host - len(take)))
        if missing:
            try:
                spawned = self._spawn_island(missing)
            except BaseException:
                with self.lock:
                    for addr in (a for row in rows for a in row):
                        self.procs[addr].allocated = False
                        self.free.append(addr)
                    self.free.sort()
                raise
            new = iter(spawned)  # in the order of ``missing``: host by host
            for row in rows:
                row.extend(next(new) for _ in range(per_host - len(row)))
        return [self.procs[a] for row in rows for a in row]

    def _spawn_island(self, counts: list[tuple[str, int]]) -> list[Addr]:
        """Spawn ``count`` workers on each ``host`` of ``counts``, as one new island; their addresses.

        The ``host`` info key places them, but only in a job of several
        hosts: on one host there is no choice to make, and a singleton's
        PRRTE may know its node by another name than the processor name.
        """
        rt = self.rt
        n = sum(count for _, count in counts)
        place = len(self.hosts) > 1
        if place and self._next_island > 1 and not self._respawns_across_hosts():
            raise RuntimeError(self._spawn_failed(
                counts, "a second MPI_Comm_spawn is not tried in a job across hosts under Open MPI: it fails or hangs "
                "there (open-mpi/ompi#12601; MPIMESH_SPAWNS_ACROSS_HOSTS=always tries anyway)"))
        with self.lock:
            island = self._next_island
            self._next_island += 1
        infos = []
        for host, _ in counts:
            info = MPI.Info.Create()
            info.Set("wdir", os.getcwd())
            if place:
                info.Set("host", host)
            infos.append(info)
        args = ["-m", "mpimesh", "--worker", "--island", str(island)]
        try:
            if not dynamic.acquire(timeout=settings.spawn_timeout):
                why = (f"a direct link's MPI_Comm_connect in this process has not returned within "
                       f"{settings.spawn_timeout:g} s (MPIMESH_SPAWN_TIMEOUT), and Open MPI cannot spawn beside it")
                raise RuntimeError(self._spawn_failed(counts, why))
            try:
                with rt.router.exclusive():
                    inter = MPI.COMM_SELF.Spawn_multiple(
                        [sys.executable] * len(counts), [args] * len(counts), [c for _, c in counts], infos
                    )
            finally:
                dynamic.release()
        except MPI.Exception as exc:
            why = f"MPI_Comm_spawn failed ({exc.Get_error_string()})"
            raise RuntimeError(self._spawn_failed(counts, why)) from None
        finally:
            for info in infos:
                info.Free()
        hosts = [host for host, count in counts for _ in range(count)]
        addrs = [(island, r) for r in range(n)]
        with self.lock:
            for addr, host in zip(addrs, hosts, strict=True):
                self.procs[addr] = ProcInfo(addr, host, 0, hello=False, allocated=True)
            self.islands[island] = addrs
        rt.router.add_island(inter, island)
        for addr in addrs:
            rt.send(addr, protocol.init(island, rt.host, rt.pid, list(sys.path)))

        def started() -> bool:
            return all(self.procs[a].hello or self.procs[a].dead for a in addrs)

        start = time.monotonic()
        end = start + settings.spawn_timeout
        while not rt.wait(started, self.cond, max(0.0, min(settings.show_waits or 1e9, end - time.monotonic()))):
            now = time.monotonic()
            if now >= end:
                break
            ready = sum(self.procs[a].hello for a in addrs)
            warn(f"spawning {n} processes: {ready} ready after {now - start:.0f} s")
        if not started():
            missing = [a for a in addrs if not self.procs[a].hello]
            raise TimeoutError(
                f"spawned processes {missing} did not start within {settings.spawn_timeout:g} s; "
                "check that `python -m mpimesh --worker` runs on this host, or raise MPIMESH_SPAWN_TIMEOUT"
            )
        astray = [f"{a[0]}.{a[1]} on {self.procs[a].host} (asked: {h})"
                  for a, h in zip(addrs, hosts, strict=True) if place and self.procs[a].host != h]
        if astray:
            warn(f"MPI_Comm_spawn placed processes on other hosts than asked: {', '.join(astray)}; "
                 "their mesh coordinates do not match their hosts")
        return addrs

    def named_actor(self, name: str, body: bytes) -> Any:
        """The singleton actor mesh ``name`` in this process, spawned from ``body`` (class, args) if new."""
        return self.named.get_or_spawn(name, body)

    def _respawns_across_hosts(self) -> bool:
        """Whether a job across hosts may spawn more than once (MPIMESH_SPAWNS_ACROSS_HOSTS)."""
        return settings.spawns_across_hosts == "always" or not library().startswith("Open MPI")

    def _spawn_failed(self, counts: list[tuple[str, int]], why: str) -> str:
        """Why ``MPI_Comm_spawn`` of ``counts`` failed, and what to launch instead."""
        n = sum(count for _, count in counts)
        where = ", ".join(f"{count} on {host}" for host, count in counts)
        ranks = n + 1 + len(self.procs) - len(self.free)
        if len(self.hosts) > 1:
            slots = {h: sum(p.host == h and p.addr[0] == 0 for p in self.procs.values()) + (h == self.rt.host)
                     for h in self.hosts}
            for host, count in counts:
                slots[host] += count
            fix = (f"launch with enough ranks on each host for the meshes (e.g. `mpirun --host "
                   f"{','.join(f'{h}:{c}' for h, c in slots.items())}`, `srun --ntasks-per-node=...`)")
        else:
            fix = (f"launch with more ranks (e.g. `mpirun -n {ranks} python -m mpimesh ...`, or more srun tasks: "
                   "spawning is not possible under srun)")
        return f"cannot start {n} worker processes ({where}): the launch pool has no free rank there and {why}; {fix}"

    def _release(self, addrs: list[Addr], reason: str) -> None:
        # Stop every actor on ``addrs`` and give the processes back (blocking, bounded).
        rt = self.rt
        fut: Future[None] = Future("stop")
        shape = Shape.row_major(("procs",), (len(addrs),))
        receiver = Gather(fut, "stop", shape, addrs, values=False)
        port = (rt.addr, rt.ports.open(receiver))
        for i, addr in enumerate(addrs):
            if addr in rt.dead:
                receiver.fail(addr, rt.dead[addr])
                continue
            try:
                rt.send(addr, protocol.stop(None, port, i, reason))
            except ConnectionError as exc:
                receiver.fail(addr, str(exc))
        if receiver.count >= receiver.n:
            rt.ports.close(port[1])
        try:
            fut.get(settings.shutdown_timeout)
        except Exception:
            pass  # processes gone or stuck: close them below regardless
        with self.lock:
            islands = {a[0] for a in addrs if a[0] != 0}
            for addr in addrs:
                self.procs[addr].allocated = False
                if addr[0] == 0 and addr not in self.free and not self.procs[addr].dead:
                    self.free.append(addr)
            self.free.sort()  # deterministic placement: lowest ranks first
        for island in islands:
            members = self.islands.get(island, [])
            if not any(self.procs[a].allocated for a in members):
                self._close_island(island, 0)

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

    def _close_island(self, island: int, code: int) -> bool:
        members = self._stop_island(island, code)
        clean = self.rt.wait(lambda: self._all_left(members), self.cond, settings.shutdown_timeout)
        self._drop_island(island, members, clean)
        if clean:
            # stop() is done once the processes are gone: their interpreters
            # have finalized (module globals' __del__, as in Monarch) and
            # their memory, GPU memory included, is free.
            self._wait_exited([self.procs[a] for a in members], settings.shutdown_timeout)
        return clean

    def _wait_exited(self, procs: list[ProcInfo], timeout: float) -> None:
        # Bounded wait for the exit of those of `procs` on this host (a pidfd each).
        fds = []
        for proc in procs:
            if proc.pid and proc.host == self.rt.host and hasattr(os, "pidfd_open"):
                try:
                    fds.append(os.pidfd_open(proc.pid))
                except OSError:
                    pass  # gone already
        deadline = time.monotonic() + timeout
        try:
            for fd in fds:
                if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
                    warn(f"a stopped process did not exit within {timeout:g} s (MPIMESH_SHUTDOWN_TIMEOUT)")
                    break
        finally:
            for fd in fds:
                os.close(fd)

    def _stop_island(self, island: int, code: int) -> list[Addr]:
        """Send SHUTDOWN to an island's live processes; returns its members."""
        with self.lock:
            members = self.islands.pop(island, [])
        self._send_shutdown([a for a in members if not self.procs[a].bye and not self.procs[a].dead], code)
        return members

    def _send_shutdown(self, addrs: list[Addr], code: int) -> None:
        frame = protocol.shutdown(code, bool(self.rt.dead))
        for addr in addrs:
            try:
                self.rt.send(addr, frame)
            except ConnectionError:
                pass

    def _all_left(self, addrs: list[Addr]) -> bool:
        return all(self.procs[a].bye or self.procs[a].dead for a in addrs)

    def _drop_island(self, island: int, members: list[Addr], clean: bool) -> None:
        """Forget an island that was asked to stop: disconnect a whole one, kill what still runs."""
        rt = self.rt
        comm = rt.router.remove_island(island)
        whole = clean and not any(self.procs[a].dead for a in members)
        if comm is not None and whole:
            if not dynamic.acquire(timeout=settings.shutdown_timeout):
                warn(f"island {island} left connected: a direct link's MPI_Comm_connect in this process has not "
                     f"returned within {settings.shutdown_timeout:g} s (MPIMESH_SHUTDOWN_TIMEOUT)")
                return
            try:
                with rt.router.exclusive():
                    comm.Disconnect()
            finally:
                dynamic.release()
        elif not clean:
            for addr in members:
                if not self.procs[addr].bye and not self.procs[addr].dead:
                    self._kill(self.procs[addr])

    def _kill(self, proc: ProcInfo) -> bool:
        # SIGKILL a worker on this host; returns whether it is on this host.
        if not proc.pid or proc.host != self.rt.host:
            return False
        try:
            os.kill(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return True

    # --- frames -----------------------------------------------------------------------------------

    def on_hello(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """HELLO: a spawned worker has started."""
        _, _, host, pid = frame
        proc = self.procs[src]
        proc.host, proc.pid, proc.hello = host, pid, True
        if self.liveness is not None:
            self.liveness.watch(src, pid, host)
        self._watch_remote(proc)
        with self.cond:
            self.cond.notify_all()

    def on_exited(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """EXITED: a host watcher saw a worker of its host exit, and why; the death's report gives it."""
        _, _, addr, cause = frame
        self.exit_causes[addr] = cause
        self.rt.failures.settle_reported(addr, cause)

    def _watch_remote(self, proc: ProcInfo) -> None:
        """Have workers of ``proc``'s host watch its exit, when that host is not this one (``hostwatch``)."""
        if not proc.pid or proc.host == self.rt.host or proc.dead:
            return
        watchers = [w for w in self.watchers.get(proc.host, []) if not self.procs[w].dead]
        for watcher in watchers:
            if watcher != proc.addr:
                self._send_watch(watcher, [(proc.addr, proc.pid)])
        if len(watchers) < _WATCHERS and proc.addr not in watchers:
            watchers.append(proc.addr)
            self._send_watch(proc.addr, self._watchable(proc.host, but=proc.addr))
        self.watchers[proc.host] = watchers

    def _watchable(self, host: str, but: Addr) -> list[tuple[Addr, int]]:
        return [(p.addr, p.pid) for p in list(self.procs.values())
                if p.host == host and p.addr != but and p.hello and p.pid and not p.dead and not p.bye]

    def _send_watch(self, watcher: Addr, peers: list[tuple[Addr, int]]) -> None:
        if not peers:
            return
        try:
            self.rt.send(watcher, protocol.watch(peers))
        except ConnectionError:
            pass  # the watcher died: its death names another one

    def on_bye(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """BYE: a worker is leaving."""
        self.procs[src].bye = True
        self.rt.peers.gone(src)  # a link it was to make: the acceptor's wait is ended
        if self.liveness is not None:
            self.liveness.forget(src)
        with self.cond:
            self.cond.notify_all()

    def on_ping(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """PING: a worker's echo; the router has noted that it was heard."""

    def on_log(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """LOG: print a worker's output lines."""
        _, _, stream, lines = frame
        self.printer.on_log(stream, lines)

    def on_forward(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """FORWARD: relay a frame between islands."""
        _, _, dest, data = frame
        self.rt.router.relay(dest, data, buffers)
        self.rt.peers.relayed(src, dest)

    def on_procs(self, src: Addr, frame: Frame, buffers: list[Any]) -> None:
        """PROCS: a worker's allocate or release, served off the polling thread."""
        _, _, op, arg, port = frame
        self._service.submit(self._serve_procs, op, arg, port)

    def _serve_procs(self, op: str, arg: Any, port: tuple[Addr, int]) -> None:
        try:
            if op == "alloc":
                value: Any = self.allocate(*arg)
            elif op == "hosts":
                value = self.job_hosts()
            elif op == "named":
                value = self.named_actor(*arg)
            else:
                self._release(arg[0], arg[1])
                value = None
        except Exception as exc:
            payload = _serialize.error_payload(exc, f"### controller on {self.rt.host}", 0, {}, self.rt.host)
            self.rt.reply(port, 0, Status.ERROR, payload)
        else:
            self.rt.reply(port, 0, Status.OK, value)

    # --- deaths (the Role protocol) ---------------------------------------------------------------

    def record_death(self, addr: Addr, cause: str) -> str:
        """Bookkeeping for a dead worker; returns the report everyone gets."""
        proc = self.procs.get(addr)
        if proc is None:
            return f"process {addr[0]}.{addr[1]} died: {cause}"
        proc.dead = True
        with self.lock:
            if addr in self.free:
                self.free.remove(addr)
        # Declared dead for silence (stopped, hung in C): make it so, or it
        # would keep the job from ending.
        if not self._kill(proc) and "stopped answering" in cause:
            self.unconfirmed.add(addr)
        if self.liveness is not None:
            self.liveness.forget(addr)
        watchers = self.watchers.get(proc.host)
        if watchers is not None and addr in watchers:
            # a watcher died (the other one saw it): another worker of its host takes its place
            watchers.remove(addr)
            for other, _ in self._watchable(proc.host, but=addr):
                if other not in watchers:
                    watchers.append(other)
                    self._send_watch(other, self._watchable(proc.host, but=other))
                    break
        with self.cond:
            self.cond.notify_all()
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
            cause = self.exit_causes.pop(addr, None)
            if cause is None and self._watched_remotely(addr):
                return False
            self.rt.failures.declare_dead(addr, cause or f"reported failed by MPI ({text})")
            return True
        liveness.check()
        return addr in self.rt.dead

    def _watched_remotely(self, addr: Addr) -> bool:
        """Whether a live worker of ``addr``'s host (another host) watches its exit."""
        proc = self.procs.get(addr)
        watchers = self.watchers.get(proc.host, []) if proc is not None else []
        return any(w != addr and not self.procs[w].dead for w in watchers)

    def fatal(self, report: str) -> None:
        """A process died in a job that cannot survive it: end the job now, with the report."""

        def end() -> None:
            warn(
                f"{report}\nmpimesh: this MPI job cannot outlive a dead process (MPICH, or Open MPI "
                "without fault tolerance), so it ends now; launch with `mpimesh run -n N script.py` (Open MPI: "
                "adds --with-ft ulfm) to keep the survivors"
            )
            try:
                self.shutdown(1)
            finally:
                sys.stdout.flush()
                MPI.COMM_WORLD.Abort(1)

        try:
            self._supervisor.submit(end)
        except RuntimeError:
            end()

    def live_addrs(self) -> list[Addr]:
        """Workers that said hello and have neither left nor died."""
        return [a for a, p in self.procs.items() if p.hello and not p.bye and not p.dead]

    def unhandled(self, failure: MeshFailure) -> None:
        """A failure reached the top: run ``mpimesh.unhandled_fault_hook`` off the progress path."""
        try:
            self._supervisor.submit(self._run_hook, failure)
        except RuntimeError:
            # The interpreter (or this controller) is shutting down: the job
            # is ending anyway, so report instead of running the hook.
            warn(f"failure during shutdown:\n{failure.report()}")

    def _run_hook(self, failure: MeshFailure) -> None:
        # Returning means handled; raising means unhandled (Monarch's
        # contract), and the job ends.  The default hook reports the failure
        # and raises Unhandled; any other exception is added to the cause,
        # which the default hook then reports.
        hook = current_hook()
        if hook is default_unhandled_fault_hook and interactive_session():
            # A notebook or a prompt is not ended by one failed mesh (README, "Notebooks").
            report_and_go_on(failure.report())
            return
        try:
            hook(failure)
            return
        except Unhandled:
            pass
        except BaseException as exc:
            failure.cause += f"\n  unhandled_fault_hook raised {type(exc).__name__}: {exc}"
            try:
                default_unhandled_fault_hook(failure)
            except Unhandled:
                pass
        self._end_job()

    def _end_job(self) -> None:
        # An unhandled failure ends the job as Monarch's default hook does:
        # a KeyboardInterrupt in the main thread, so that the script's
        # `finally` blocks and atexit handlers run, and the job exits 1
        # (leave).  A script that has not begun to leave within
        # MPIMESH_SHUTDOWN_TIMEOUT (it caught the interrupt, it is stuck in
        # C code, SIGINT is ignored) is ended from here, at once.
        self.failed_unhandled = True
        if self._leaving.is_set():
            return  # the script has ended: leave() is stopping the job, and exits 1
        main = threading.main_thread()
        if (main.is_alive() and main is not threading.current_thread() and main.ident is not None
                and callable(signal.getsignal(signal.SIGINT))):
            signal.pthread_kill(main.ident, signal.SIGINT)
            # A daemon thread waits: the interpreter's exit joins the supervisor's.
            threading.Thread(target=self._end_unless_leaving, name="mpimesh-end-job", daemon=True).start()
            return
        self._end_now()

    def _end_unless_leaving(self) -> None:
        if not self._leaving.wait(settings.shutdown_timeout):
            self._end_now()

    def _end_now(self) -> None:
        # Stop every worker (bounded), then leave at once with status 1: the
        # script's threads may be blocked anywhere.
        try:
            self.shutdown(1)
        except BaseException:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

    # --- the end ----------------------------------------------------------------------------------

    def shutdown(self, code: int) -> bool:
        """Stop every process of the job; returns False if some did not answer.

        Blocks at most about ``MPIMESH_SHUTDOWN_TIMEOUT`` plus
        ``MPIMESH_CLEANUP_TIMEOUT`` seconds.
        """
        if self._closed:
            return True
        self._closed = True
        rt = self.rt
        cells = rt.actors.stop_all("controller exit", lambda: None, owned=False)
        rt.actors.wait_stopped(cells, settings.cleanup_timeout)
        rt.owners.end()  # the ownership tree's root closes with the job (docs/design/ownership.md)
        # Every island and the pool stop at once: one bound for the whole job,
        # not one per island (a spawned run can have dozens).
        islands = {island: self._stop_island(island, code) for island in list(self.islands)}
        pool = [a for a, p in self.procs.items() if a[0] == 0 and not p.bye and not p.dead]
        self._send_shutdown(pool, code)
        everyone = pool + [a for members in islands.values() for a in members]
        rt.wait(lambda: self._all_left(everyone), self.cond, settings.shutdown_timeout)
        clean = True
        for island, members in islands.items():
            left = self._all_left(members)
            clean &= left
            self._drop_island(island, members, left)
        if not self._all_left(pool):
            stuck = [a[1] for a in pool if not self.procs[a].bye and not self.procs[a].dead]
            warn(f"ranks {stuck} did not stop within {settings.shutdown_timeout:g} s; aborting the job")
            clean = False
        rt.drain_sends(1.0)
        self.printer.flush()
        self.request_stop(code)
        self._thread.join(1.0)
        self._service.shutdown(wait=False, cancel_futures=True)
        if self.liveness is not None:
            self.liveness.close()
        # Every worker has stopped: only now may the launcher hear the status
        # (an unhandled failure leaves with os._exit(1) right after this).
        set_job_exit_status(self._status(code, clean))
        return clean

    def _status(self, code: int, clean: bool) -> int:
        # The job's status: the script's, or 1 if it was 0 and some process
        # may still run (it did not stop, or it was declared dead unseen).
        return code if clean and not self.unconfirmed else code or 1

    def leave(self, code: int) -> int:
        """End this process after :meth:`shutdown`, in bounded time.

        Finalizes MPI unless a process of the job has died (MPI_Finalize can
        then spin forever), aborting the job if some process may still hang.

        Returns:
            The status this process should exit with: ``code``, or 0 when
            the launcher already holds ``code`` as the job's status
            (``_job_status``).
        """
        self._leaving.set()
        clean = self.shutdown(code)
        # Hooks of failures that arrived while the job ended run first (in
        # order, on the supervisor's one thread): they may set the status.
        try:
            self._supervisor.submit(lambda: None).result(settings.shutdown_timeout)
        except Exception:
            pass  # a hook that does not return: the job ends regardless
        if self.failed_unhandled:
            # the KeyboardInterrupt of _end_job, what the script made of it,
            # or a failure that reached the default hook as the job ended
            code = code or 1
        sys.stdout.flush()
        sys.stderr.flush()
        status = self._status(code, clean)
        own = 0 if set_job_exit_status(status) else code
        if not clean or self.unconfirmed:
            MPI.COMM_WORLD.Abort(status)
        if self.rt.dead and library().startswith("Open MPI"):
            # MPI_Finalize could spin forever: leave now, after what a
            # normal exit runs (unless atexit is what is running this).
            if not self._at_exit:
                _run_atexit()
            os._exit(own)
        return own

    def shutdown_at_exit(self) -> None:
        """Atexit hook of an embedded controller (``python script.py``).

        After an unhandled failure the script ends as Python ends on an
        uncaught KeyboardInterrupt (status 130), once the other atexit
        handlers have run.
        """
        self._at_exit = True
        self.leave(0)


def _run_atexit() -> None:
    # The script's atexit handlers, once: after this the process ends with os._exit.
    import atexit

    try:
        atexit._run_exitfuncs()
    except BaseException:
        traceback.print_exc()


#: PRRTE settings that let a spawned job outlive one of its processes (issue #3).
#: Without ``recoverable`` the singleton's PRRTE kills the rest of a
#: ``spawn_procs()`` group shortly after one of them dies; without
#: ``error_non_zero_exit=0`` a member's non-zero exit counts twice towards the
#: job's end (PRRTE 3.0.14 ``errmgr_dvm``) and ends the group just the same.
SPAWN_RECOVERY = {
    "PRTE_MCA_state_base_recoverable": "1",
    "PRTE_MCA_state_base_error_non_zero_exit": "0",
}


def _recoverable_spawns() -> None:
    """Make the jobs that this singleton will spawn survive the death of a member.

    A singleton starts its PRRTE at its first ``MPI_Comm_spawn``, with this
    process's environment, so the settings go there before any spawn.  A value
    the user set wins.
    """
    if library().startswith("Open MPI"):
        for name, value in SPAWN_RECOVERY.items():
            os.environ.setdefault(name, value)


def _remove_stale_sessions() -> None:
    """Remove this user's PRRTE and mpimesh session directories whose process is gone.

    A singleton's first MPI_Comm_spawn starts a PRRTE server whose session
    directory is named after its pid.  Processes killed outright (a crashed
    controller, a killed test) leave theirs behind, and once pids wrap around
    (pid_max is 32768 on many hosts) a new server that gets the same pid
    fails with "The PMIx server's listener thread failed to start".  A
    directory whose pid is alive is always kept.
    """
    import shutil
    import tempfile

    base = os.environ.get("PRTE_MCA_prte_tmpdir_base") or tempfile.gettempdir()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return
    uid = os.getuid()
    for entry in entries:
        prefix = "prte." if entry.name.startswith("prte.") else "mpimesh-" if entry.name.startswith("mpimesh-") else ""
        pid = entry.name[len(prefix):]
        if not prefix or not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            if not entry.is_dir(follow_symlinks=False) or entry.stat(follow_symlinks=False).st_uid != uid:
                continue
        except OSError:
            continue
        if not os.path.exists(f"/proc/{pid}"):
            shutil.rmtree(entry.path, ignore_errors=True)
