"""The dashboard's data path in a live job, without a browser: one look, a stack, metrics from an endpoint."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

import mpimesh
from mpimesh import Actor, endpoint
from mpimesh._core import current, journal
from mpimesh._dashboard import _metrics
from mpimesh._dashboard._collect import Collector, addr_text, stack_of

pytestmark = pytest.mark.mesh

#: How long a busy endpoint may stay busy: its bound, not its length.  A test ends it, once it has looked,
#: with a :class:`Releaser` on the endpoint's process, so the suite does not wait the rest out (it waited 2.5 +
#: 1.5 + 1.5 s of every run of it, idle: CI runs the mesh suite 8 times).
BUSY_BOUND = 30.0
#: Set in a worker process: its busy endpoints return (each clears it as it starts).
_released = threading.Event()


class Releaser(Actor):
    """Ends the busy endpoints of its process (another actor's thread, the same module globals)."""

    @endpoint
    def release(self) -> None:
        _released.set()


class Watched(Actor):
    @endpoint
    def learn(self, steps: int) -> int:
        for step in range(steps):
            mpimesh.log_metric("collect-test", float(step), step=step)
        return os.getpid()

    @endpoint
    def wait_here(self, seconds: float) -> None:
        _released.clear()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not _released.is_set():
            time.sleep(0.02)


def _mesh(snapshot: dict[str, Any], name: str) -> dict[str, Any]:
    (mesh,) = [m for m in snapshot["meshes"] if m["name"] == name]
    return mesh


def test_one_look_sees_the_mesh_its_metrics_and_a_busy_actor(procs: Any) -> None:
    watched = procs.spawn("watched", Watched)
    watched.learn.call(5).get(30)
    rt = current.current()
    collector = Collector()
    snap = collector.collect(rt)
    mesh = _mesh(snap, "watched")
    assert mesh["sizes"] == [2] and [r["state"] for r in mesh["ranks"]] == ["running", "running"], mesh
    addrs = [r["addr"] for r in mesh["ranks"]]
    procs_by_addr = {p["addr"]: p for p in snap["procs"]}
    assert all(procs_by_addr[a]["rss"] > 0 and f"watched[{i}]" in procs_by_addr[a]["actors"]
               for i, a in enumerate(addrs)), snap["procs"]
    assert addr_text(rt.addr) in procs_by_addr
    assert any(addrs == pm["procs"] for pm in snap["proc_meshes"]), snap["proc_meshes"]
    _, series = _metrics.series()
    got = {s.source: [p[1] for p in s.points] for s in series if s.name == "collect-test"}
    assert got == {"watched[0]": [0.0, 1.0, 2.0, 3.0, 4.0], "watched[1]": [0.0, 1.0, 2.0, 3.0, 4.0]}, got

    releaser = procs.slice(gpus=1).spawn("releaser", Releaser)
    releaser.initialized.get(30)
    busy = watched.slice(gpus=1).wait_here.call_one(BUSY_BOUND)
    time.sleep(0.5)
    rank = _mesh(collector.collect(rt), "watched")["ranks"][1]
    assert rank["state"] == "busy" and rank["busy"] == "wait_here" and rank["busy_for"] > 0.2, rank
    assert rank["addr"] == addrs[1]
    island, _, number = addrs[1].partition(".")
    threads = stack_of((int(island), int(number)))
    (mine,) = [t for t in threads if t["actor"].startswith("watched[1]")]
    assert mine["busy"] == "wait_here" and mine["frames"][-1][2] == "wait_here", mine
    releaser.release.call_one().get(30)
    busy.get(30)
    releaser.stop().get(30)
    watched.stop().get(30)
    assert all(m["name"] != "watched" for m in collector.collect(rt)["meshes"])


class WatchedAsync(Actor):
    @endpoint
    async def wait_here(self, seconds: float) -> str:
        import asyncio

        _released.clear()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not _released.is_set():
            await asyncio.sleep(0.02)
        return "done"


def test_an_async_endpoint_shows_busy_until_its_coroutine_ends(procs: Any) -> None:
    watched = procs.spawn("watchedasync", WatchedAsync)
    releaser = procs.slice(gpus=0).spawn("releaser", Releaser)
    watched.initialized.get(30)
    releaser.initialized.get(30)
    rt = current.current()
    collector = Collector()
    busy = watched.slice(gpus=0).wait_here.call_one(BUSY_BOUND)
    time.sleep(0.5)
    rank = _mesh(collector.collect(rt), "watchedasync")["ranks"][0]
    assert rank["state"] == "busy" and rank["busy"] == "wait_here" and rank["busy_for"] > 0.2, rank
    releaser.release.call_one().get(30)
    assert busy.get(30) == "done"
    releaser.stop().get(30)
    rank = _mesh(collector.collect(rt), "watchedasync")["ranks"][0]
    assert rank["state"] == "running", rank
    watched.stop().get(30)


class Spawner(Actor):
    """Spawns an actor mesh of its own, on its process: not in the controller's ownership tree."""

    def __init__(self) -> None:
        self.child = mpimesh.this_proc().spawn("childofactor", Watched)

    @endpoint
    def ready(self) -> bool:
        self.child.initialized.get(30)
        return True

    @endpoint
    def busy_child(self) -> None:
        self.child.wait_here.call_one(BUSY_BOUND)  # not waited for: the child stays busy until released

    @endpoint
    def release_child(self) -> None:
        _released.set()  # the child's process is this one


def test_an_actor_mesh_spawned_by_an_actor_has_its_grid(procs: Any) -> None:
    spawner = procs.slice(gpus=1).spawn("spawner", Spawner)
    assert spawner.ready.call_one().get(30) is True
    rt = current.current()
    collector = Collector()
    mesh = _mesh(collector.collect(rt), "childofactor")
    assert mesh["class"] == "Watched" and mesh["spawned_by"] == "an actor", mesh
    assert [r["state"] for r in mesh["ranks"]] == ["running"] and len(mesh["sizes"]) == len(mesh["labels"]), mesh
    spawner.busy_child.call_one().get(30)
    time.sleep(0.5)
    (rank,) = _mesh(collector.collect(rt), "childofactor")["ranks"]
    assert rank["state"] == "busy" and rank["busy"] == "wait_here", rank
    spawner.release_child.call_one().get(30)
    spawner.stop().get(30)  # stops what it owns: the child's grid goes
    assert all(m["name"] != "childofactor" for m in collector.collect(rt)["meshes"])


def test_the_collector_sleeps_until_watched_and_wakes_on_an_event() -> None:
    collector = Collector()
    time.sleep(0.3)
    assert collector.version == 0  # nobody watches: no look
    collector.watch()
    try:
        assert collector.wait_version(0, 10) >= 1
        seen = collector.version
        woke = threading.Event()

        def wait() -> None:
            collector.wait_version(seen, 5)
            woke.set()

        threading.Thread(target=wait, daemon=True).start()
        journal.event("test", "an event wakes the collector before its period")
        assert woke.wait(5)
    finally:
        collector.unwatch()
