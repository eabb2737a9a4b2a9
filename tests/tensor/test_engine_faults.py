"""The tensor engine when a worker dies in the middle of a stream of operations (issue #15, item 7).

Each case starts its own job (killing a launch-pool rank would take it from
every later test of a shared run).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mpitest import python_cmd, run

pytestmark = pytest.mark.subprocess

SCRIPT = '''
import os, signal, sys, torch, mpimesh
from mpimesh import Actor, endpoint, this_host

failures = []
mpimesh.unhandled_fault_hook = failures.append  # record, keep the script going

class Pid(Actor):
    @endpoint
    def pid(self) -> int:
        return os.getpid()

procs = this_host().spawn_procs(per_host={"gpus": 2})
victim = procs.spawn("pids", Pid).pid.call().get(60).item(gpus=1)
with procs.activate():
    t = torch.zeros(8)
    for _ in range(300):
        t = t + 1
print("before:", mpimesh.inspect(t, gpus=1)[0].item(), flush=True)
os.kill(victim, signal.SIGKILL)
with procs.activate():
    for _ in range(300):
        t = t * 1 + 1
try:
    mpimesh.fetch_shard(t, gpus=1).get(60)
except mpimesh.SupervisionError as exc:
    print("dead rank:", type(exc).__name__, flush=True)
print("survivor:", mpimesh.inspect(t, gpus=0)[0].item(), flush=True)
try:
    t.reduce("gpus")
except mpimesh.SupervisionError as exc:
    print("reduce:", exc, flush=True)
print("END", flush=True)
'''


@pytest.mark.parametrize("launch", ["mpimesh_run3", "spawned"])
def test_a_worker_killed_mid_stream_gives_supervision_error(tmp_path: Path, launch: str) -> None:
    """Fetching from the dead process raises SupervisionError, so does a reduce with it; the survivor goes on."""
    script = tmp_path / "kill_mid_stream.py"
    script.write_text(SCRIPT)
    cmd = python_cmd(str(script))
    if launch == "mpimesh_run3":
        # What users type to keep survivors: `mpimesh run` adds --with-ft ulfm (Open MPI 5).
        mpimesh = str(Path(sys.executable).parent / "mpimesh")
        if subprocess.run([mpimesh, "info", "--get", "ulfm"], capture_output=True, text=True,
                          timeout=60).stdout.strip() != "true":
            pytest.skip("a pool worker's death is survivable only on Open MPI 5 with ULFM (README)")
        cmd = [mpimesh, "run", "-n", "3", str(script)]
    result = run(cmd, timeout=240)
    assert "before: 300.0" in result.stdout, result.stderr
    assert "dead rank: SupervisionError" in result.stdout, result.stderr
    assert "survivor: 600.0" in result.stdout, result.stderr
    assert "reduce: tensor engine: cannot reduce over ('gpus',): process " in result.stdout, result.stderr
    assert result.stdout.rstrip().endswith("END"), result.stderr
    assert result.returncode == 0, result.stderr
    assert result.orphans == []
