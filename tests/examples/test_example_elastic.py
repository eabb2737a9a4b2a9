"""examples/elastic_training.py on one host: a whole "host" of workers SIGKILLed mid-run, healed or shrunk.

``mpimesh run -n 7``: the controller, a ``(hosts=2, gpus=2)`` mesh of launch-pool
workers, and two spares.  The example kills both workers of ``hosts=1``
itself; the failed step is caught, the mesh healed from the spares (the
parameters and momentum re-sent with ``broadcast_``) or shrunk to the
surviving host, the step repeated, and the final loss must equal that of
the same training without the failure within 1e-5.  Across two simulated
hosts: tests/hosts/test_hosts_elastic.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from mpitest import ROOT, run_job

pytestmark = pytest.mark.subprocess

EXAMPLE = ROOT / "examples" / "elastic_training.py"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("how", ["heal", "shrink"])
def test_elastic_training_survives_a_lost_host(how: str) -> None:
    """The lost host's workers are reported, the step repeats on the healed (or shrunk) mesh; same final loss."""
    mpimesh = Path(sys.executable).parent / "mpimesh"
    if subprocess.run([str(mpimesh), "info", "--get", "ulfm"], capture_output=True, text=True,
                      timeout=60).stdout.strip() != "true":
        pytest.skip("a worker's death is survivable only on Open MPI 5 with ULFM (README, 'Which MPI stacks')")
    cmd = [str(mpimesh), "run", "-n", "7", str(EXAMPLE), *(["--shrink"] if how == "shrink" else [])]
    env = {"MPIMESH_SHUTDOWN_TIMEOUT": "2", "MPIMESH_CLEANUP_TIMEOUT": "1", "MPIMESH_SPAWN_TIMEOUT": "30"}
    job = run_job(cmd, timeout=200, env=dict(env), end="final loss")
    out = job.stdout
    assert re.search(r"^step 5: killing every worker of host 1 \(\S+, pids \[\d+, \d+\]\) with SIGKILL$", out, re.M), \
        job.describe()
    assert re.search(r"^step 5 failed \((SupervisionError|RemoteTensorError)\): ", out, re.M), job.describe()
    if how == "heal":
        assert re.search(r"^healed ProcMesh\(hosts=2, gpus=2\) \(rank\(s\) \[2, 3\] replaced\) in [\d.]+ s; "
                         r"repeating step 5$", out, re.M), job.describe()
        mesh = r"ProcMesh\(hosts=2, gpus=2\)"
    else:
        assert re.search(r"^shrunk to ProcMesh\(hosts=1, gpus=2\) in [\d.]+ s; repeating step 5$", out, re.M), \
            job.describe()
        mesh = r"ProcMesh\(hosts=1, gpus=2\)"
    final = re.search(rf"^final loss (\S+), without the failure (\S+): difference \S+ after 1 recovery\(ies\) on "
                      rf"{mesh} OK$", out, re.M)
    assert final, job.describe()
    assert abs(float(final.group(1)) - float(final.group(2))) <= 1e-5, job.describe()
    if job.hung and job.ended:
        pytest.xfail("runtime bug: MPI_Finalize can spin once a rank of the world has died (see "
                     "tests/roles/test_faults.py, BUG_FINALIZE_HANG)")
    assert not job.hung and job.returncode == 0 and job.orphans == [], job.describe()
