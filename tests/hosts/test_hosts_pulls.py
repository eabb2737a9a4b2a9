"""RDMABuffer reads across hosts, by pull (``_data.pulls``), and their faults (issue #13 item 3).

One job, ``mpiexec --with-ft ulfm --host mh1:1,mh2:2 -n 3``: the controller
on mh1 reads 4 MiB buffers owned by the two pool workers on mh2.  A read is
served by the owner's polling thread while its one actor sleeps inside an
endpoint; a worker on mh2 reads its neighbour's buffer; a dropped buffer
raises ``ValueError``; an owner stopped (SIGSTOP) while a read waits, then
killed, fails the read with ``SupervisionError`` naming its host; the job
ends cleanly.
"""

from __future__ import annotations

import re

import pytest
from hostlib import PREAMBLE, assert_ended, host_cmd, hosts, run_job

pytestmark = pytest.mark.subprocess

SCRIPT = PREAMBLE + r'''
import torch
from mpimesh import Channel, RDMABuffer
from mpimesh._core import current

N = 1 << 20


class O(W):
    def __init__(self):
        self.t = torch.full((N,), 2.0)
        self.b = RDMABuffer(self.t.view(torch.uint8))

    @endpoint
    def handle(self):
        return self.b

    @endpoint
    def drop(self):
        self.b.drop().get(10)

    @endpoint
    def fresh(self):
        self.b = RDMABuffer(self.t.view(torch.uint8))
        return self.b

    @endpoint
    def busy(self, port, seconds):
        port.send("busy")
        time.sleep(seconds)
        return current.current().pulls.served

    @endpoint
    def read(self, handle):
        dst = torch.zeros(N)
        handle.read_into(dst.view(torch.uint8)).get(30)
        return float(dst.sum())


def read(handle):
    dst = torch.zeros(N)
    handle.read_into(dst.view(torch.uint8), timeout=30).get(60)
    return float(dst.sum())


hook = mpimesh.unhandled_fault_hook = Hook()
owners = host_mesh().slice(hosts=1).spawn_procs(per_host={"gpus": 2}).spawn("owners", O)
a, b = owners.slice(gpus=0), owners.slice(gpus=1)
emit(adverb="where", value=[a.where.call_one().get(30), b.where.call_one().get(30)], host=HOST)
h = a.handle.call_one().get(30)
emit(adverb="backend", value=h.backend)
port, receiver = Channel.open()
busy = a.busy.call_one(port, 3.0)
receiver.recv().get(30)
emit(adverb="while_busy", **outcome(lambda: read(h)))
emit(adverb="worker", **outcome(lambda: b.read.call_one(h).get(60)))
emit(adverb="served", value=busy.get(30))
a.drop.call_one().get(30)
emit(adverb="dropped", **outcome(lambda: read(h)))
h2 = b.handle.call_one().get(30)
pid = b.where.call_one().get(30)[1]
os.kill(pid, signal.SIGSTOP)
fut = h2.read_into(torch.zeros(N).view(torch.uint8), timeout=60)
time.sleep(0.2)
os.kill(pid, signal.SIGKILL)
emit(adverb="owner_killed", **outcome(lambda: fut.get(30)))
emit(adverb="after", **outcome(lambda: read(a.fresh.call_one().get(30))))
print("END", flush=True)
'''


def test_reads_across_hosts_and_an_owner_lost(tmp_path) -> None:  # type: ignore[no-untyped-def]
    names = hosts(2)
    path = tmp_path / "pulls.py"
    path.write_text(SCRIPT)
    job = run_job(host_cmd(f"{names[0]}:1,{names[1]}:2", 3, str(path)), timeout=120)
    rows = job.rows
    assert "after" in rows, job.describe()
    assert [w[0] for w in rows["where"]["value"]] == [names[1], names[1]] and rows["where"]["host"] == names[0], \
        job.describe()
    assert rows["backend"]["value"] == "mpi", job.describe()
    full = str(2.0 * (1 << 20))  # outcome() gives values as text
    assert (rows["while_busy"]["type"], rows["while_busy"]["value"]) == (None, full), job.describe()
    assert rows["while_busy"]["seconds"] < 2.0, job.describe()  # the owner's actor slept 3 s
    # the same host: the worker's read of its neighbour is a kernel copy, not a pull
    assert (rows["worker"]["type"], rows["worker"]["value"]) == (None, full), job.describe()
    assert rows["served"]["value"] == 1, job.describe()
    assert rows["dropped"]["type"] == "ValueError" and "was dropped by its owner or a holder" in \
        rows["dropped"]["message"], job.describe()
    killed = rows["owner_killed"]
    assert killed["type"] == "SupervisionError", job.describe()
    assert re.match(rf"the owner of <RDMABuffer 4194304 bytes of cpu memory of owners\[1\]@0\.2 \(process 0\.2\)> "
                    rf"has died: process 0\.2 \(pid \d+\) on {names[1]} died: ", killed["message"]), job.describe()
    assert killed["seconds"] < 2.0, job.describe()
    assert rows["after"]["type"] is None and rows["after"]["value"] == full, job.describe()
    assert_ended(job)
