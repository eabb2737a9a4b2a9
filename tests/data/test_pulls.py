"""Reads by pull (``_data.pulls``): an RDMABuffer read as one two-sided message served by the owner's poller.

Across hosts every read of CPU memory goes this way (the mesh suite's RDMA
tests run across two simulated hosts in CI); here the path is forced on one
host (``rma._force = "pull"``) so that every case runs everywhere: data
read by the controller and by another worker, while the owner's only actor
sleeps inside an endpoint; a dropped buffer; an owner that stops polling
(``TimeoutError``, and the next read still right); an owner killed while a
read waits (``SupervisionError``).
"""

from __future__ import annotations

import re

import mpitest
import pytest
from mpitest import EXIT_BOUND, python_cmd

pytestmark = pytest.mark.subprocess

SCRIPT = r'''
import json, os, signal, sys, time
import torch
import mpimesh
from mpimesh import Actor, Channel, RDMABuffer, SupervisionError, endpoint, rma, this_host
from mpimesh._core import current

N = 1 << 20  # 4 MiB of float32
rma._force = "pull"


def emit(**row):
    print("ROW " + json.dumps(row), flush=True)


def outcome(fn):
    start = time.monotonic()
    try:
        value = fn()
        return {"type": None, "value": value, "seconds": time.monotonic() - start}
    except Exception as exc:
        return {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


class O(Actor):
    def __init__(self, fill):
        self.t = torch.full((N,), float(fill))
        self.b = RDMABuffer(self.t.view(torch.uint8))

    @endpoint
    def handle(self):
        return self.b

    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def drop(self):
        self.b.drop().get(10)

    @endpoint
    def busy(self, port, seconds):
        port.send("busy")
        time.sleep(seconds)  # the actor's thread is here; the pulls are served by the poller
        return current.current().pulls.served

    @endpoint
    def read(self, handle):
        rma._force = "pull"
        dst = torch.zeros(N)
        handle.read_into(dst.view(torch.uint8)).get(30)
        return float(dst.sum())

    @endpoint
    def stall(self, port, seconds):
        with current.current().progress.holding():  # no MPI progress in this process meanwhile
            port.send("stalling")
            time.sleep(seconds)


def read(handle, timeout=30.0):
    dst = torch.zeros(N)
    handle.read_into(dst.view(torch.uint8), timeout=timeout).get(60)
    return float(dst.sum())


mpimesh.unhandled_fault_hook = lambda failure: None
procs = this_host().spawn_procs(per_host={"gpus": 3})
owners = procs.spawn("owners", O, 2.0)
a, b, c = (owners.slice(gpus=r) for r in range(3))
h = a.handle.call_one().get(30)
emit(adverb="backend", value=h.backend)
emit(adverb="controller", **outcome(lambda: read(h)))
emit(adverb="worker", **outcome(lambda: b.read.call_one(h).get(60)))
port, receiver = Channel.open()
busy = a.busy.call_one(port, 3.0)
receiver.recv().get(30)
emit(adverb="while_busy", **outcome(lambda: read(h)))
emit(adverb="served", value=busy.get(30))
a.drop.call_one().get(30)
emit(adverb="dropped", **outcome(lambda: read(h)))
h2 = b.handle.call_one().get(30)
b.stall.call_one(port, 3.0)
receiver.recv().get(30)
emit(adverb="stalled", **outcome(lambda: read(h2, timeout=0.5)))
time.sleep(3.0)
emit(adverb="after_stall", **outcome(lambda: read(h2)))
h3 = c.handle.call_one().get(30)
pid = c.pid.call_one().get(30)
os.kill(pid, signal.SIGSTOP)
fut = h3.read_into(torch.zeros(N).view(torch.uint8), timeout=60)
time.sleep(0.2)
os.kill(pid, signal.SIGKILL)
emit(adverb="owner_killed", **outcome(lambda: fut.get(30)))
procs.stop().get(60)
print("END", flush=True)
'''

BUFFER = r"<RDMABuffer 4194304 bytes of cpu memory of owners\[{}\]@\d+\.\d+ \(process \d+\.\d+\)>"


def test_reads_by_pull(tmp_path: object) -> None:
    path = tmp_path / "pulls.py"  # type: ignore[operator]
    path.write_text(SCRIPT)
    env = {"MPIMESH_SHUTDOWN_TIMEOUT": "5", "MPIMESH_CLEANUP_TIMEOUT": "1"}
    job = mpitest.run_job(python_cmd("-m", "mpimesh", str(path)), timeout=120, env=env, exit_bound=EXIT_BOUND)
    rows = job.rows
    full = 2.0 * (1 << 20)
    assert rows["backend"]["value"] == "mpi", job.describe()
    assert (rows["controller"]["type"], rows["controller"].get("value")) == (None, full), job.describe()
    assert (rows["worker"]["type"], rows["worker"]["value"]) == (None, full), job.describe()
    # served while the owner's one actor slept in an endpoint, long before it woke
    assert (rows["while_busy"]["type"], rows["while_busy"]["value"]) == (None, full), job.describe()
    assert rows["while_busy"]["seconds"] < 2.0, job.describe()
    assert rows["served"]["value"] == 3, job.describe()  # the controller's two reads and the worker's
    dropped = rows["dropped"]
    assert dropped["type"] == "ValueError", job.describe()
    assert re.fullmatch(rf"RDMABuffer\.read_into: {BUFFER.format(0)} was dropped by its owner or a holder; "
                        r"ask its owner for a new buffer", dropped["message"]), job.describe()
    stalled = rows["stalled"]
    assert stalled["type"] == "TimeoutError", job.describe()
    assert re.fullmatch(rf"RDMABuffer\.read_into: {BUFFER.format(1)} not read after 0\.5 s; its owner's process "
                        r"must be polling \(any running mpimesh process does\): pass a larger timeout",
                        stalled["message"]), job.describe()
    # the abandoned receive (its own tag) takes nothing of the next read
    assert (rows["after_stall"]["type"], rows["after_stall"]["value"]) == (None, full), job.describe()
    killed = rows["owner_killed"]
    assert killed["type"] == "SupervisionError", job.describe()
    assert re.match(rf"the owner of {BUFFER.format(2)} has died: process \d+\.\d+ \(pid \d+\) on \S+ died: ",
                    killed["message"]), job.describe()
    assert killed["seconds"] < 2.0, job.describe()
    assert not job.hung and job.returncode == 0 and job.orphans == [], job.describe()
