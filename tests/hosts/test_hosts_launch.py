"""Launching across hosts with ``mpimesh run --host``: the one-node defaults that keep survivors, on many nodes.

Issue #13 found two failures that came from the launch, not the runtime:

* a worker on another host calling ``os._exit(1)`` ended the whole job (at
  the third such exit): ``mpimesh run`` could not place ranks on hosts, so
  a cross-host job ran under plain ``mpiexec --with-ft ulfm`` without the
  PRRTE settings that make a non-zero exit a survivable death;
* ``spawn_procs`` after a death failed and ``prterun`` exited 213: ``--host
  a:2,b:2 -n 4`` leaves no slot for ``MPI_Comm_spawn`` (PRRTE keeps a dead
  rank's slot), "All nodes which are allocated for this job are already
  filled", and PRRTE takes that failed spawn's status (PRTE_ERR_SILENT,
  -43) for the job's.

``mpimesh run --host LIST`` passes the placement to ``mpiexec`` with the
same defaults as on one node, maps by slot and lets spawns exceed the slots.
The simulated hosts' own settings come from ``multihost.sh env``.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hostlib import PREAMBLE, SCRIPT, assert_ended, hosts, run_job

pytestmark = pytest.mark.subprocess

EXITS = PREAMBLE + r'''
hook = mpimesh.unhandled_fault_hook = Hook()
hosts = host_mesh()
mine = hosts.slice(hosts=0).spawn_procs(per_host={"gpus": 1}).spawn("w", W)
theirs = hosts.slice(hosts=1).spawn_procs(per_host={"gpus": 3}).spawn("w", W)
actors = [mine.slice(gpus=0)] + [theirs.slice(gpus=j) for j in range(3)]  # world ranks 1..4
where = [a.where.call_one().get(30) for a in actors]
remote = [i for i, (h, _) in enumerate(where) if h != HOST]
emit(adverb="where", value=where, host=HOST)
# Three workers on the other host exit with status 1: PRRTE used to end the job at the third.
for i in remote[:3]:
    emit(adverb=f"exit{i}", **outcome(lambda: actors[i].fault.call_one("exit1").get(10)))
time.sleep(1.0)  # give the launcher time to act on the exits (a wait for something not to happen)
local = [i for i in range(len(where)) if i not in remote]
emit(adverb="survivor", **outcome(lambda: actors[local[0]].where.call_one().get(10)))
# No pool worker is left: these are spawned on this host, beyond the slots of --host.
emit(adverb="recover", **outcome(lambda: this_host().spawn_procs(per_host={"gpus": 2}).spawn("fresh", W)
                                 .where.call().get(30).values()))
print("END", flush=True)
'''


def env_settings() -> dict[str, str]:
    """``multihost.sh env`` as a dict (what reaches the hosts without flags)."""
    venv = str(Path(sys.executable).parent.parent)
    done = subprocess.run(["bash", str(SCRIPT), "env"], capture_output=True, text=True, timeout=20,
                          env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "VENV": venv})
    assert done.returncode == 0, done.stderr
    return dict(line.removeprefix("export ").split("=", 1) for line in done.stdout.splitlines())


def test_mpimesh_run_places_ranks_and_keeps_the_survivors(tmp_path: Path) -> None:
    """``mpimesh run --host mh1:2,mh2:3 -n 5``: the three workers on mh2 exit 1, each a SupervisionError; the
    worker on mh1 answers, spawning beyond the slots works, and the job ends 0 with nothing left behind."""
    names = hosts(2)
    path = tmp_path / "exits.py"
    path.write_text(EXITS)
    mpimesh = str(Path(sys.executable).parent / "mpimesh")
    # The hosts' network settings; mapping, binding and the ULFM settings are mpimesh run's own.
    env = {k: v for k, v in env_settings().items() if "mapping" not in k and "binding" not in k}
    job = run_job([mpimesh, "run", "--host", f"{names[0]}:2,{names[1]}:3", "-n", "5", str(path)], timeout=120,
                  env=env, ulfm=False)
    where = job.rows.get("where")
    assert where is not None, job.describe()
    assert [h for h, _ in where["value"]] == [names[0]] + [names[1]] * 3, job.describe()
    exits = [row for key, row in job.rows.items() if key.startswith("exit")]
    assert len(exits) == 3, job.describe()
    for row in exits:
        assert row["type"] == "SupervisionError", job.describe()
        assert re.search(rf" on {names[1]} died: ", row["message"]), job.describe()
    assert job.rows["survivor"]["type"] is None, job.describe()
    recover = job.rows["recover"]
    assert recover["type"] is None and len(recover["value"]) == 2, job.describe()
    assert_ended(job, 0)
    # Once, from the controller: a lost host would end this job under mpiexec (issue #27).
    assert job.stderr.count("mpimesh: this job spans hosts under mpiexec (PRRTE): if a whole host is lost") == 1, (
        job.describe())
