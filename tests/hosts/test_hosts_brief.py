"""The brief's programs across 2 simulated hosts (issue #28 across issue #13).

A job ``--host H1:3,H2:2 -n 5``: the controller and two pool ranks on the
first host, two on the second, so ``Mesh(shape=(2, 2), mesh_dim_names=("dp",
"tp"))`` puts ``dp`` row 0 on the first host and row 1 on the second, from
the pool.  The workers' torch.distributed world (gloo) then spans the hosts:
its store is served on the first host at an address the second reaches.  A
global ``dt @ dt.T`` equals local torch, and three training steps of
``module_to_mesh`` give one-process losses.
"""

from __future__ import annotations

import pytest
from hostlib import PREAMBLE, assert_ended, host_cmd, hosts, run_job

pytestmark = pytest.mark.subprocess

SCRIPT = PREAMBLE + r'''
import copy
import torch
from torch import nn
from mpimesh.distributed import Mesh

mesh = Mesh(shape=(2, 2), mesh_dim_names=("dp", "tp"))
emit(adverb="hosts", value=mesh.hostnames)
a = torch.randn(64, 32)
dt = mpimesh.distribute(a, mesh, sharding_spec=["dp", None])
emit(adverb="matmul", value=bool(torch.allclose((dt @ dt.T).full_tensor(), a @ a.T, atol=1e-4)))

torch.manual_seed(0)
reference = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 8))
model = mpimesh.module_to_mesh(copy.deepcopy(reference), mesh, plan={"0": "colwise", "2": "rowwise"})
opt, ref_opt = torch.optim.AdamW(model.parameters(), lr=1e-2), torch.optim.AdamW(reference.parameters(), lr=1e-2)
worst = 0.0
for _ in range(3):
    x, y = torch.randn(16, 8), torch.randn(16, 8)
    losses = []
    for m, o in ((model, opt), (reference, ref_opt)):
        o.zero_grad()
        loss = nn.functional.mse_loss(m(x), y)
        loss.backward()
        o.step()
        losses.append(loss.item())
    worst = max(worst, abs(losses[0] - losses[1]))
emit(adverb="training", value=worst)
mesh.stop().get(60)
print("END", flush=True)
'''


def test_the_brief_across_two_hosts(tmp_path) -> None:
    """A Mesh over both hosts: the global matmul is exact, dp x tp training matches one process."""
    names = hosts(2)
    path = tmp_path / "brief_hosts.py"
    path.write_text(SCRIPT)
    job = run_job(host_cmd(f"{names[0]}:3,{names[1]}:2", 5, str(path)), timeout=300)
    assert job.rows["hosts"]["value"] == [names[0], names[0], names[1], names[1]], job.describe()
    assert job.rows["matmul"]["value"] is True, job.describe()
    assert job.rows["training"]["value"] < 1e-5, job.describe()
    assert_ended(job, 0)
