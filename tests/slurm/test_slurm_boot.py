"""A job under srun does not die at boot when one rank is slow to reach its first MPI call.

Under ``srun --mpi=pmix`` mpimesh turns on ULFM's heartbeat detector (2 s),
which sends a process's heartbeats only from inside MPI calls.  ``MPI_Init``
runs while ``mpimesh`` is imported, and a rank that then takes long to reach
the boot's first collective (the rest of the import on a loaded node) used to
be declared dead by the rank waiting in that collective: the whole job died
at boot (3 jobs in ~30 on a loaded machine).  ``_launch/boot_beat.py`` now
makes an MPI call every 50 ms from ``MPI_Init`` to the boot.

Here one rank sleeps 8 s between ``MPI_Init`` and the boot (beyond ULFM's
first grace, 2 x 2 s + 1 s + ln 6 = 6.8 s): the job must boot and answer on
every node; with ``MPIMESH_BOOT_BEAT=0`` (the negative control) it dies.

Runs on the 3-node Slurm of ``.ci/slurm-hosts.sh`` (``.ci/slurm-hosts-tests.sh``),
as root with ``MPIMESH_TEST_SLURM_HOSTS`` set; skips with the reason otherwise.
"""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest
from slurmlib import nodes_idle, sbatch_wait

pytestmark = [pytest.mark.subprocess, pytest.mark.slurm, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "jobs" / "slurm" / "mpimesh.sbatch"
PREFIX = os.environ.get("MPIMESH_TEST_SLURM_HOSTS", "")
HOSTS = [f"{PREFIX}{i}" for i in (1, 2, 3)]
#: seconds the slow rank spends between MPI_Init and the boot
STALL = 8.0

JOB = r'''
import os, socket
from mpimesh import Actor, endpoint, host_mesh


class W(Actor):
    @endpoint
    def where(self):
        return socket.gethostname()


procs = host_mesh().spawn_procs(per_host={"gpus": 1})
ws = procs.spawn("w", W)
print("HOSTS " + " ".join(ws.slice(hosts=h).where.call_one().get(60) for h in range(3)), flush=True)
'''

#: ``python -m mpimesh ...`` as the template runs it, with task 3 (on the second node) asleep after MPI_Init
SLOW = r'''
import os, sys, time
from mpimesh._transport import mpi  # MPI_Init, with what mpimesh sets under srun
if os.environ.get("SLURM_PROCID") == "3":
    time.sleep(float(os.environ["MPIMESH_TEST_STALL"]))
assert sys.argv[1:3] == ["-m", "mpimesh"], sys.argv
from mpimesh.__main__ import main
sys.exit(main(sys.argv[3:]))
'''


def _skip_reason() -> str:
    if not PREFIX:
        return "needs the Slurm on simulated hosts: run `bash .ci/slurm-hosts-tests.sh` as root"
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is not set: eval \"$(bash .ci/slurm-hosts.sh env)\""
    return ""


def _run(tmp_path: Path, **env: str) -> tuple[int, str]:
    """Submit the job (6 tasks, 2 a node) with task 3 slow to boot; returns its status and output."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    states = nodes_idle(HOSTS, 30)
    if states is not None:
        pytest.fail(f"the nodes are not idle: {states}")
    (tmp_path / "job.py").write_text(JOB)
    python = tmp_path / "python"  # the template's PYTHON: the venv's, with the stall
    (tmp_path / "slow.py").write_text(SLOW)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "slow.py"}" "$@"\n')
    python.chmod(0o755)
    environ = {**os.environ, "VENV": str(Path(sys.executable).parent.parent), "PYTHON": str(python),
               "SRUN_MPI": "pmix", "PYTHONPATH": str(ROOT), "MPIMESH_TEST_STALL": str(STALL),
               "MPIMESH_TEST_TAG": f"mpimesh-test-slurm-{uuid.uuid4().hex[:8]}", **env}
    return sbatch_wait(["--nodes=3", "--ntasks=6", "--ntasks-per-node=2", "--time=2", str(TEMPLATE),
                        str(tmp_path / "job.py")],
                       name=f"boot-{uuid.uuid4().hex[:6]}", output=tmp_path / "job.out", env=environ, cwd=tmp_path)


def test_a_rank_slow_to_reach_the_boot_is_not_declared_dead(tmp_path: Path) -> None:
    status, output = _run(tmp_path)
    assert f"HOSTS {' '.join(HOSTS)}" in output.splitlines(), f"status {status}:\n{output[-6000:]}"
    assert status == 0, f"status {status}:\n{output[-6000:]}"


def test_without_the_boot_beat_the_slow_rank_is_declared_dead(tmp_path: Path) -> None:
    """The negative control: ``MPIMESH_BOOT_BEAT=0``, and ULFM's detector kills the boot.

    Pins why the thread is there; turns red when Open MPI's detector no longer
    needs the application's MPI calls to send heartbeats (then it may go).
    """
    status, output = _run(tmp_path, MPIMESH_BOOT_BEAT="0")
    assert "HOSTS " not in output, f"the job booted without the boot beat: status {status}:\n{output[-6000:]}"
    assert status != 0, output[-6000:]
