"""The tensor engine across hosts: a ``host_mesh()`` mesh over 2 simulated hosts (issue #15 across issue #13).

A job ``--host mh1:3,mh2:2 -n 5``: the controller and two pool ranks on mh1,
two on mh2, so ``host_mesh().spawn_procs(per_host={"gpus": 2})`` is
``hosts=2, gpus=2`` from the pool.  Reductions over ``hosts`` are MPI
collectives between the hosts, over ``gpus`` within each host, over both
across all four; a 16 MiB tensor comes back from the other host with
``fetch_shard``; a sharded matmul and a data-parallel gradient step equal
local torch.
"""

from __future__ import annotations

import pytest
from hostlib import PREAMBLE, assert_ended, host_cmd, hosts, run_job

pytestmark = pytest.mark.subprocess

SCRIPT = PREAMBLE + r'''
import torch
from mpimesh import Replicate, Shard

procs = host_mesh().spawn_procs(per_host={"gpus": 2})
with procs.activate():
    r = procs.rank_tensor("hosts") * 10 + procs.rank_tensor("gpus")
    over_hosts = r.reduce("hosts", "stack")
    over_gpus = r.reduce("gpus", "sum")
    over_all = r.float().reduce(("hosts", "gpus"), "avg")
    big = torch.arange(4 << 20, dtype=torch.float32) + procs.rank_tensor("hosts")
emit(adverb="stack-hosts", value=mpimesh.inspect(over_hosts, hosts=1, gpus=1).tolist())
emit(adverb="sum-gpus", value=mpimesh.inspect(over_gpus, hosts=1, gpus=0).item())
emit(adverb="avg-all", value=mpimesh.inspect(over_all, hosts=0, gpus=1).item())
far = mpimesh.fetch_shard(big, hosts=1, gpus=1).get(120)
emit(adverb="fetch-far", value=bool(torch.equal(far, torch.arange(4 << 20, dtype=torch.float32) + 1)))

x = torch.randn(8, 12, dtype=torch.float64)
dx = mpimesh.distribute(x, procs, [Shard(1), Shard(1)])
with procs.activate():
    gram = (dx @ dx.T).reduce(("hosts", "gpus"), "sum")
emit(adverb="matmul", value=bool(torch.allclose(mpimesh.inspect(gram, hosts=1, gpus=0), x @ x.T)))
emit(adverb="gather", value=bool(mpimesh.gather(dx).get(120).equal(x)))
procs.stop().get(60)
print("END", flush=True)
'''


def test_the_tensor_engine_across_two_hosts(tmp_path) -> None:
    """Collectives between hosts and within them, a fetch from the other host, a sharded matmul: all exact."""
    names = hosts(2)
    path = tmp_path / "tensor_hosts.py"
    path.write_text(SCRIPT)
    job = run_job(host_cmd(f"{names[0]}:3,{names[1]}:2", 5, str(path)), timeout=300)
    assert job.rows["stack-hosts"]["value"] == [1, 11], job.describe()
    assert job.rows["sum-gpus"]["value"] == 21, job.describe()
    assert job.rows["avg-all"]["value"] == 5.5, job.describe()
    for row in ("fetch-far", "matmul", "gather"):
        assert job.rows[row]["value"] is True, (row, job.describe())
    assert_ended(job, 0)
