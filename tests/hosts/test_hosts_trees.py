"""Casts down a tree across hosts: a forwarder on the other host dies holding a call (issue #16).

One job, ``mpiexec --with-ft ulfm --host mh1:3,mh2:2 -n 5``, every cast down
a tree of fan-out 1 (``MPIMESH_CAST_FANOUT=1 MPIMESH_CAST_TREE_MIN=2``): a
chain through the 4 workers of a ``hosts=2, gpus=2`` mesh, ranks 1 and 2 on
mh1 and 3 and 4 on mh2, so every cast crosses the link once, at the
forwarder of ``{hosts: 0, gpus: 1}``.  The script checks replies and folds
across the hosts, then stops the first worker on mh2 (``{hosts: 1, gpus:
0}``, the forwarder to the last) before a call and kills it: its rank fails
with a ``SupervisionError`` naming it, the last worker, beyond it, still runs
the call once and answers, a fold over the survivors is right, and the job
ends cleanly.
"""

from __future__ import annotations

import pytest
from hostlib import PREAMBLE, assert_ended, host_cmd, hosts, run_job

pytestmark = pytest.mark.subprocess

SCRIPT = PREAMBLE + r'''
import operator
from mpimesh import current_rank
from mpimesh._core import current


class T(W):
    def __init__(self):
        self.seen = []

    @endpoint
    def add(self, x):
        self.seen.append(x)
        return [current_rank()["hosts"], current_rank()["gpus"], x]

    @endpoint
    def log(self):
        return self.seen

    @endpoint
    def forwarded(self):
        return current.current().multicast.statistics().casts_forwarded


hook = mpimesh.unhandled_fault_hook = Hook()
m = host_mesh().spawn_procs(per_host={"gpus": 2}).spawn("t", T)
where = list(m.where.call().get(30).values())
emit(adverb="where", value=where, host=HOST)
emit(adverb="call", value=list(m.add.call(1).get(30).values()))
emit(adverb="forwarded", value=list(m.forwarded.call().get(30).values()))
emit(adverb="reduce", value=m.add.reduce(operator.add, 2).get(30))
pid = where[2][1]
os.kill(pid, signal.SIGSTOP)
fut = m.add.call(3)
os.kill(pid, signal.SIGKILL)
emit(adverb="after", **outcome(lambda: fut.get(30)))
emit(adverb="logs", value=[outcome(lambda r=r: m.slice(hosts=r // 2, gpus=r % 2).log.call_one().get(10))
                           for r in range(4)])
emit(adverb="hook", **failures_row(hook, "t", 0.0, 1, 10.0))
emit(adverb="survivors", **outcome(lambda: m.slice(hosts=slice(0, 1)).add.reduce(operator.add, 5).get(30)))
print("END", flush=True)
'''


def triples(flat: list[int]) -> list[list[int]]:
    return [flat[i:i + 3] for i in range(0, len(flat), 3)]


def test_a_forwarder_on_the_other_host_dies_holding_a_call(tmp_path) -> None:  # type: ignore[no-untyped-def]
    names = hosts(2)
    path = tmp_path / "trees.py"
    path.write_text(SCRIPT)
    env = {"MPIMESH_CAST_FANOUT": "1", "MPIMESH_CAST_TREE_MIN": "2"}
    job = run_job(host_cmd(f"{names[0]}:3,{names[1]}:2", 5, str(path)), timeout=120, env=env)
    rows = job.rows
    assert "survivors" in rows, job.describe()
    where = rows["where"]["value"]
    assert [h for h, _ in where] == [names[0], names[0], names[1], names[1]], job.describe()
    assert rows["call"]["value"] == [[0, 0, 1], [0, 1, 1], [1, 0, 1], [1, 1, 1]], job.describe()
    # a chain: every worker but the last forwards
    assert [n > 0 for n in rows["forwarded"]["value"]] == [True, True, True, False], job.describe()
    # lists add up, in the order the tree met them
    assert sorted(triples(rows["reduce"]["value"])) == [[0, 0, 2], [0, 1, 2], [1, 0, 2], [1, 1, 2]], job.describe()
    after = rows["after"]
    assert after["type"] == "SupervisionError", job.describe()
    failed = "Endpoint call t.add() failed, The actor __main__.T t{'hosts': 1/2, 'gpus': 0/2} "
    assert after["message"].startswith(failed), job.describe()
    assert f"on {names[1]} died" in after["message"], job.describe()
    logs = [row.get("value") for row in rows["logs"]["value"]]
    # the last worker, beyond the dead forwarder, ran call 3 exactly once
    assert logs[0] == logs[1] == logs[3] == [1, 2, 3], job.describe()
    assert rows["logs"]["value"][2]["type"] == "SupervisionError", job.describe()
    assert [(f["mesh"], f["ranks"]) for f in rows["hook"]["failures"]] == [("t", [2])], job.describe()
    assert rows["survivors"]["type"] is None, job.describe()
    assert sorted(triples(rows["survivors"]["value"])) == [[0, 0, 5], [0, 1, 5]], job.describe()
    assert_ended(job)
