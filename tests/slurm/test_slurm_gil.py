"""A controller or a worker that holds the GIL for seconds under srun is not declared dead.

Under ``srun --mpi=pmix`` mpimesh turns on ULFM's heartbeat detector (2 s),
which sends a process's heartbeats only from inside MPI calls.  The
controller's MPI calls came from Python threads only: a script that held the
GIL for 6 s (a C call through ``ctypes.PyDLL``) stopped them, and the job died
(``process 0.3 ... died: reported failed by MPI (MPI_ERR_PROC_FAILED)``,
exit 1).  A C thread of ``mpimesh._native`` (native/ulfm_beat.c,
``_transport/ulfm_beat.py``) now makes those calls without the GIL, on the
controller and on every pool worker (an actor's endpoint holding the GIL).

Runs one 4-task job on one node of the Slurm that ``SLURM_CONF`` names (the
one-node cluster of ``.ci/slurm-up.sh``, or that of ``.ci/slurm-hosts.sh``);
skips with the reason otherwise.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from pathlib import Path

import pytest
from slurmlib import sbatch_wait

pytestmark = [pytest.mark.subprocess, pytest.mark.slurm, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "jobs" / "slurm" / "mpimesh.sbatch"
#: seconds the controller holds the GIL: beyond ULFM's first grace (2 x 2 s + 1 s + ln 4)
HOLD = 6.0

JOB = r'''
import ctypes, os
from mpimesh import Actor, endpoint, this_host


class W(Actor):
    @endpoint
    def where(self):
        return os.getpid()

    @endpoint
    def hold(self, seconds):
        ctypes.PyDLL(None).usleep(int(seconds * 1e6))  # PyDLL: the GIL stays held, in the actor's process
        return os.getpid()


procs = this_host().spawn_procs(per_host={"gpus": 3})
ws = procs.spawn("w", W)
print("BEFORE", len(set(ws.where.call().get(60).values())), flush=True)
ctypes.PyDLL(None).usleep(int(float(os.environ["MPIMESH_TEST_HOLD"]) * 1e6))  # PyDLL: the GIL stays held
print("AFTER", len(set(ws.where.call().get(30).values())), flush=True)
ws.slice(gpus=1).hold.call_one(float(os.environ["MPIMESH_TEST_HOLD"])).get(60)
print("WORKER", len(set(ws.where.call().get(30).values())), flush=True)
'''


def _run(tmp_path: Path, **env: str) -> tuple[int, str]:
    """Submit the job (4 tasks on one node, the controller holding the GIL); returns its status and output."""
    if not os.environ.get("SLURM_CONF") or shutil.which("sbatch") is None:
        pytest.skip("needs a running Slurm: eval \"$(bash .ci/slurm-up.sh)\" as root")
    (tmp_path / "job.py").write_text(JOB)
    environ = {**os.environ, "VENV": str(Path(sys.executable).parent.parent), "SRUN_MPI": "pmix",
               "PYTHONPATH": str(ROOT), "MPIMESH_TEST_HOLD": str(HOLD), **env}
    return sbatch_wait(["--nodes=1", "--ntasks=4", "--time=2", str(TEMPLATE), str(tmp_path / "job.py")],
                       name=f"gil-{uuid.uuid4().hex[:6]}", output=tmp_path / "job.out", env=environ, cwd=tmp_path)


def test_a_controller_or_worker_holding_the_gil_is_not_declared_dead(tmp_path: Path) -> None:
    """The controller holds the GIL for 6 s, then an actor does in its worker: every process answers after each."""
    status, output = _run(tmp_path)
    assert "AFTER 3" in output.splitlines(), f"status {status}:\n{output[-6000:]}"
    assert "WORKER 3" in output.splitlines(), f"status {status}:\n{output[-6000:]}"
    assert status == 0, f"status {status}:\n{output[-6000:]}"
    assert "died" not in output, output[-6000:]


def test_without_the_beat_the_controller_holding_the_gil_is_declared_dead(tmp_path: Path) -> None:
    """The negative control: ``MPIMESH_BOOT_BEAT=0`` turns the thread off, and the job dies.

    Pins why the thread is there; turns red when Open MPI's detector no longer
    needs the application's MPI calls to send heartbeats (then it may go).
    """
    status, output = _run(tmp_path, MPIMESH_BOOT_BEAT="0")
    assert "BEFORE 3" in output.splitlines(), f"status {status}:\n{output[-6000:]}"
    assert "AFTER 3" not in output.splitlines(), f"it lived without the beat: status {status}:\n{output[-6000:]}"
