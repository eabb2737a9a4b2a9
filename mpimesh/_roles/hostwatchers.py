"""The controller's side of the host watch: who watches the workers of each other host.

A worker on another host is out of the controller's pidfds' reach, so on
each other host two workers watch the exits of the others there, and each
other (``_roles.hostwatch`` is the worker's side): a watcher's own death is
seen too, and another worker of its host takes its place.  The causes they
report (EXITED) wait here until the death's report takes them.
"""

from __future__ import annotations

from .._core import protocol
from .._core.runtime import Runtime
from .procs import Addr, ProcInfo, Procs

__all__ = ["HostWatchers"]

#: Workers per other host that watch the others' exits there (two: each sees the other's death).
_WATCHERS = 2


class HostWatchers:
    """On each other host, the workers that watch every other worker's exit there.

    Args:
        runtime: the controller's runtime.
        procs: the controller's table of workers.
    """

    def __init__(self, runtime: Runtime, procs: Procs) -> None:
        self.rt = runtime
        self.procs = procs
        #: host -> its watchers
        self.by_host: dict[str, list[Addr]] = {}
        #: how workers of other hosts ended, as their host's watcher reported (EXITED)
        self.exit_causes: dict[Addr, str] = {}

    def add(self, proc: ProcInfo) -> None:
        """Have workers of ``proc``'s host watch its exit, when that host is not this one."""
        if not proc.pid or proc.host == self.rt.host or proc.dead:
            return
        watchers = [w for w in self.by_host.get(proc.host, []) if not self.procs[w].dead]
        for watcher in watchers:
            if watcher != proc.addr:
                self._send_watch(watcher, [(proc.addr, proc.pid)])
        if len(watchers) < _WATCHERS and proc.addr not in watchers:
            watchers.append(proc.addr)
            self._send_watch(proc.addr, self._watchable(proc.host, but=proc.addr))
        self.by_host[proc.host] = watchers

    def died(self, proc: ProcInfo) -> None:
        """``proc`` died: if it was a watcher (the other one saw it), another worker of its host takes its place."""
        watchers = self.by_host.get(proc.host)
        if watchers is None or proc.addr not in watchers:
            return
        watchers.remove(proc.addr)
        for other, _ in self._watchable(proc.host, but=proc.addr):
            if other not in watchers:
                watchers.append(other)
                self._send_watch(other, self._watchable(proc.host, but=other))
                break

    def exited(self, addr: Addr, cause: str) -> None:
        """A watcher reported how ``addr`` ended; the report of its death takes it (:meth:`take_cause`)."""
        self.exit_causes[addr] = cause

    def take_cause(self, addr: Addr) -> str | None:
        """How ``addr`` ended, as its host's watcher reported, once; None if none did (yet)."""
        return self.exit_causes.pop(addr, None)

    def watched(self, addr: Addr) -> bool:
        """Whether a live worker of ``addr``'s host (another host) watches its exit."""
        proc = self.procs.get(addr)
        watchers = self.by_host.get(proc.host, []) if proc is not None else []
        return any(w != addr and not self.procs[w].dead for w in watchers)

    def _watchable(self, host: str, but: Addr) -> list[tuple[Addr, int]]:
        return [(p.addr, p.pid) for p in self.procs.values()
                if p.host == host and p.addr != but and p.hello and p.pid and not p.gone]

    def _send_watch(self, watcher: Addr, peers: list[tuple[Addr, int]]) -> None:
        if not peers:
            return
        try:
            self.rt.send(watcher, protocol.watch(peers))
        except ConnectionError:
            pass  # the watcher died: its death names another one
