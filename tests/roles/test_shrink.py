"""Shrinking a process mesh to its survivors (``ProcMesh.shrink``, elastic; issue #27 item 4).

The pure tests pin the dimension rule (``_core.shrink.plan``).  The job
tests kill workers of a ``(hosts=2, gpus=2)`` mesh (simulated on one host)
and go on with fewer, from the launch pool (``mpimesh run``) and spawned
(``python -m mpimesh`` as a singleton): the survivors keep their actors and
state, the spawner's actor meshes follow with the new coordinates, a
later death is reported in them, and the shrunk mesh can still heal.

The pool job runs with ``MPIMESH_FROM_GROUP=0``: the world's ULFM shrink of
the srun fallback (``_transport.live``) then runs under a plain ``mpiexec``.
A bare two-rank job pins its bound: a rank that neither joins nor dies.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from mpitest import ROOT, mpiexec_cmd, python_cmd
from mpitest import run as run_cmd
from test_faults import assert_ended, job_cmd, needs_ulfm, run_job

from mpimesh._core.shrink import Plan, plan


def test_plan_keeps_a_dimension_that_lost_whole_slices() -> None:
    """A lost host (every gpu of hosts=1) leaves hosts smaller; the other dimensions stay."""
    assert plan(("hosts", "gpus"), (2, 4), {4, 5, 6, 7}) == Plan(("hosts", "gpus"), (1, 4), (0, 1, 2, 3))
    assert plan(("hosts", "gpus"), (2, 4), {1, 5}) == Plan(("hosts", "gpus"), (2, 3), (0, 2, 3, 4, 6, 7))
    assert plan(("gpus",), (3,), {1}) == Plan(("gpus",), (2,), (0, 2))


def test_plan_flattens_other_losses_to_rank() -> None:
    """One process of a 2-D mesh: the survivors in one dimension ``rank``, in their order."""
    assert plan(("hosts", "gpus"), (2, 2), {1}) == Plan(("rank",), (3,), (0, 2, 3))
    assert plan(("hosts", "gpus"), (2, 4), {1, 6}) == Plan(("rank",), (6,), (0, 2, 3, 4, 5, 7))


def test_plan_without_a_death_or_without_a_survivor() -> None:
    """No death: the same shape; every rank dead: no survivor."""
    assert plan(("hosts", "gpus"), (2, 2), set()) == Plan(("hosts", "gpus"), (2, 2), (0, 1, 2, 3))
    assert plan(("gpus",), (2,), {0, 1}).survivors == ()


SCRIPT = r'''
import os, signal, sys, time
import mpimesh
from mpimesh import Actor, DeviceMeshError, current_rank, endpoint, this_host


def print(*parts, flush=True):
    # one write per line: the fault hook prints from another thread
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


class Counter(Actor):
    def __init__(self, start):
        self.n = start

    @endpoint
    def bump(self):
        self.n += 1
        return self.n

    @endpoint
    def where(self):
        point = current_rank()
        return (dict(point), dict(point.extent), self.n)

    @endpoint
    def boom(self):
        raise ValueError("boom")

    @endpoint
    def pid(self):
        return os.getpid()


def hook(failure):
    print("hook:", failure.mesh_name, failure.crashed_ranks, failure.coords, flush=True)


def kill(mesh, **at):
    os.kill(mesh.slice(**at).pid.call_one().get(60), signal.SIGKILL)


def wait_dead(procs, n):
    deadline = time.monotonic() + 30
    while len(procs.dead()) < n and time.monotonic() < deadline:
        time.sleep(0.05)


mpimesh.unhandled_fault_hook = hook
procs = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
print("untouched:", procs.shrink() is procs, flush=True)
a = procs.spawn("a", Counter, 10)
b = procs.slice(gpus=0).spawn("b", Counter, 0)
a.bump.call().get(60)
pids = list(a.pid.call().get(60).values())
kill(a, hosts=0, gpus=1)
try:
    a.bump.call().get(60)
except DeviceMeshError as exc:
    print("caught:", type(exc).__name__, flush=True)
wait_dead(procs, 1)
old = procs
procs = old.shrink()
print("shrunk:", repr(procs), procs is not old, old.stopped, len(procs.addresses), flush=True)
print("a:", repr(a), a.bump.call().get(60).values(), flush=True)
print("a where:", [w[:2] for w in a.where.call().get(60).values()], flush=True)
print("a pids:", list(a.pid.call().get(60).values()) == [pids[0], pids[2], pids[3]], flush=True)
print("a rank 1:", a.slice(rank=slice(1, 2)).where.call_one().get(60), flush=True)
print("b:", repr(b), b.bump.call().get(60).values(), flush=True)
for bad in (lambda: procs.slice(rank=0).shrink(), old.shrink, lambda: old.spawn("c", Counter, 0)):
    try:
        bad()
    except RuntimeError as exc:
        print("refused:", exc, flush=True)
c = procs.spawn("c", Counter, 5)
print("c:", c.bump.call().get(60).values(), flush=True)
a.slice(rank=slice(1, 2)).boom.broadcast()
time.sleep(1)
kill(a, rank=2)
wait_dead(procs, 1)
time.sleep(0.5)
procs.stop().get(60)
print("stopped:", procs.stopped, flush=True)

grid = this_host().spawn_procs(per_host={"hosts": 2, "gpus": 2})
g = grid.spawn("g", Counter, 0)
g.bump.call().get(60)
kill(g, hosts=1, gpus=0)
kill(g, hosts=1, gpus=1)
wait_dead(grid, 2)
row = grid.shrink()
print("row:", repr(row), repr(g), g.bump.call().get(60).values(), flush=True)
print("row where:", [w[:2] for w in g.where.call().get(60).values()], flush=True)
kill(g, hosts=0, gpus=1)
wait_dead(row, 1)
print("healed row:", repr(mpimesh.heal_mesh(row)), g.bump.call().get(60).values(), flush=True)
from mpimesh._transport import live
print("world shrunk:", bool(live._live), flush=True)
row.stop().get(60)
print("END", flush=True)
'''


@pytest.mark.subprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("launch", ["pool", "spawned"])
def test_shrink_goes_on_with_the_survivors(launch: str, tmp_path: Path) -> None:
    """One dead process: survivors in ``rank=3``, their state kept; a dead row: ``hosts=1, gpus=2``."""
    needs_ulfm()
    script = tmp_path / "shrink_job.py"
    script.write_text(SCRIPT)
    # the pool job shrinks the world too, as under srun (every process sees the knob)
    job = run_job(job_cmd(launch, script, n=8), timeout=200,
                  env={"MPIMESH_FROM_GROUP": "0"} if launch == "pool" else None)
    out = job.stdout
    assert f"world shrunk: {launch == 'pool'}" in out, job.describe()
    assert "untouched: True" in out, job.describe()
    assert "caught: SupervisionError" in out, job.describe()
    assert "shrunk: ProcMesh(rank=3) True True 3" in out, job.describe()
    # a: 10 +1 (all) +1 (survivors, the failed call) +1 -> 13, renumbered 0..2
    assert "a: ActorMesh('a', Counter, rank=3) [13, 13, 13]" in out, job.describe()
    assert ("a where: [({'rank': 0}, {'rank': 3}), ({'rank': 1}, {'rank': 3}), ({'rank': 2}, {'rank': 3})]"
            in out), job.describe()
    assert "a pids: True" in out, job.describe()  # the same actors, in their order
    assert "a rank 1: ({'rank': 0}, {'rank': 1}, 13)" in out, job.describe()
    # b lived on gpus=0 of both hosts: no death, nothing changes
    assert "b: ActorMesh('b', Counter, hosts=2) [1, 1]" in out, job.describe()
    assert ("refused: cannot shrink ProcMesh(): it is a reference (a slice or a received mesh); "
            "call shrink() on the mesh that spawn_procs() returned") in out, job.describe()
    assert ("refused: cannot shrink ProcMesh(hosts=2, gpus=2): `ProcMesh` has already been stopped; "
            "create new processes with spawn_procs()") in out, job.describe()
    assert "refused: cannot spawn on ProcMesh(hosts=2, gpus=2): `ProcMesh` has already been stopped" in out, \
        job.describe()
    assert "c: [6, 6, 6]" in out, job.describe()
    assert "hook: a [1] [{'rank': 1}]" in out, job.describe()  # an actor's failure, in the shrunk coordinates
    # the later death, in the shrunk coordinates: a and c had an actor on the old rank 3, now rank 2
    assert "hook: a [2] [{'rank': 2}]" in out, job.describe()
    assert "hook: c [2] [{'rank': 2}]" in out, job.describe()
    assert "stopped: True" in out, job.describe()
    assert "row: ProcMesh(hosts=1, gpus=2) ActorMesh('g', Counter, hosts=1, gpus=2) [2, 2]" in out, job.describe()
    assert ("row where: [({'hosts': 0, 'gpus': 0}, {'hosts': 1, 'gpus': 2}), "
            "({'hosts': 0, 'gpus': 1}, {'hosts': 1, 'gpus': 2})]") in out, job.describe()
    # a shrunk mesh heals: the remade actor starts again, the survivor keeps its count
    assert "healed row: ProcMesh(hosts=1, gpus=2) [3, 1]" in out, job.describe()
    assert_ended(job, 0, pool_deaths=launch == "pool")


@pytest.mark.subprocess
@pytest.mark.timeout(240)
@pytest.mark.parametrize("launch", ["pool", "spawned"])
def test_the_brief_loop_example_shrinks(launch: str) -> None:
    """examples/heal_mesh.py --shrink: the failure caught, the 3 survivors go on with their totals; exit 0."""
    needs_ulfm()
    example = ROOT / "examples" / "heal_mesh.py"
    if launch == "pool":
        cmd = [str(Path(sys.executable).parent / "mpimesh"), "run", "-n", "5", str(example), "--shrink"]
    else:
        cmd = python_cmd(str(example), "--shrink")
    job = run_job(cmd, timeout=200, end="totals [18.0")
    out = job.stdout
    assert re.search(r"^Node failure detected at step 3: Endpoint call workers\.compute\(\) failed", out, re.M), \
        job.describe()
    assert "shrunk: ProcMesh(gpus=3), ActorMesh('workers', Worker, gpus=3)" in out, job.describe()
    assert "batch 3: totals [8.0, 8.0, 8.0]" in out, job.describe()
    assert "totals [18.0, 18.0, 18.0] OK" in out, job.describe()
    assert_ended(job, 0, pool_deaths=launch == "pool")


FROZEN = r"""
import sys, time
from mpimesh._transport import live
from mpimesh._transport.mpi import MPI

rank = MPI.COMM_WORLD.Get_rank()
live.announce()
live.shrink(30.0)  # both join
print(rank, "shrunk", live._live[0].Get_size(), flush=True)
live.announce()
if rank == 0:
    start = time.monotonic()
    try:
        live.shrink(1.0, [(0, 0), (0, 1)])
    except TimeoutError as exc:
        print(rank, "after", round(time.monotonic() - start, 1), exc, flush=True)
    live._late[0].join(30)  # rank 1 joins late: the shrink that outlived its bound ends, and is installed
    print(rank, "late", not live._late[0].is_alive(), live._live[0].Get_size(), flush=True)
else:
    time.sleep(3.0)  # frozen, as far as MPI can tell
    live.shrink(30.0)
print(rank, "done", flush=True)
"""


@pytest.mark.subprocess
@pytest.mark.timeout(120)
def test_the_world_shrink_gives_up_at_its_bound_when_a_process_neither_joins_nor_dies(tmp_path: Path) -> None:
    """A rank that makes no MPI call: the other's shrink raises TimeoutError naming the processes and the knob."""
    needs_ulfm()
    script = tmp_path / "frozen.py"
    script.write_text(FROZEN)
    done = run_cmd(mpiexec_cmd(2, "--with-ft", "ulfm", sys.executable, str(script)), timeout=90)
    out = done.stdout
    assert done.returncode == 0 and not done.orphans, (out, done.stderr)
    assert "0 shrunk 2" in out and "1 shrunk 2" in out, out
    assert re.search(r"^0 after 1\.\d mpimesh: the world's shrink to its live processes \(ULFM's MPI_Comm_shrink, "
                     r"made where MPI_Comm_create_from_group is unsupported\) did not end within 1 s "
                     r"\(MPIMESH_SPAWN_TIMEOUT\): a live process among 0\.0, 0\.1 neither joined it nor died "
                     r"\(frozen\?\)", out, re.M), out
    assert "0 late True 2" in out and "0 done" in out and "1 done" in out, out
