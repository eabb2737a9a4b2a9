"""torch.distributed across hosts: a ``host_mesh()`` mesh over 2 simulated hosts is one gloo world.

A job ``--host mh1:3,mh2:2 -n 5``: the controller and two pool ranks on mh1,
two pool ranks on mh2, so ``host_mesh().spawn_procs(per_host={"gpus": 2})``
is ``hosts=2, gpus=2`` with no spawn.  ``setup_torch_elastic_env`` gives
each process its torchrun variables (``LOCAL_RANK`` the ``gpus`` index,
``GROUP_RANK`` the ``hosts`` index, as Monarch's last-dimension rule) and a
``MASTER_ADDR`` of mh1 that mh2 reaches: first the host name (each host
resolves it through ``/etc/hosts``, which multihost.sh fills), then with
``use_ipaddr="ipv4"`` mh1's address on the bridge.  Each time an
``all_reduce`` over the four ranks sums on every one of them, which needs
the rendezvous on mh1 to be reachable from mh2's namespace.
"""

from __future__ import annotations

import socket

import pytest
from hostlib import PREAMBLE, assert_ended, host_cmd, hosts, run_job

pytestmark = pytest.mark.subprocess

SCRIPT = PREAMBLE + r'''
from mpimesh.spmd import default_backend, setup_torch_elastic_env

KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "MASTER_ADDR")


class Torch(Actor):
    @endpoint
    def env(self):
        return [MPI.Get_processor_name()] + [os.environ.get(k) for k in KEYS]

    @endpoint
    def all_reduce(self):
        import torch
        import torch.distributed as dist

        dist.init_process_group(default_backend())
        try:
            t = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(t)
            return t.item()
        finally:
            dist.destroy_process_group()


procs = host_mesh().spawn_procs(per_host={"gpus": 2})
actors = procs.spawn("torch", Torch)
for label, family in (("name", None), ("ipv4", "ipv4")):
    setup_torch_elastic_env(procs, use_ipaddr=family)
    emit(adverb=f"env-{label}", value=list(actors.env.call().get(60).values()))
    emit(adverb=f"reduce-{label}", **outcome(lambda: list(actors.all_reduce.call().get(180).values())))
procs.stop().get(60)
print("END", flush=True)
'''


def test_all_reduce_across_two_hosts(tmp_path) -> None:
    names = hosts(2)
    path = tmp_path / "spmd_hosts.py"
    path.write_text(SCRIPT)
    job = run_job(host_cmd(f"{names[0]}:3,{names[1]}:2", 5, str(path)), timeout=300)
    for label, master in (("name", names[0]), ("ipv4", socket.gethostbyname(names[0]))):
        env = job.rows[f"env-{label}"]["value"]
        assert env == [[names[r // 2], str(r), "4", str(r % 2), "2", str(r // 2), "2", master] for r in range(4)], \
            job.describe()
        assert job.rows[f"reduce-{label}"] == {**job.rows[f"reduce-{label}"], "type": None, "value": [10.0] * 4}, \
            job.describe()
    assert_ended(job, 0)
