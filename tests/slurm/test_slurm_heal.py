"""A mesh healed after a whole host is lost under Slurm, from spares on the other hosts (issue #27).

The job of ``test_slurm_hostloss.py`` with 9 ranks, three a node: the
controller on sl1, a mesh of one worker on each node, and five spare ranks
(one on sl1, two on sl2 and on sl3).  Once a call to sl3's worker is pending,
every process of sl3 is killed (its two spares too).  The script catches the
``DeviceMeshError``, ``heal_mesh(procs)`` takes a spare of another host (sl3
has no live one left), the ``W`` actor is made again there with its
constructor argument, it answers, and the script ends with its own status;
nothing of the job is left behind and sl3 is revived.

Right after the loss, sl3's idle spares are not known dead yet (nothing
talked to them; ULFM's detector needs ~2 s): the heal checks each spare it
takes with a PING (``Controller._live_spares``) and passes the silent ones by.

Printed (and kept in the test's output): the time from the kill to the
``DeviceMeshError`` at the controller, and the time of the heal (spare taken,
actor re-made, first call answered).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_slurm_hostloss import (
    CHOSEN,
    HOSTS,
    KILL_BOUND,
    LOST,
    _caught,
    _nothing_left,
    _submit,
    cluster,  # noqa: F401  (the fixture: the nodes idle, sl3 revived after)
)

pytestmark = [pytest.mark.subprocess, pytest.mark.slurm, pytest.mark.timeout(240)]

HEAL_JOB = r'''
import json, os, socket, sys, time
import mpimesh
from mpimesh import Actor, DeviceMeshError, endpoint, heal_mesh, host_mesh


class W(Actor):
    def __init__(self, base):
        self.base = base

    @endpoint
    def where(self):
        return socket.gethostname(), os.getpid()

    @endpoint
    def sleep(self, seconds):
        time.sleep(seconds)
        return os.getpid()

    @endpoint
    def plus(self, n):
        return self.base + n


failures = []
mpimesh.unhandled_fault_hook = lambda failure: failures.append(str(failure).splitlines()[0])
procs = host_mesh().spawn_procs(per_host={"gpus": 1})
ws = procs.spawn("w", W, 7)
where = [ws.slice(hosts=h).where.call_one().get(60) for h in range(3)]
pending = ws.slice(hosts=2).sleep.call_one(120)
print("READY " + json.dumps(where), flush=True)
try:
    pending.get(90)
    print("NO ERROR", flush=True)
except DeviceMeshError as exc:
    print("CAUGHT " + json.dumps({"t": time.monotonic(), "message": str(exc)}), flush=True)
start = time.monotonic()
healed = heal_mesh(procs)
after = ws.slice(hosts=2).where.call_one().get(60)
seconds = time.monotonic() - start
print("HEALED " + json.dumps({"same": healed is procs, "seconds": seconds, "where": after}), flush=True)
print("ALL " + json.dumps(list(ws.plus.call(1).get(60).values())), flush=True)
print("HOOK " + json.dumps(failures), flush=True)
procs.stop().get(60)
print("END", flush=True)
sys.exit(int(sys.argv[2]))
'''


@pytest.mark.usefixtures("cluster")
def test_a_mesh_heals_from_a_spare_on_another_host_after_a_lost_host(tmp_path: Path) -> None:
    job = _submit(tmp_path, "handled", "kill", job_text=HEAL_JOB, per_node=3)
    _caught(job, KILL_BOUND)
    healed = json.loads(job.line("HEALED") or "null")
    assert healed is not None, job.describe()
    host, pid = healed["where"]
    before = json.loads(job.line("READY") or "[]")
    print(f"{LOST} lost -> mesh healed (spare on {host} taken, actor re-made, first call answered): "
          f"{healed['seconds'] * 1e3:.0f} ms")
    assert healed["same"], job.describe()
    assert host in HOSTS[:2] and [host, pid] not in before, job.describe()
    assert json.loads(job.line("ALL") or "[]") == [8, 8, 8], job.describe()
    assert "END" in job.output.splitlines(), job.describe()
    assert job.returncode == CHOSEN, job.describe()
    _nothing_left(job)
