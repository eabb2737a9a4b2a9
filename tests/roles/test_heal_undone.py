"""A heal that fails part-way leaves nothing half-done (issue #27): all or nothing.

One pool job (``mpimesh run -n 6``: the controller, a mesh of 3, two spares)
with two actor meshes on the mesh, ``a`` (always made) and ``b`` (whose
constructor obeys a flag file).  Rank 1 is killed, then:

1. ``b``'s constructor raises on the replacement: ``heal()`` raises a
   ``RuntimeError`` naming rank 1, the cause and the fix; the process mesh and
   *both* actor meshes still name the dead process (``a``'s new actor, made
   fine on the replacement, is not used: rank 1 of ``a`` still fails at once),
   the healthy ranks answer, and the owner's hook saw no new failure;
2. the replacement dies while ``b``'s actor is being made there (a spare
   lost mid-heal): the same, with the cause a ``SupervisionError``;
3. with the flag gone, ``heal()`` succeeds: the spare given back by the first
   attempt serves again, both actor meshes answer on every rank.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_faults import assert_ended, job_cmd, needs_ulfm, run_job

pytestmark = pytest.mark.subprocess

SCRIPT = r'''
import os, signal, sys
import mpimesh
from mpimesh import Actor, SupervisionError, endpoint, this_host

FLAG = sys.argv[1]


def say(*parts):
    # one write per line: the fault hook prints from another thread
    sys.stdout.write(" ".join(str(p) for p in parts) + "\n")
    sys.stdout.flush()


class A(Actor):
    @endpoint
    def pid(self):
        return os.getpid()


class B(A):
    def __init__(self):
        mode = open(FLAG).read() if os.path.exists(FLAG) else ""
        if mode == "raise":
            raise ValueError("b refuses to start 42")
        if mode == "die":
            os.kill(os.getpid(), signal.SIGKILL)


def state(tag):
    try:
        a.slice(gpus=1).pid.call_one().get(30)
        one = "answered"
    except SupervisionError:
        one = "dead"
    healthy = sorted(a.slice(gpus=g).pid.call_one().get(30) for g in (0, 2)) == healthy_pids
    say(tag, "addresses:", list(procs.addresses) == before, "a rank 1:", one, "healthy:", healthy,
        "hooked:", hooked)


hooked = 0


def hook(failure):
    global hooked
    hooked += 1


mpimesh.unhandled_fault_hook = hook
procs = this_host().spawn_procs(per_host={"gpus": 3})
a = procs.spawn("a", A)
b = procs.spawn("b", B)
pids = a.pid.call().get(30).values()
healthy_pids = sorted([pids[0], pids[2]])
os.kill(pids[1], signal.SIGKILL)
try:
    b.pid.call().get(30)
except SupervisionError:
    pass
while hooked < 2:  # a and b both had an actor on rank 1
    time.sleep(0.01)
before = list(procs.addresses)
for mode in ("raise", "die"):
    with open(FLAG, "w") as f:
        f.write(mode)
    try:
        procs.heal(timeout=60)
        say(mode, "healed?!")
    except RuntimeError as exc:
        say(mode, "error:", type(exc).__name__, "cause:", type(exc.__cause__).__name__, "text:", exc)
    state(mode)
os.unlink(FLAG)
procs.heal(timeout=60)
say("healed:", [r for r in range(3) if list(procs.addresses)[r] != before[r]],
    "a:", len(set(a.pid.call().get(30).values())), "b:", len(set(b.pid.call().get(30).values())), "hooked:", hooked)
procs.stop().get(30)
say("END")
'''.replace("import os, signal, sys", "import os, signal, sys, time")


@pytest.mark.timeout(240)
def test_a_failed_heal_moves_nothing_and_says_what_to_do(tmp_path: Path) -> None:
    needs_ulfm()
    script = tmp_path / "heal_undone.py"
    script.write_text(SCRIPT)
    job = run_job(job_cmd("pool", script, str(tmp_path / "flag"), n=6), timeout=200)
    out = job.stdout
    unchanged = "addresses: True a rank 1: dead healthy: True hooked: 2"
    assert f"raise {unchanged}" in out, job.describe()
    assert f"die {unchanged}" in out, job.describe()
    assert re.search(r"^raise error: RuntimeError cause: ActorError text: cannot heal: replacing rank 1 \(by "
                     r"\(0, \d\) on \S+\) failed, an actor's __init__ raised on it: ActorError: .*ValueError: "
                     r"b refuses to start 42; nothing changed: the mesh and its actor meshes still have dead "
                     r"rank\(s\) \[1\], and the replacements were given back; fix the cause and call heal\(\) "
                     r"again, or go on without them with shrink\(\)$", out, re.M), job.describe()
    assert re.search(r"^die error: RuntimeError cause: SupervisionError text: cannot heal: replacing rank 1 .* "
                     r"failed, a replacement died: ", out, re.M), job.describe()
    assert "healed: [1] a: 3 b: 3 hooked: 2" in out, job.describe()
    assert "healed?!" not in out, job.describe()
    assert_ended(job, 0, pool_deaths=True)
