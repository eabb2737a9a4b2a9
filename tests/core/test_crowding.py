"""Spinning waiters yield the CPU only where the job's processes outnumber the CPUs (``_core.crowding``).

On a loaded machine, a yield hands the CPU to another job's process for a
time slice, so a job with a CPU per process must not yield (B1 at 17-60 µs
against ~5 µs, docs/design/data.md); a job that crowds its host must, or a
spinner holds the CPU its peer needs.  The real jobs below are the proof:
two processes on this machine's CPUs, then the same job pinned to one CPU.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from mpitest import mpiexec_cmd, python_cmd, run

from mpimesh._core.crowding import Crowding, crowded


def test_crowded_counts_the_job_s_bells_against_the_cpus(tmp_path: Path) -> None:
    """Bells in the job's directory are the job's processes on this host; nothing else there counts."""
    for name in ("bell-0.0", "bell-1.0", "bell-1.1", "last-words-1.0"):
        (tmp_path / name).touch()
    assert crowded(str(tmp_path), 2)
    assert not crowded(str(tmp_path), 3)
    assert crowded(str(tmp_path / "gone"), 64), "a directory that cannot be read: yield, the safe side"


@pytest.mark.parametrize(("mode", "bells", "expect"), [
    ("auto", 1, False), ("auto", 9, True), ("always", 1, True), ("never", 9, False),
])
def test_check_sets_python_and_native_spins(tmp_path: Path, mode: str, bells: int, expect: bool) -> None:
    """check() sets ``Progress.yields`` and the native spins' switch alike; always/never ignore the count."""
    native = pytest.importorskip("mpimesh._native")
    for i in range(bells):
        (tmp_path / f"bell-1.{i}").touch()
    progress = SimpleNamespace(yields=not expect)
    before = native.spin_yield(not expect)
    try:
        crowding = Crowding(progress, str(tmp_path), mode)
        crowding._cpus = 4  # this host's CPUs, fixed for the case
        assert crowding.check() is expect
        assert progress.yields is expect
        assert native.spin_yield(before) is expect
    finally:
        native.spin_yield(before)


JOB = """
import time
from mpimesh import Actor, endpoint, this_host
from mpimesh._core import current

def yields():
    return (current.runtime or current.current()).progress.yields

class Probe(Actor):
    @endpoint
    def yields(self):
        return yields()

procs = this_host().spawn_procs(per_host={"gpus": 1})
probe = procs.spawn("probe", Probe)
probe.initialized.get(60)
time.sleep(1.5)  # every process counts the job's bells again once a second
print("YIELDS", yields(), probe.yields.call_one().get(60), flush=True)
procs.stop().get(60)
"""


@pytest.mark.subprocess
@pytest.mark.parametrize("pinned", [False, True], ids=["own-cpus", "one-cpu"])
def test_a_job_yields_only_where_it_crowds_its_host(tmp_path: Path, pinned: bool) -> None:
    """``mpiexec -n 2``: the controller and its pool worker; pinned to one CPU (taskset) both yield."""
    cpus = len(os.sched_getaffinity(0))
    if not pinned and cpus < 2:
        pytest.skip("needs 2 CPUs for the uncrowded case")
    if pinned and shutil.which("taskset") is None:
        pytest.skip("needs taskset (util-linux)")
    path = tmp_path / "job.py"
    path.write_text(JOB)
    cmd = mpiexec_cmd(2, *python_cmd("-m", "mpimesh", str(path)))
    if pinned:
        cmd = ["taskset", "-c", str(min(os.sched_getaffinity(0))), *cmd]
    done = run(cmd, timeout=120, env={"MPIMESH_SPIN_YIELD": ""})
    assert done.returncode == 0, done.stderr
    assert f"YIELDS {pinned} {pinned}" in done.stdout.splitlines(), done.stdout + done.stderr
    assert not done.orphans
