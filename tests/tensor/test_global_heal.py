"""Global-view tensors through a death and a heal (issue #28, heal of a Mesh with global tensors).

A job of its own (a worker is SIGKILLed): ``module_to_mesh`` on ``dp=2`` trains,
a dp replica's process dies while the step's collectives run on the MPI
backend, the fetch raises ``SupervisionError`` (the survivor's collective
failed instead of hanging), ``heal_mesh`` replaces the process, the workers'
torch.distributed world is made again over the new members, ``broadcast_``
copies the parameters and the momentum from the surviving replica, and the
run ends within 1e-5 of the same training in one process.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mpitest import python_cmd, run_job

pytestmark = pytest.mark.subprocess

JOB = Path(__file__).with_name("global_heal_job.py")


def ulfm() -> bool:
    mpimesh = Path(sys.executable).parent / "mpimesh"
    done = subprocess.run([str(mpimesh), "info", "--get", "ulfm"], capture_output=True, text=True, timeout=60)
    return done.stdout.strip() == "true"


@pytest.mark.timeout(240)
def test_module_to_mesh_trains_on_after_a_death_and_a_heal() -> None:
    """The death gives SupervisionError, the lost shard says how to make it again, training matches one process."""
    if not ulfm():
        pytest.skip("a worker's death is survivable only on Open MPI 5 with ULFM (README, 'Which MPI stacks')")
    env = {"MPIMESH_SHUTDOWN_TIMEOUT": "2", "MPIMESH_CLEANUP_TIMEOUT": "1", "MPIMESH_SPAWN_TIMEOUT": "30"}
    done = run_job(python_cmd("-m", "mpimesh", str(JOB)), timeout=180, env=env)
    out = done.stdout
    print("\n" + "\n".join(line for line in out.splitlines() if line.startswith("seconds:")))
    assert not done.hung and done.returncode == 0 and done.orphans == [], done.describe()
    assert re.search(r"^caught: SupervisionError tensor engine: full_tensor: a process of Mesh\(dp=2\) died during "
                     r"a collective of its global tensors: process \d+\.\d+ \(pid \d+\)", out, re.M), done.describe()
    assert re.search(r"^lost shard: tensor engine: full_tensor: mpimesh\.DTensor\(shape=\(8,\), .*\) has no value "
                     r"on rank 1 \(dp=1\), which replaced a dead process when the mesh was healed \(.*\); its piece "
                     r"lived on the dead process only \(\(Shard\(dim=0\),\)\): make it again, e\.g\. "
                     r"mpimesh\.distribute\(local, mesh, sharding_spec=\.\.\.\) from a checkpoint$", out, re.M), \
        done.describe()
    found = re.search(r"^steps 6 loss difference (\S+) weight difference (\S+)$", out, re.M)
    assert found is not None, done.describe()
    assert float(found[1]) < 1e-5 and float(found[2]) < 1e-5, out
    assert "fresh: 32.0" in out, done.describe()
    assert out.rstrip().endswith("END"), done.describe()
