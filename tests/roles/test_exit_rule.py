"""The job's exit status, one rule under every launcher (issue #27): handled, the script's; unhandled, non-zero.

A worker calls ``os._exit(1)`` and the script catches the ``SupervisionError``:

* under ``mpimesh run`` (ULFM, PRRTE ignores the ranks' statuses and takes
  the controller's) the job's status is the script's, here 3 (its
  ``sys.exit``), and 0 when it ends normally;
* under a plain ``mpirun`` no process outlives a death: mpimesh ends the job
  (the failure cannot be handled there) and the status is non-zero, with the
  controller's word that says why and what to use instead;
* an unhandled failure is 1.

Under every launcher the controller also writes the status to
``MPIMESH_STATUS_FILE`` (the ``jobs/slurm`` templates exit with it, as srun's
own status is the highest of the tasks', 1 after the handled ``os._exit(1)``).
The srun side is pinned on a real multi-node Slurm in tests/slurm/.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mpitest import is_openmpi, mpiexec_cmd, python_cmd, run_job

pytestmark = pytest.mark.subprocess

SCRIPT = r'''
import os, sys
import mpimesh
from mpimesh import Actor, SupervisionError, endpoint, this_host


class W(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def die(self, code):
        os._exit(code)


handled = sys.argv[1] == "handled"
if handled:
    mpimesh.unhandled_fault_hook = lambda failure: None
a = this_host().spawn_procs(per_host={"gpus": 1}).spawn("a", W)
b = this_host().spawn_procs(per_host={"gpus": 1}).spawn("b", W)
a.pid.call_one().get(30), b.pid.call_one().get(30)
try:
    a.die.call_one(1).get(10)
except SupervisionError:
    if not handled:
        raise
    print("CAUGHT", flush=True)
print("SURVIVOR", b.pid.call_one().get(10), flush=True)
print("END", flush=True)
sys.exit(int(sys.argv[2]))
'''

CANNOT = "mpimesh: this MPI job cannot outlive a dead process"


def _job(tmp_path: Path, launch: str, mode: str, code: int) -> tuple[int | None, str, str]:
    if not is_openmpi():
        pytest.skip("Open MPI's launchers")
    script = tmp_path / "s.py"
    script.write_text(SCRIPT)
    status = tmp_path / "status"
    if launch == "mpimesh run":
        cmd = [str(Path(sys.executable).parent / "mpimesh"), "run", "-n", "3", str(script), mode, str(code)]
    else:
        cmd = mpiexec_cmd(3, *python_cmd("-m", "mpimesh", str(script), mode, str(code)))
    job = run_job(cmd, timeout=90, env={"MPIMESH_STATUS_FILE": str(status)})
    assert not job.hung and job.orphans == [], job.describe()
    written = status.read_text().strip() if status.exists() else ""
    return job.returncode, job.stdout + job.stderr, written


@pytest.mark.parametrize("code", [0, 3])
def test_a_handled_worker_exit_leaves_the_scripts_status_under_mpimesh_run(tmp_path: Path, code: int) -> None:
    returncode, output, written = _job(tmp_path, "mpimesh run", "handled", code)
    assert "CAUGHT" in output and "SURVIVOR" in output, output
    assert returncode == code, output
    assert written == str(code), (written, output)


def test_an_unhandled_worker_exit_fails_the_job_under_mpimesh_run(tmp_path: Path) -> None:
    returncode, output, written = _job(tmp_path, "mpimesh run", "unhandled", 0)
    assert returncode == 1, output
    assert written == "1", (written, output)


def test_under_plain_mpirun_no_failure_can_be_handled_and_the_job_fails(tmp_path: Path) -> None:
    """The job cannot outlive the death: non-zero, with the controller's reason and the fix."""
    returncode, output, _ = _job(tmp_path, "mpirun", "handled", 0)
    assert returncode not in (0, None), output
    assert CANNOT in output or "exited with non-zero status" in output, output
