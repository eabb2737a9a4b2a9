"""Spawned islands: workers made by ``MPI_Comm_spawn``, one island per spawn, and their links.

An island is the group of processes of one ``MPI_Comm_spawn_multiple``: it
gets the next island number, its intercommunicator becomes a link of the
router (``add_island``), and each member gets INIT, then says hello.  An
island is closed once no mesh holds any of its members (:meth:`Islands.close`)
or at the end of the job: SHUTDOWN, wait for the BYEs, then disconnect a
whole island, or kill what still runs of a broken one.

A singleton controller (no launch pool) starts its PRRTE at its first spawn:
:func:`prepare_singleton` readies the environment for it.
"""

from __future__ import annotations

import os
import sys
import time

from .._core import protocol
from .._core.logs import warn
from .._core.runtime import Runtime
from .._transport.mpi import MPI, dynamic, library
from ..config import settings
from .pool import Pool
from .procs import Addr, ProcInfo, Procs

__all__ = ["SPAWN_RECOVERY", "Islands", "prepare_singleton"]


class Islands:
    """The spawned islands: their members, their links, their spawn and their close.

    Args:
        runtime: the controller's runtime.
        procs: the controller's table of workers; each spawned one is added to it.
        pool: the launch pool, which says where the job runs and what to launch when a spawn fails.
    """

    def __init__(self, runtime: Runtime, procs: Procs, pool: Pool) -> None:
        self.rt = runtime
        self.procs = procs
        self.pool = pool
        #: island number -> its members, from its spawn until it is stopped
        self.members: dict[int, list[Addr]] = {}
        self._next = 1

    def spawn(self, counts: list[tuple[str, int]]) -> list[Addr]:
        """Spawn ``count`` workers on each ``host`` of ``counts``, as one new island; their addresses.

        The ``host`` info key places them, but only in a job of several
        hosts: on one host there is no choice to make, and a singleton's
        PRRTE may know its node by another name than the processor name.
        The new workers are handed to a mesh at once (``allocated``).

        Raises:
            RuntimeError: the spawn is not possible or failed (the message says what to launch instead).
            TimeoutError: a spawned worker did not say hello within ``MPIMESH_SPAWN_TIMEOUT``.
        """
        rt, procs = self.rt, self.procs
        n = sum(count for _, count in counts)
        place = self.pool.across_hosts
        if place and self._next > 1 and not _respawns_across_hosts():
            raise RuntimeError(self.pool.no_room(
                counts, "a second MPI_Comm_spawn is not tried in a job across hosts under Open MPI: it fails or hangs "
                "there (open-mpi/ompi#12601; MPIMESH_SPAWNS_ACROSS_HOSTS=always tries anyway)"))
        with procs.lock:
            island = self._next
            self._next += 1
        inter = self._spawn_multiple(island, counts, place)
        hosts = [host for host, count in counts for _ in range(count)]
        addrs = [(island, r) for r in range(n)]
        with procs.lock:
            for addr, host in zip(addrs, hosts, strict=True):
                procs.add(ProcInfo(addr, host, 0, hello=False, allocated=True))
            self.members[island] = addrs
        rt.router.add_island(inter, island)
        for addr in addrs:
            rt.send(addr, protocol.init(island, rt.host, rt.pid, list(sys.path)))

        def started() -> bool:
            return all(procs[a].hello or procs[a].dead for a in addrs)

        start = time.monotonic()
        end = start + settings.spawn_timeout
        while not rt.wait(started, procs.cond, max(0.0, min(settings.show_waits or 1e9, end - time.monotonic()))):
            now = time.monotonic()
            if now >= end:
                break
            ready = sum(procs[a].hello for a in addrs)
            warn(f"spawning {n} processes: {ready} ready after {now - start:.0f} s")
        if not started():
            missing = [a for a in addrs if not procs[a].hello]
            raise TimeoutError(
                f"spawned processes {missing} did not start within {settings.spawn_timeout:g} s; "
                "check that `python -m mpimesh --worker` runs on this host, or raise MPIMESH_SPAWN_TIMEOUT"
            )
        astray = [f"{a[0]}.{a[1]} on {procs[a].host} (asked: {h})"
                  for a, h in zip(addrs, hosts, strict=True) if place and procs[a].host != h]
        if astray:
            warn(f"MPI_Comm_spawn placed processes on other hosts than asked: {', '.join(astray)}; "
                 "their mesh coordinates do not match their hosts")
        return addrs

    def _spawn_multiple(self, island: int, counts: list[tuple[str, int]], place: bool) -> MPI.Intercomm:
        # The one MPI_Comm_spawn_multiple of an island, beside no MPI_Comm_connect (Open MPI cannot).
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
                raise RuntimeError(self.pool.no_room(counts, why))
            try:
                with self.rt.router.exclusive():
                    inter: MPI.Intercomm = MPI.COMM_SELF.Spawn_multiple(
                        [sys.executable] * len(counts), [args] * len(counts), [c for _, c in counts], infos
                    )
            finally:
                dynamic.release()
        except MPI.Exception as exc:
            why = f"MPI_Comm_spawn failed ({exc.Get_error_string()})"
            raise RuntimeError(self.pool.no_room(counts, why)) from None
        finally:
            for info in infos:
                info.Free()
        return inter

    # --- the end of an island ---------------------------------------------------------------------

    def close_unheld(self, islands: set[int]) -> None:
        """Close each of ``islands`` that no mesh holds a member of any more (blocking, bounded)."""
        for island in islands:
            members = self.members.get(island, [])
            if not any(self.procs[a].allocated for a in members):
                self.close(island, 0)

    def close(self, island: int, code: int) -> bool:
        """Stop ``island`` and wait for its processes to exit (each wait bounded); whether it stopped cleanly."""
        members = self.stop(island, code)
        clean = self.procs.wait_left(members, settings.shutdown_timeout)
        self.drop(island, members, clean)
        if clean:
            # stop() is done once the processes are gone: their interpreters
            # have finalized (module globals' __del__, as in Monarch) and
            # their memory, GPU memory included, is free.
            self.procs.wait_exited(members, settings.shutdown_timeout)
        return clean

    def stop(self, island: int, code: int) -> list[Addr]:
        """Send SHUTDOWN to an island's live processes and forget the island; returns its members."""
        with self.procs.lock:
            members = self.members.pop(island, [])
        self.procs.send_shutdown(members, code)
        return members

    def drop(self, island: int, members: list[Addr], clean: bool) -> None:
        """Unlink an island that was asked to stop: disconnect a whole one, kill what still runs of the rest."""
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
                if not self.procs[addr].gone:
                    self.procs.kill(self.procs[addr])


def _respawns_across_hosts() -> bool:
    """Whether a job across hosts may spawn more than once (MPIMESH_SPAWNS_ACROSS_HOSTS)."""
    return settings.spawns_across_hosts == "always" or not library().startswith("Open MPI")


# --- a singleton's PRRTE ---------------------------------------------------------------------------

#: PRRTE settings that let a spawned job outlive one of its processes (issue #3).
#: Without ``recoverable`` the singleton's PRRTE kills the rest of a
#: ``spawn_procs()`` group shortly after one of them dies; without
#: ``error_non_zero_exit=0`` a member's non-zero exit counts twice towards the
#: job's end (PRRTE 3.0.14 ``errmgr_dvm``) and ends the group just the same.
SPAWN_RECOVERY = {
    "PRTE_MCA_state_base_recoverable": "1",
    "PRTE_MCA_state_base_error_non_zero_exit": "0",
}


def prepare_singleton(fault_tolerant: bool) -> None:
    """Ready a controller without a launch pool for its first ``MPI_Comm_spawn``, which starts its PRRTE.

    Args:
        fault_tolerant: the job outlives a dead process (ULFM): so must the
            jobs this singleton spawns.
    """
    _remove_stale_sessions()
    if fault_tolerant:
        _recoverable_spawns()


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
