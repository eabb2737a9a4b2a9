"""A worker's watch over its host's other workers, for a controller on another host (``_roles.hostwatch``, pure).

The watched processes here are children of the test (zombies until reaped,
so their wait status is there to read); the runtime is a stand-in that
records what would go to the controller.  Across real hosts the fault
matrix (tests/hosts/test_hosts_faults.py) pins the causes end to end.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from mpimesh._core.protocol import Kind
from mpimesh._roles.hostwatch import HostWatch
from mpimesh._roles.liveness import last_words_path

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="pidfds are Linux's (5.3)")


class Runtime:
    """What HostWatch uses of a worker's runtime: its address, the controller's pid, ticks, sends."""

    def __init__(self) -> None:
        self.addr = (0, 1)
        self.controller_pid = os.getpid()
        self.sent: list[tuple[Any, ...]] = []
        self.ticks: list[Callable[[], None]] = []

    def every_ms(self, tick: Callable[[], None]) -> None:
        self.ticks.append(tick)

    def send(self, dest: Any, frame: tuple[Any, ...]) -> None:
        self.sent.append((dest, frame))


def child(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", f"import os, signal, sys, time; {code}"])


def reports(rt: Runtime, count: int) -> list[tuple[Any, ...]]:
    """Tick until ``count`` EXITED frames went to the controller (bounded)."""
    deadline = time.monotonic() + 30
    while len(rt.sent) < count:
        assert time.monotonic() < deadline, rt.sent
        for tick in rt.ticks:
            tick()
        time.sleep(0.005)
    return [frame for _, frame in rt.sent]


def test_each_exit_is_reported_with_its_cause() -> None:
    """A kill and an exit without a word, each reported once, to the controller, with what ended it."""
    rt = Runtime()
    watch = HostWatch(rt)
    killed, exited = child("time.sleep(60)"), child("time.sleep(0.2); os._exit(3)")
    try:
        watch.add([((0, 2), killed.pid), ((0, 3), exited.pid), (rt.addr, os.getpid())])  # not itself
        killed.kill()
        frames = reports(rt, 2)
        by = {frame[2]: frame[3] for frame in frames}
        assert [f[0] for f in frames] == [Kind.EXITED, Kind.EXITED] and set(by) == {(0, 2), (0, 3)}
        assert all(dest == (0, 0) for dest, _ in rt.sent)
        assert re.fullmatch(r"the process this actor was running on failed: Killed\(sig=9\) .*", by[(0, 2)])
        assert by[(0, 3)].startswith("the process this actor was running on exited with code 3 without a word")
        for tick in rt.ticks:
            tick()
        assert len(rt.sent) == 2 and watch.reported == 2
    finally:
        for p in (killed, exited):
            p.kill()
            p.wait()


def test_last_words_on_this_host_give_the_cause() -> None:
    """A fatal signal's last words, left in the host's job directory, name it as Monarch does."""
    rt = Runtime()
    path = last_words_path(rt.controller_pid, (0, 4))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    crashed = child("time.sleep(60)")
    try:
        with open(path, "w") as f:
            f.write("Fatal Python error: Segmentation fault\n\nCurrent thread ...\n")
        watch = HostWatch(rt)
        watch.add([((0, 4), crashed.pid)])
        crashed.kill()
        (frame,) = reports(rt, 1)
        assert frame[3] == "killed by a fatal signal (Segmentation fault, Killed(sig=11))"
        assert not os.path.exists(path)
    finally:
        crashed.kill()
        crashed.wait()
        shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def test_a_peer_gone_before_the_watch_is_reported_at_once_and_close_stops_watching() -> None:
    rt = Runtime()
    watch = HostWatch(rt)
    gone = child("pass")
    gone.wait()  # reaped: no pid to open
    watch.add([((0, 5), gone.pid)])
    assert [frame[2] for _, frame in rt.sent] == [(0, 5)]
    alive = child("time.sleep(60)")
    try:
        watch.add([((0, 6), alive.pid)])
        watch.close()
        alive.kill()
        alive.wait()
        for tick in rt.ticks:
            tick()
        assert len(rt.sent) == 1
    finally:
        alive.kill()
        alive.wait()
