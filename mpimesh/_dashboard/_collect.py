"""The controller's side of the dashboard: what the job looks like now, gathered once a second while watched.

A :class:`Collector` thread sleeps while no page is open.  While one is
(:meth:`Collector.watch`), it asks every live process for its figures once
a second, sooner when the runtime records an event (a death, a failure, a
heal), over mpimesh's own messages (the debugger's DEBUG request
``"dash.stats"``, see ``_probe``), and folds them with what the controller
knows itself (its process table, the actor and process meshes of its
ownership tree, the deaths) into one plain-data snapshot that every open
page is sent.  The collector never holds a lock of the runtime while it
waits, and waits for no process longer than :data:`ANSWER_WITHIN`: a
process that does not answer is shown as such.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any

from .._core import current as _current
from .._core import journal, protocol
from .._core.owners import Kind
from .._core.ports import OneReply
from ..debug._worker import stacks
from . import _metrics
from ._probe import stats

__all__ = ["ANSWER_WITHIN", "PERIOD", "Collector", "addr_text", "stack_of"]

#: Seconds between two looks while a page is open.
PERIOD = 1.0
#: Seconds a process has to answer a look.
ANSWER_WITHIN = 0.8
#: The least seconds between two looks (a burst of events, a host lost, makes one look, not one each).
MIN_GAP = 0.1

Addr = tuple[int, int]


def addr_text(addr: Addr) -> str:
    """``(0, 3)`` -> ``"0.3"``, as the runtime's reports name processes."""
    return f"{addr[0]}.{addr[1]}"


class _Answer(OneReply):
    """The answer to a look: delivered without drawing the controller out of its naps (``Progress.quiet``)."""

    def __init__(self, rt: Any, op: str, addr: Addr) -> None:
        super().__init__(f"dashboard {op}", f"dashboard {op} on {addr_text(addr)}", addr)
        self._progress = rt.progress

    def deliver(self, index: int, status: int, body: Any, buffers: list[Any], src: Addr) -> bool:
        self._progress.quiet()
        return super().deliver(index, status, body, buffers, src)


def _ask(rt: Any, addrs: list[Addr], op: str, arg: Any, timeout: float) -> dict[Addr, Any]:
    """Send DEBUG ``op`` to each of ``addrs``; their answers within ``timeout`` seconds (an exception for a failure).

    This thread only sleeps until the answers are in: whoever polls anyway
    (the script's thread waiting for its own calls, or the progress thread,
    woken by the workers' bells) delivers them.  Waiting with ``get()``
    would make this thread a second poller beside a script that calls,
    and two pollers of one process slow each other's round trips.
    """
    waits: dict[Addr, tuple[_Answer, int]] = {}
    for addr in addrs:
        reply = _Answer(rt, op, addr)
        port_id = rt.ports.open(reply)
        try:
            rt.send(addr, protocol.debug(op, (arg, (rt.addr, port_id))))
        except ConnectionError:
            rt.ports.close(port_id)
            continue
        waits[addr] = (reply, port_id)
    concurrent.futures.wait([wait[0] for wait in waits.values()], timeout)
    answers: dict[Addr, Any] = {}
    for addr, (reply, port_id) in waits.items():
        if not reply.done():
            rt.ports.close(port_id)  # a late answer is dropped
        elif reply.exception(0) is not None:  # the process died meanwhile
            answers[addr] = reply.exception(0)
        else:
            answers[addr] = reply.get(0)
    return answers


def stack_of(addr: Addr, timeout: float = 5.0) -> list[dict[str, Any]]:
    """The Python stacks of every thread of the process at ``addr`` (blocking, up to ``timeout`` seconds).

    Raises:
        LookupError: the process is not live, or did not answer in time.
    """
    rt = _current.current()
    if addr == rt.addr:
        return stacks(rt)
    if addr in rt.dead:
        raise LookupError(f"process {addr_text(addr)} is dead: {rt.dead[addr]}")
    answer = _ask(rt, [addr], "stack", None, timeout).get(addr)
    if answer is None:
        raise LookupError(f"process {addr_text(addr)} did not answer within {timeout:g} s")
    if isinstance(answer, Exception):
        raise LookupError(f"process {addr_text(addr)}: {answer}")
    return list(answer)


class Collector:
    """Gathers the job's snapshot once a second while at least one page watches (see the module)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._watchers = 0
        # called (on the collector's thread) at each new snapshot: wake the pages' streams
        self._listeners: list[Callable[[], None]] = []
        #: the last snapshot (plain data) and its number; 0: none yet
        self.snapshot: dict[str, Any] = {}
        self.version = 0
        # (addr, actor key) -> (time, calls, bytes) at the last look, for the rates
        self._last_counts: dict[tuple[Addr, str], tuple[float, int, int]] = {}
        self._thread = threading.Thread(target=self._run, name="mpimesh-dashboard-collector", daemon=True)
        self._thread.start()

    # --- watchers ---------------------------------------------------------------------------------

    def watch(self, listener: Callable[[], None] | None = None) -> None:
        """A page opened: look at the job now, then every second until the last page closes.

        Args:
            listener: called at each new snapshot, on the collector's thread (quick, never blocking).
        """
        with self._cond:
            self._watchers += 1
            if listener is not None:
                self._listeners.append(listener)
            self._cond.notify_all()

    def unwatch(self, listener: Callable[[], None] | None = None) -> None:
        """A page closed (``listener``: the one it passed to :meth:`watch`)."""
        with self._cond:
            self._watchers = max(0, self._watchers - 1)
            if listener in self._listeners:
                self._listeners.remove(listener)

    @property
    def watchers(self) -> int:
        """How many pages watch now."""
        return self._watchers

    def wait_version(self, after: int, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for a snapshot newer than number ``after``; the newest number (blocking)."""
        with self._cond:
            self._cond.wait_for(lambda: self.version > after, timeout)
            return self.version

    # --- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        seen, last = 0, 0.0
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._watchers > 0)
            time.sleep(max(0.0, last + MIN_GAP - time.monotonic()))
            last = time.monotonic()
            rt = _current.runtime
            if rt is not None:
                try:
                    snap = self.collect(rt)
                except Exception as exc:  # the job is ending under us: say so on the page, try again
                    snap = {"time": time.time(), "error": f"{type(exc).__name__}: {exc}"}
                with self._cond:
                    self.snapshot = snap
                    self.version += 1
                    self._cond.notify_all()
                    listeners = list(self._listeners)
                for listener in listeners:
                    listener()
            # the next look in a second, or at once when the runtime records an event
            seen = journal.wait_event(seen, PERIOD)

    def collect(self, rt: Any) -> dict[str, Any]:
        """One look at the whole job (blocking up to :data:`ANSWER_WITHIN` seconds)."""
        role = rt.role
        table = getattr(role, "procs", None)
        rows = list(table.values()) if table is not None else []
        dead: dict[Addr, str] = dict(rt.dead)
        live = [p.addr for p in rows if not p.gone and p.addr not in dead]
        answers = _ask(rt, live, "dash.stats", None, ANSWER_WITHIN)
        answers[rt.addr] = stats(rt)
        for answer in answers.values():
            if isinstance(answer, dict):
                _metrics.take(answer.pop("metrics", []))
        now = time.time()
        procs = [self._proc(rt.addr, rt.host, rt.pid, "controller", "", answers.get(rt.addr), now)]
        for p in rows:
            if p.addr in dead:
                state, cause = "failed", dead[p.addr]
            elif p.bye:
                state, cause = "stopped", ""
            elif not isinstance(answers.get(p.addr), dict):
                state, cause = "silent", str(answers.get(p.addr) or "no answer within 0.8 s")
            else:
                state, cause = ("running" if p.allocated else "spare"), ""
            procs.append(self._proc(p.addr, p.host, p.pid, state, cause, answers.get(p.addr), now))
        hosts: dict[str, list[str]] = {}
        for proc in procs:
            hosts.setdefault(proc["host"], []).append(proc["addr"])
        return {
            "time": now, "hosts": hosts, "procs": procs, "meshes": self._meshes(rt, answers, dead, now),
            "proc_meshes": self._proc_meshes(rt), "watchers": self._watchers,
        }

    def _proc(self, addr: Addr, host: str, pid: int, state: str, cause: str, answer: Any,
              now: float) -> dict[str, Any]:
        figures = answer if isinstance(answer, dict) else {}
        return {
            "addr": addr_text(addr), "host": host, "pid": pid, "state": state, "cause": cause,
            "cpu": figures.get("cpu"), "rss": figures.get("rss"), "buffers": figures.get("buffers"),
            "pool": figures.get("pool"), "gpu": figures.get("gpu"),
            "actors": [f"{a['name']}[{a['rank']}]" for a in figures.get("actors", [])],
        }

    def _meshes(self, rt: Any, answers: dict[Addr, Any], dead: dict[Addr, str], now: float) -> list[dict[str, Any]]:
        # (addr, key) -> the actor's figures, from its process's answer
        actors: dict[tuple[Addr, str], dict[str, Any]] = {}
        for addr, answer in answers.items():
            if isinstance(answer, dict):
                for actor in answer.get("actors", []):
                    actors[(addr, actor["key"])] = actor
        meshes = []
        for node in rt.owners.of_kind(Kind.ACTOR_MESH):
            owned = node.payload
            key = repr(node.key)
            shape = owned.shape
            ranks, calls, nbytes = [], 0.0, 0.0
            for rank, addr in enumerate(owned.addrs):
                actor = actors.get((addr, key))
                cell: dict[str, Any]
                if addr in dead:
                    cell = {"state": "failed", "why": dead[addr]}
                elif actor is None:
                    cell = {"state": "stopped" if not isinstance(answers.get(addr), Exception) and addr in answers
                            else "unknown", "why": ""}
                elif actor["phase"] == "failed":
                    cell = {"state": "failed", "why": actor["why"]}
                elif actor["busy"]:
                    cell = {"state": "busy", "why": "", "busy": actor["busy"], "busy_for": actor["busy_for"]}
                elif actor["phase"] == "running":
                    cell = {"state": "running", "why": ""}
                else:
                    cell = {"state": actor["phase"], "why": ""}
                cell.update(rank=rank, addr=addr_text(addr), coords=shape.coordinates(rank) if shape.labels else {})
                ranks.append(cell)
                if actor is not None:
                    rate = self._rate((addr, key), now, actor["calls"], actor["bytes"])
                    calls, nbytes = calls + rate[0], nbytes + rate[1]
            meshes.append({
                "name": owned.name, "class": owned.class_name, "key": key, "labels": list(shape.labels),
                "sizes": list(shape.sizes), "ranks": ranks, "calls_per_s": calls, "bytes_per_s": nbytes,
            })
        meshes.extend(self._meshes_of_actors(actors, {m["key"] for m in meshes}, dead, now))
        return meshes

    def _meshes_of_actors(self, actors: dict[tuple[Addr, str], dict[str, Any]], known: set[str],
                          dead: dict[Addr, str], now: float) -> list[dict[str, Any]]:
        # Actor meshes an actor spawned on the workers: not in the controller's ownership
        # tree, so their grid is made from what their processes answered (each actor
        # knows its point in its mesh); a rank whose process did not answer is unknown.
        found: dict[str, dict[int, tuple[Addr, dict[str, Any]]]] = {}
        for (addr, key), actor in actors.items():
            if key not in known:
                found.setdefault(key, {})[actor["rank"]] = (addr, actor)
        meshes = []
        for key, by_rank in found.items():
            first = next(iter(by_rank.values()))[1]
            size = 1
            for n in first["sizes"]:
                size *= n
            ranks, calls, nbytes = [], 0.0, 0.0
            for rank in range(size):
                if rank not in by_rank:
                    ranks.append({"state": "unknown", "why": "its process did not answer", "rank": rank,
                                  "addr": "", "coords": {}})
                    continue
                addr, actor = by_rank[rank]
                if addr in dead:
                    cell: dict[str, Any] = {"state": "failed", "why": dead[addr]}
                elif actor["phase"] == "failed":
                    cell = {"state": "failed", "why": actor["why"]}
                elif actor["busy"]:
                    cell = {"state": "busy", "why": "", "busy": actor["busy"], "busy_for": actor["busy_for"]}
                else:
                    cell = {"state": actor["phase"], "why": ""}
                cell.update(rank=rank, addr=addr_text(addr), coords=actor["coords"])
                ranks.append(cell)
                rate = self._rate((addr, key), now, actor["calls"], actor["bytes"])
                calls, nbytes = calls + rate[0], nbytes + rate[1]
            meshes.append({
                "name": first["name"], "class": first["class"], "key": key, "labels": first["labels"],
                "sizes": first["sizes"], "ranks": ranks, "calls_per_s": calls, "bytes_per_s": nbytes,
                "spawned_by": "an actor",
            })
        return meshes

    def _rate(self, which: tuple[Addr, str], now: float, calls: int, nbytes: int) -> tuple[float, float]:
        last = self._last_counts.get(which)
        self._last_counts[which] = (now, calls, nbytes)
        if last is None or now <= last[0]:
            return (0.0, 0.0)
        wall = now - last[0]
        return ((calls - last[1]) / wall, (nbytes - last[2]) / wall)

    def _proc_meshes(self, rt: Any) -> list[dict[str, Any]]:
        out = []
        for node in rt.owners.of_kind(Kind.PROC_MESH):
            mesh = node.payload
            addrs = getattr(mesh, "addresses", [])
            out.append({"name": node.name, "procs": [addr_text(a) for a in addrs]})
        return out
