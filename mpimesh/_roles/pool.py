"""The launch pool: ranks 1..N-1 of the launch world, handed to meshes host by host.

A pool rank is *free* when no mesh holds it and it has not died: there is no
list of free ranks to keep in step, the rows of ``_roles.procs`` say it
(``allocated``, ``dead``).  A new mesh takes the free ranks of each host it
asks for, lowest rank first, so that placement is deterministic; what the
pool lacks on a host is spawned there (``_roles.islands``), and the pool says
what to launch instead when that is not possible (:meth:`Pool.no_room`).
"""

from __future__ import annotations

from .procs import Addr, ProcInfo, Procs

__all__ = ["Pool"]


class Pool:
    """The launch pool's ranks, who of them is free, and the job's hosts.

    Args:
        procs: the controller's table of workers; the pool's rows are added to it.
        host: the controller's host.
        ranks: ``(addr, host, pid)`` of every launch-pool worker, in rank order.
    """

    def __init__(self, procs: Procs, host: str, ranks: list[tuple[Addr, str, int]]) -> None:
        self.procs = procs
        for addr, where, pid in ranks:
            procs.add(ProcInfo(addr, where, pid))
        #: every pool rank, in rank order
        self.ranks: list[Addr] = [addr for addr, _, _ in ranks]
        #: the job's hosts in launch order: the controller's, then each new one of the pool's ranks
        self.hosts: list[str] = list(dict.fromkeys([host, *(where for _, where, _ in ranks)]))
        self._host = host

    @property
    def across_hosts(self) -> bool:
        """Whether the job runs on several hosts (then a spawn names the host of each process)."""
        return len(self.hosts) > 1

    def is_free(self, addr: Addr) -> bool:
        """Whether the pool rank ``addr`` can be handed to a new mesh: no mesh holds it and it has not died."""
        proc = self.procs[addr]
        return not proc.allocated and not proc.dead

    def free_ranks(self, host: str | None = None) -> list[Addr]:
        """The free pool ranks (of ``host``, if given), lowest first."""
        with self.procs.lock:
            return [a for a in self.ranks if self.is_free(a) and (host is None or self.procs[a].host == host)]

    def live_ranks(self) -> list[Addr]:
        """The pool ranks that have neither left nor died."""
        return [a for a in self.ranks if not self.procs[a].gone]

    def take(self, per_host: int, hosts: list[str]) -> tuple[list[list[Addr]], list[tuple[str, int]]]:
        """Hand up to ``per_host`` free ranks of each of ``hosts`` to a new mesh.

        Returns:
            The ranks taken, one row per host of ``hosts``, and what is
            missing: ``(host, count)`` for each host whose row is short.
        """
        rows: list[list[Addr]] = []
        missing: list[tuple[str, int]] = []
        with self.procs.lock:
            for host in hosts:
                take = self.free_ranks(host)[:per_host]
                for addr in take:
                    self.procs[addr].allocated = True
                rows.append(take)
                if len(take) < per_host:
                    missing.append((host, per_host - len(take)))
        return rows, missing

    def take_spares(self, hosts: list[str]) -> list[Addr | None]:
        """One free rank (a spare) for each of ``hosts``, to replace a dead process there (``ProcMesh.heal``).

        Every free pool rank is a spare.  For each wanted host a spare of that
        host is taken first; what is left is served, in order, by the free
        ranks of the other hosts (those of the controller's host last: it
        runs the script); ``None`` where no spare is left, for the caller to
        spawn.
        """
        with self.procs.lock:
            free = self.free_ranks()
            picked: list[Addr | None] = []
            for host in hosts:
                here = next((a for a in free if self.procs[a].host == host), None)
                picked.append(here)
                if here is not None:
                    free.remove(here)
            free.sort(key=lambda a: (self.procs[a].host == self._host, a))
            for i, addr in enumerate(picked):
                if addr is None and free:
                    picked[i] = free.pop(0)
            for addr in picked:
                if addr is not None:
                    self.procs[addr].allocated = True
            return picked

    def host_lives(self, host: str) -> bool:
        """Whether ``host`` still runs a live process of the job (the controller's host always does)."""
        return host == self._host or any(p.host == host and not p.gone for p in self.procs.values())

    def give_back(self, addrs: list[Addr]) -> None:
        """No mesh holds ``addrs`` any more: the pool's ranks among them are free again (unless dead)."""
        with self.procs.lock:
            for addr in addrs:
                self.procs[addr].allocated = False

    def no_room(self, counts: list[tuple[str, int]], why: str) -> str:
        """Why ``count`` processes on each ``host`` of ``counts`` cannot start, and what to launch instead."""
        n = sum(count for _, count in counts)
        where = ", ".join(f"{count} on {host}" for host, count in counts)
        ranks = n + 1 + len(self.procs) - len(self.free_ranks())
        if self.across_hosts:
            slots = {h: sum(self.procs[a].host == h for a in self.ranks) + (h == self._host) for h in self.hosts}
            for host, count in counts:
                slots[host] += count
            fix = (f"launch with enough ranks on each host for the meshes (e.g. `mpirun --host "
                   f"{','.join(f'{h}:{c}' for h, c in slots.items())}`, `srun --ntasks-per-node=...`)")
        else:
            fix = (f"launch with more ranks (e.g. `mpirun -n {ranks} python -m mpimesh ...`, or more srun tasks: "
                   "spawning is not possible under srun)")
        return f"cannot start {n} worker processes ({where}): the launch pool has no free rank there and {why}; {fix}"
