"""Healing a process mesh in place (``ProcMesh.heal``, ``heal_mesh``; issue #27 items 3-4).

Each test is a bounded job of its own (its workers are killed), from the
launch pool (``mpimesh run``: the replacement is a spare pool rank) and
spawned (``python -m mpimesh`` as a singleton: the replacement is spawned).
A heal keeps the mesh's shape, makes the dead rank's actor of every actor
mesh on it again with the mesh's constructor arguments, leaves the healthy
actors and their state alone, and re-points the spawner's views.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from mpitest import ROOT, python_cmd
from test_faults import assert_ended, job_cmd, needs_ulfm, run_job

pytestmark = pytest.mark.subprocess

SCRIPT = r'''
import os, signal, sys
import mpimesh
from mpimesh import Actor, DeviceMeshError, SupervisionError, endpoint, heal_mesh, this_host


def say(*parts):
    # one write per line: the fault hook prints from another thread
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


class Counter(Actor):
    def __init__(self, start, *, step=1):
        self.n = start
        self.step = step

    @endpoint
    def bump(self):
        self.n += self.step
        return self.n

    @endpoint
    def where(self):
        return os.getpid()


mpimesh.unhandled_fault_hook = lambda failure: say("hook:", failure.mesh_name, failure.crashed_ranks)
procs = this_host().spawn_procs(per_host={"gpus": 3})
a = procs.spawn("a", Counter, 10, step=2)
b = procs.spawn("b", Counter, 0)
view = a.slice(gpus=slice(1, 3))
first = list(procs.addresses)
say("untouched:", heal_mesh(procs) is procs, list(procs.addresses) == first)
a.bump.call().get(60)
b.bump.call().get(60)
before = list(procs.addresses)
os.kill(a.slice(gpus=1).where.call_one().get(60), signal.SIGKILL)
try:
    a.bump.call().get(60)
except DeviceMeshError as exc:
    say("caught:", type(exc).__name__, isinstance(exc, SupervisionError))
assert heal_mesh(procs) is procs
after = list(procs.addresses)
say("replaced:", [r for r in range(3) if before[r] != after[r]], "island", after[1][0])
say("a:", a.bump.call().get(60).values())
say("b:", b.bump.call().get(60).values())
say("view:", view.bump.call().get(60).values())
say("new actor is not the dead one:", a.slice(gpus=1).where.call_one().get(60) != 0)
for bad in (lambda: procs.slice(gpus=0).heal(), lambda: heal_mesh(a)):
    try:
        bad()
    except (RuntimeError, TypeError) as exc:
        say("refused:", type(exc).__name__, exc)
procs.stop().get(60)
try:
    procs.heal()
except RuntimeError as exc:
    say("refused:", type(exc).__name__, exc)
say("END")
'''


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launch", ["pool", "spawned"])
def test_heal_replaces_the_dead_rank_and_remakes_its_actors(launch: str, tmp_path: Path) -> None:
    """Same mesh, the dead rank replaced (a spare pool rank or spawned), its actors remade; survivors keep state."""
    needs_ulfm()
    script = tmp_path / "heal_job.py"
    script.write_text(SCRIPT)
    job = run_job(job_cmd(launch, script, n=5), timeout=200)
    out = job.stdout
    assert "untouched: True True" in out, job.describe()
    assert "caught: SupervisionError True" in out, job.describe()
    island = 0 if launch == "pool" else r"[1-9]\d*"
    assert re.search(rf"^replaced: \[1\] island {island}$", out, re.M), job.describe()
    # a: 10 +2 (all) +2 (survivors, the failed call) +2 -> 16; the remade rank 1 starts again at 10 -> 12
    assert "a: [16, 12, 16]" in out, job.describe()
    assert "b: [2, 1, 2]" in out, job.describe()
    assert "view: [14, 18]" in out, job.describe()  # a view taken before the heal follows it
    assert "new actor is not the dead one: True" in out, job.describe()
    assert ("refused: RuntimeError cannot heal ProcMesh(): it is a reference (a slice or a received mesh); "
            "call heal() on the mesh that spawn_procs() returned") in out, job.describe()
    assert ("refused: TypeError heal_mesh() takes the ProcMesh that spawn_procs() returned, got ActorMesh; "
            "for an actor mesh, heal the processes it runs on (its proc_mesh)") in out, job.describe()
    assert ("refused: RuntimeError cannot heal ProcMesh(gpus=3): `ProcMesh` has already been stopped; "
            "create new processes with spawn_procs()") in out, job.describe()
    assert_ended(job, 0, pool_deaths=launch == "pool")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("launch", ["pool", "spawned"])
def test_the_brief_heal_loop_example(launch: str) -> None:
    """examples/heal_mesh.py: DeviceMeshError caught, heal_mesh, the batch run again, every total right; exit 0."""
    needs_ulfm()
    example = ROOT / "examples" / "heal_mesh.py"
    if launch == "pool":
        cmd = [str(Path(sys.executable).parent / "mpimesh"), "run", "-n", "6", str(example)]
    else:
        cmd = python_cmd(str(example))
    job = run_job(cmd, timeout=200, end="totals [18.0")
    out = job.stdout
    assert re.search(r"^batch 3: killing worker 2 \(pid \d+\) with SIGKILL$", out, re.M), job.describe()
    assert re.search(r"^Node failure detected at step 3: Endpoint call workers\.compute\(\) failed", out, re.M), \
        job.describe()
    assert "healed: ProcMesh(gpus=4), rank(s) [2] replaced" in out, job.describe()
    assert "totals [18.0, 18.0, 18.0, 18.0] OK" in out, job.describe()
    assert_ended(job, 0, pool_deaths=launch == "pool")
