"""A mesh on the other host healed from a spare of that host, under mpiexec (issue #27).

``mpiexec --with-ft ulfm --host mh1:2,mh2:3 -n 5``: the controller and rank 1
(a spare) on mh1, ranks 2-4 on mh2.  The script spawns a 2-process mesh on
mh2 (which leaves rank 4, on mh2, a spare), one worker there SIGKILLs
itself, the pending call raises ``DeviceMeshError``, ``heal_mesh(procs)``
takes mh2's spare (same host first, not mh1's), the actor is made again
there with its constructor argument and answers, the healthy one keeps its
state; the job ends by itself with status 0, leaving nothing on any host.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostlib import PREAMBLE, assert_ended, host_cmd, hosts, run_job

pytestmark = pytest.mark.subprocess

HEAL = PREAMBLE + r'''
from mpimesh import DeviceMeshError, heal_mesh


class C(W):
    def __init__(self, base):
        self.n = base

    @endpoint
    def bump(self):
        self.n += 1
        return self.n


hook = mpimesh.unhandled_fault_hook = Hook()
procs = host_mesh().slice(hosts=1).spawn_procs(per_host={"gpus": 2})
cs = procs.spawn("c", C, 10)
where = [cs.slice(gpus=g).where.call_one().get(30) for g in range(2)]
emit(adverb="where", value=where, host=HOST)
emit(adverb="bump", value=list(cs.bump.call().get(30).values()))
emit(adverb="fault", **outcome(lambda: cs.slice(gpus=1).fault.call_one("sigkill").get(30)))
start = time.monotonic()
emit(adverb="heal", same=heal_mesh(procs) is procs, new=cs.slice(gpus=1).where.call_one().get(30),
     seconds=time.monotonic() - start)
emit(adverb="after", value=list(cs.bump.call().get(30).values()))
procs.stop().get(30)
print("END", flush=True)
'''


@pytest.mark.timeout(240)
def test_a_dead_rank_on_the_other_host_is_healed_from_a_spare_there(tmp_path: Path) -> None:
    names = hosts(2)
    path = tmp_path / "heal.py"
    path.write_text(HEAL)
    job = run_job(host_cmd(f"{names[0]}:2,{names[1]}:3", 5, str(path)), timeout=150)
    assert_ended(job, 0)
    where = job.rows["where"]["value"]
    assert [h for h, _ in where] == [names[1], names[1]], job.describe()
    assert job.rows["bump"]["value"] == [11, 11], job.describe()
    assert job.rows["fault"]["type"] in ("SupervisionError", "DeviceMeshError"), job.describe()
    healed = job.rows["heal"]
    host, pid = healed["new"]
    print(f"\nheal on {names[1]} (spare taken, actor re-made, first call answered): {healed['seconds'] * 1e3:.0f} ms")
    assert healed["same"] and host == names[1] and pid not in (p for _, p in where), job.describe()
    assert job.rows["after"]["value"] == [12, 11], job.describe()
