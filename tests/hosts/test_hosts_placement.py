"""Placement across hosts: ``host_mesh()`` rows on their hosts, spawned with the ``host`` key, and the one-spawn rule.

A job ``--host mh1:2,mh2:1 -n 3``: the controller and one pool rank on mh1,
one pool rank on mh2.  ``host_mesh().spawn_procs(per_host={"gpus": 2})``
takes the two pool ranks and spawns one process on each host (one
``MPI_Comm_spawn_multiple``); each row's processes report their own host and
their index on it.  A second spawn is refused with the message that names
open-mpi/ompi#12601 (Open MPI fails or hangs it across nodes), and the job
ends by itself, leaving nothing behind.
"""

from __future__ import annotations

import re

import pytest
from hostlib import PREAMBLE, assert_ended, host_cmd, hosts, run_job
from mpitest import is_openmpi

pytestmark = pytest.mark.subprocess

SCRIPT = PREAMBLE + r'''
from mpimesh import current_rank

class Here(Actor):
    @endpoint
    def here(self):
        return [MPI.Get_processor_name(), dict(current_rank())]

hosts = host_mesh()
emit(adverb="hosts", value=hosts.hostnames, sizes=hosts.sizes)
procs = hosts.spawn_procs(per_host={"gpus": 2})
emit(adverb="placed", sizes=procs.sizes, value=[[p, v] for p, v in
     [(dict(p), v) for p, v in procs.spawn("here", Here).here.call().get(60).items()]],
     islands=sorted({a[0] for a in procs._addrs}))
emit(adverb="again", **outcome(lambda: this_host().spawn_procs(per_host={"gpus": 1})))
print("END", flush=True)
'''


def test_rows_on_their_hosts_then_one_spawn_only(tmp_path) -> None:
    names = hosts(2)
    if not is_openmpi():
        pytest.skip("the simulated hosts run Open MPI's mpiexec")
    path = tmp_path / "placement.py"
    path.write_text(SCRIPT)
    job = run_job(host_cmd(f"{names[0]}:2,{names[1]}:1", 3, str(path)), timeout=90)
    assert job.rows["hosts"]["value"] == names and job.rows["hosts"]["sizes"] == {"hosts": 2}, job.describe()
    assert "placed" in job.rows, job.describe()
    placed = job.rows["placed"]
    assert placed["sizes"] == {"hosts": 2, "gpus": 2}, job.describe()
    assert placed["islands"] == [0, 1], job.describe()  # pool ranks, and one spawned island
    for point, (host, rank) in placed["value"]:
        assert host == names[point["hosts"]] and rank == point, job.describe()
    again = job.rows["again"]
    assert again["type"] == "RuntimeError", job.describe()
    assert re.fullmatch(
        rf"cannot start 1 worker processes \(1 on {names[0]}\): the launch pool has no free rank there and a second "
        r"MPI_Comm_spawn is not tried in a job across hosts under Open MPI: it fails or hangs there "
        r"\(open-mpi/ompi#12601; MPIMESH_SPAWNS_ACROSS_HOSTS=always tries anyway\); launch with enough ranks on "
        rf"each host for the meshes \(e.g. `mpirun --host {names[0]}:3,{names[1]}:1`, `srun --ntasks-per-node=...`\)",
        again["message"]), job.describe()
    assert_ended(job, 0)
