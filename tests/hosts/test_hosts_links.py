"""Direct links between islands across hosts (issue #16 item 4): made, used, and a peer killed after the switch.

One job, ``mpiexec --with-ft ulfm --host mh1:1,mh2:1 -n 2``: the caller is the
launch pool's rank on mh2; the controller spawns an island of two processes
(``b``, ``c``) on its own host, mh1.  The caller's calls to ``b`` start on
the controller's relay and switch to a direct link across the hosts; ``b``
is SIGKILLed; the caller's next call to it fails with a ``SupervisionError``
carrying the controller's report (pid, host, cause), the caller goes on to
``c`` over a new link, and the job ends cleanly.
"""

from __future__ import annotations

import re
import signal

import mpitest
import pytest
from hostlib import PREAMBLE, assert_ended, host_cmd, hosts, run_job

pytestmark = pytest.mark.subprocess

SCRIPT = PREAMBLE + r'''
from mpimesh._core.current import current


class T(W):
    @endpoint
    def addr(self):
        return current().addr

    @endpoint
    def direct(self):
        return current().router.peers()

    @endpoint
    def echo(self, i):
        return i

    @endpoint
    def ask(self, peer, n):
        """n round trips to ``peer``: the values, or the error."""
        start = time.monotonic()
        try:
            return {"type": None, "value": [peer.echo.call_one(i).get(20) for i in range(n)]}
        except Exception as exc:
            return {"type": type(exc).__name__, "message": str(exc), "seconds": time.monotonic() - start}


def linked(x, y, timeout=30):
    ax, ay = x.addr.call_one().get(30), y.addr.call_one().get(30)
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if ay in x.direct.call_one().get(30) and ax in y.direct.call_one().get(30):
            return True
        time.sleep(0.01)
    return False


hook = mpimesh.unhandled_fault_hook = Hook()
names = host_mesh().hostnames
a = host_mesh().slice(hosts=len(names) - 1).spawn_procs(per_host={"gpus": 1}).spawn("a", T)
island = this_host().spawn_procs(per_host={"gpus": 2})
b, c = (island.slice(gpus=i).spawn(name, T) for i, name in enumerate("bc"))
emit(adverb="where", value=[m.where.call_one().get(30) for m in (a, b, c)],
     addrs=[m.addr.call_one().get(30) for m in (a, b, c)], host=HOST)
relayed = current().peers.statistics().relayed
emit(adverb="switch", a_b=a.ask.call_one(b, 20).get(60), linked=linked(a, b))
before = current().peers.statistics().relayed
emit(adverb="direct", a_b=a.ask.call_one(b, 50).get(60), relayed_first=before - relayed,
     relayed_after=current().peers.statistics().relayed - before)
os.kill(b.where.call_one().get(30)[1], signal.SIGKILL)
emit(adverb="after_kill", **a.ask.call_one(b, 1).get(60))
emit(adverb="a_c", **a.ask.call_one(c, 20).get(60), linked=linked(a, c))
emit(adverb="hook", failures=[{"mesh": f.mesh_name, "ranks": f.crashed_ranks} for _, f in hook.of("b", 1, 10.0)])
print("END", flush=True)
'''


def test_a_link_across_hosts_switches_and_survives_a_peer_killed(tmp_path) -> None:  # type: ignore[no-untyped-def]
    names = hosts(2)
    if not mpitest.is_openmpi():
        pytest.skip("direct links are made under Open MPI only (MPIMESH_ISLAND_LINKS=auto)")
    path = tmp_path / "links.py"
    path.write_text(SCRIPT)
    job = run_job(host_cmd(f"{names[0]}:1,{names[1]}:1", 2, str(path)), timeout=120,
                  env={"MPIMESH_ISLAND_LINKS": "auto"})
    rows = job.rows
    assert "hook" in rows, job.describe()
    where, addrs = rows["where"]["value"], rows["where"]["addrs"]
    assert [h for h, _ in where] == [names[1], names[0], names[0]], job.describe()
    assert addrs[0][0] == 0 and addrs[1][0] == addrs[2][0] != 0, job.describe()
    switch = rows["switch"]
    assert switch["a_b"]["value"] == list(range(20)) and switch["linked"], job.describe()
    direct = rows["direct"]
    # the switch started on the relay; once linked, 50 round trips cost the controller no relayed frame
    assert direct["a_b"]["value"] == list(range(50)), job.describe()
    assert direct["relayed_first"] > 0 and direct["relayed_after"] == 0, job.describe()
    killed = rows["after_kill"]
    assert killed["type"] == "SupervisionError", job.describe()
    died = (rf"process {addrs[1][0]}\.{addrs[1][1]} \(pid {where[1][1]}\) on {re.escape(names[0])} died: "
            + mpitest.death_cause_re(None, signal.SIGKILL))
    assert re.search(died, killed["message"]), job.describe()
    assert rows["a_c"]["value"] == list(range(20)) and rows["a_c"]["linked"], job.describe()
    assert rows["hook"]["failures"] == [{"mesh": "b", "ranks": [0]}], job.describe()
    assert "reported failed by MPI" not in job.stdout + job.stderr, job.describe()
    assert_ended(job)
