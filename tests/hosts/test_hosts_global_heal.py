"""Global-view tensors through a death and a heal with the mesh across two simulated hosts (issue #28).

``mpiexec --with-ft ulfm --host H1:2,H2:1 -n 3``: the controller and one dp
replica on H1, the other replica on H2.  tests/tensor/global_heal_job.py
(the one-host test is tests/tensor/test_global_heal.py) trains
``module_to_mesh`` on ``dp=2``, kills the replica on H2 while the step's
collectives run on the MPI backend, catches the ``SupervisionError``, heals,
restores the parameters and momentum from the survivor with ``broadcast_``
and ends within 1e-5 of one-process training, leaving nothing on either host.
"""

from __future__ import annotations

import re

import pytest
from hostlib import assert_ended, host_cmd, hosts, run_job
from mpitest import ROOT

pytestmark = pytest.mark.subprocess

JOB = ROOT / "tests" / "tensor" / "global_heal_job.py"


@pytest.mark.timeout(240)
def test_global_tensors_heal_after_a_death_on_the_other_host() -> None:
    """The other host's replica dies in a collective: SupervisionError naming it, heal, training matches one process."""
    names = hosts(2)
    env = {"MPIMESH_SHUTDOWN_TIMEOUT": "2", "MPIMESH_CLEANUP_TIMEOUT": "1", "MPIMESH_SPAWN_TIMEOUT": "30"}
    job = run_job(host_cmd(f"{names[0]}:2,{names[1]}:1", 3, str(JOB)), timeout=180, env=env)
    out = job.stdout
    assert re.search(rf"^caught: SupervisionError tensor engine: full_tensor: a process of Mesh\(dp=2\) died during "
                     rf"a collective of its global tensors: process \d+\.\d+ \(pid \d+\) on {names[1]} died", out,
                     re.M), job.describe()
    found = re.search(r"^steps 6 loss difference (\S+) weight difference (\S+)$", out, re.M)
    assert found is not None, job.describe()
    assert float(found[1]) < 1e-5 and float(found[2]) < 1e-5, job.describe()
    print("\n" + "\n".join(line for line in out.splitlines() if line.startswith("seconds:")))
    assert_ended(job, 0)
