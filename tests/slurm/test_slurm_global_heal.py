"""Global-view tensors heal under Slurm's srun (issue #28): the job of tests/tensor/test_global_heal.py.

``jobs/slurm/mpimesh.sbatch`` runs ``tests/tensor/global_heal_job.py`` on two
nodes, two ranks each (the controller, a ``dp=2`` mesh and one spare):
a dp replica's process is killed while the step's collectives run, the fetch
raises ``SupervisionError``, ``heal_mesh`` takes the spare, and the workers'
torch.distributed world is made again.  Two things of Slurm's are met on
the way: its PMIx plugin cancels the step 1 s after a task dies unless the
task's PMIx socket outlives it (``_launch/pmix_hold.py``: without it every
submission was cancelled during the heal), and it has no group construct, so
``MPI_Comm_create_from_group`` is unsupported: the world is shrunk to its
live processes after the heal and the communicators made on it
(``_transport/live.py``).  The 6 steps must match one process, the step must
not be cancelled, the job end with status 0, and nothing of it be left behind.

Printed (kept in the test's output): the job's heal and restore times.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from mpitest import leftovers
from slurmlib import nodes_idle
from test_slurm_hostloss import HOSTS, ROOT, TEMPLATE, _netns_pids, _skip_reason
from test_slurm_hostloss import _comm as comm_of

pytestmark = [pytest.mark.subprocess, pytest.mark.slurm, pytest.mark.timeout(240)]

JOB = ROOT / "tests" / "tensor" / "global_heal_job.py"


def test_global_tensors_heal_under_srun(tmp_path: Path) -> None:
    """The death gives SupervisionError, the heal and the restore work under srun, training matches one process."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    states = nodes_idle(HOSTS, 30)  # a node revived by the previous test registers again
    assert states is None, f"the nodes are not idle: {states}"
    out = tmp_path / "job.out"
    tag = f"mpimesh-test-slurm-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent), "PYTHONPATH": str(ROOT),
           "MPIMESH_TEST_TAG": tag, "MPIMESH_SHUTDOWN_TIMEOUT": "2", "MPIMESH_CLEANUP_TIMEOUT": "1",
           "MPIMESH_SPAWN_TIMEOUT": "30"}
    cmd = ["sbatch", "--wait", "--quiet", "--nodes=2", "--ntasks=4", "--ntasks-per-node=2", "--time=3",
           f"--output={out}", "--job-name=globalheal", str(TEMPLATE), str(JOB)]
    try:
        done = subprocess.run(cmd, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=200, check=False)
        returncode: int | None = done.returncode
    except subprocess.TimeoutExpired:
        returncode = None
        subprocess.run(["scancel", "--full", "--name=globalheal"], timeout=30, check=False)
    text = out.read_text(errors="replace") if out.exists() else ""
    describe = f"job status {returncode}, output:\n{text[-6000:]}"
    print("\n" + "\n".join(line for line in text.splitlines() if line.startswith("seconds:")))
    assert re.search(r"^caught: SupervisionError tensor engine: full_tensor: a process of Mesh\(dp=2\) died during "
                     r"a collective of its global tensors: process \d+\.\d+ \(pid \d+\)", text, re.M), describe
    assert re.search(r"^lost shard: tensor engine: full_tensor: .* its piece lived on the dead process only", text,
                     re.M), describe
    found = re.search(r"^steps 6 loss difference (\S+) weight difference (\S+)$", text, re.M)
    assert found is not None, describe
    assert float(found[1]) < 1e-5 and float(found[2]) < 1e-5, describe
    assert "fresh: 32.0" in text, describe
    assert "END" in text.splitlines(), describe
    assert "CANCELLED" not in text and "_errhandler" not in text, describe
    assert returncode == 0, describe
    deadline = time.monotonic() + 5  # srun's last tasks leave within moments of sbatch
    while True:
        left = leftovers(tag)
        strays = {h: [f"{p} {comm_of(p)}" for p in _netns_pids(h) if comm_of(p) != "slurmd"] for h in HOSTS}
        if not left and not any(strays.values()):
            break
        assert time.monotonic() < deadline, f"left behind: {left} {strays}\n{describe}"
        time.sleep(0.1)
