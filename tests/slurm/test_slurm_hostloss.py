"""A whole host lost under Slurm, for real (issue #27): the job goes on, and its status does not lie.

On the 3-node Slurm of ``.ci/slurm-hosts.sh`` (simulated hosts sl1..sl3),
``jobs/slurm/mpimesh.sbatch`` runs a 6-rank job (two ranks a node, the
controller on sl1; ``#SBATCH --no-kill``, and ``srun --mpi=pmix --no-kill
--kill-on-bad-exit=0``).  The script has a mesh with one worker on each node
and a call pending on sl3's; once it says READY, the test kills every process
of sl3 (its slurmd, slurmstepd and both ranks), as a crash or a power cut
would.  Then:

* the controller gets a ``SupervisionError`` naming sl3's process within 1 s
  (both sides read the one ``CLOCK_MONOTONIC`` of the machine: the figure
  is printed);
* the survivors on sl1 and sl2 answer further calls;
* the job's exit status is the one the script chose (3), or non-zero when
  the script does not handle the failure;
* nothing of the job is left in any host, and sl3 is revived for the next test.

Variants: a frozen host (every process of sl3 SIGSTOPped: its first process
found by ULFM's heartbeat detector, the others by the controller's question
to the host that follows, within ~2 s), one rank killed, and the negative control
without mpimesh's PMIx notification fix (``MPIMESH_PMIX_NOTIFY=0``): Slurm's
PMIx plugin cancels the whole step, which pins why the fix is there.

Runs only as root with the Slurm of ``.ci/slurm-hosts.sh`` up, and
``MPIMESH_TEST_SLURM_HOSTS`` set to its host prefix (``.ci/slurm-hosts-tests.sh``
does all of it); skips with the reason otherwise.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from mpitest import leftovers
from slurmlib import nodes_idle

pytestmark = [pytest.mark.subprocess, pytest.mark.slurm, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
CI = ROOT / ".ci" / "slurm-hosts.sh"
TEMPLATE = ROOT / "jobs" / "slurm" / "mpimesh.sbatch"
PREFIX = os.environ.get("MPIMESH_TEST_SLURM_HOSTS", "")
HOSTS = [f"{PREFIX}{i}" for i in (1, 2, 3)]
LOST = HOSTS[2]
#: detection bounds (issue #27): a killed host within 1 s, a frozen one within ~2 s: ULFM's detector finds
#: the first frozen process in its 2 s, the controller the host's other ones 0.5 s later
#: (``_roles/liveness.py``; without it 5.7-6 s, one process after another). Measured 2.30-2.48 s in 6 runs
#: of 6 at load 12-20 (1.80-2.09 s with a 1.5 s detector timeout); the bound leaves room for a loaded CI.
KILL_BOUND = 1.0
FREEZE_BOUND = 3.5
#: the script's own status when it handled the failure
CHOSEN = 3

JOB = r'''
import json, os, socket, sys, time
import mpimesh
from mpimesh import Actor, SupervisionError, endpoint, host_mesh


class W(Actor):
    @endpoint
    def where(self):
        return socket.gethostname(), os.getpid()

    @endpoint
    def sleep(self, seconds):
        time.sleep(seconds)
        return os.getpid()


mode = sys.argv[1]
failures = []
if mode != "unhandled":
    mpimesh.unhandled_fault_hook = lambda failure: failures.append(str(failure).splitlines()[0])
procs = host_mesh().spawn_procs(per_host={"gpus": 1})
ws = procs.spawn("w", W)
where = [ws.slice(hosts=h).where.call_one().get(60) for h in range(3)]
pending = ws.slice(hosts=2).sleep.call_one(120)
print("READY " + json.dumps(where), flush=True)
if mode == "unhandled":
    pending.get(90)
    print("NOT REACHED", flush=True)
try:
    pending.get(90)
    print("NO ERROR", flush=True)
except SupervisionError as exc:
    print("CAUGHT " + json.dumps({"t": time.monotonic(), "message": str(exc)}), flush=True)
after = [ws.slice(hosts=h).where.call_one().get(30) for h in (0, 1)]
print("SURVIVORS " + json.dumps(after), flush=True)
print("HOOK " + json.dumps(failures), flush=True)
print("END", flush=True)
sys.exit(int(sys.argv[2]))
'''


def _skip_reason() -> str:
    if not PREFIX:
        return "needs the Slurm on simulated hosts: run `bash .ci/slurm-hosts-tests.sh` as root"
    if os.geteuid() != 0:
        return "needs root (kills and revives a simulated host)"
    if not os.environ.get("SLURM_CONF"):
        return "SLURM_CONF is not set: eval \"$(bash .ci/slurm-hosts.sh env)\""
    return ""


def _sh(*args: str, timeout: float = 30) -> str:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False).stdout


def _netns_pids(host: str) -> list[int]:
    return [int(p) for p in _sh("ip", "netns", "pids", host).split()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


@pytest.fixture
def cluster() -> Iterator[None]:
    """The 3 nodes idle before the test; sl3 revived and nothing of the job left after it."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    states = nodes_idle(HOSTS, 30)  # a node revived by the previous test registers again
    assert states is None, f"the nodes are not idle: {states}"
    yield
    revived = subprocess.run(["bash", str(CI), "revive", LOST], capture_output=True, text=True, timeout=60,
                             check=False)
    assert revived.returncode == 0, revived.stderr


@dataclass
class Job:
    """One submitted job: its status, its output, and when the host was lost."""

    returncode: int | None
    output: str
    lost_at: float
    tag: str

    def line(self, word: str) -> str | None:
        found = [line for line in self.output.splitlines() if line.startswith(word + " ")]
        return found[0][len(word) + 1:] if found else None

    def describe(self) -> str:
        return f"job status {self.returncode}, output:\n{self.output[-6000:]}"


class NeverReady(AssertionError):
    """The job ended (or hung) before its mesh was up: nothing was lost yet."""


def _submit(tmp_path: Path, mode: str, lose: str, *, job_text: str = JOB, per_node: int = 2, **env: str) -> Job:
    """Submit the job (``per_node`` ranks a node), lose sl3 (``lose``: kill, freeze, rank, freeze-rank) once READY.

    Waits for the job's end.  A job that never says READY fails the test
    (:class:`NeverReady`): it used to be submitted once more, as 3 boots in
    ~30 died (ULFM's detector declared a rank dead while it imported mpimesh
    after ``MPI_Init``); ``_launch/boot_beat.py`` fixed that
    (tests/slurm/test_slurm_boot.py).
    """
    return _submit_once(tmp_path / "1", mode, lose, job_text, per_node, env)


def _submit_once(tmp_path: Path, mode: str, lose: str, job_text: str, per_node: int, env: dict[str, str]) -> Job:
    tmp_path.mkdir()
    script = tmp_path / "job.py"
    script.write_text(job_text)
    out = tmp_path / "job.out"
    tag = f"mpimesh-test-slurm-{uuid.uuid4().hex[:8]}"
    environ = {**os.environ, "VENV": str(Path(sys.executable).parent.parent), "PYTHONPATH": str(ROOT),
               "MPIMESH_TEST_TAG": tag, **env}
    cmd = ["sbatch", "--wait", "--quiet", "--nodes=3", f"--ntasks={3 * per_node}", f"--ntasks-per-node={per_node}",
           "--time=3", f"--output={out}", "--job-name=hostloss", str(TEMPLATE), str(script), mode, str(CHOSEN)]
    with open(tmp_path / "sbatch.log", "wb") as log:
        job = subprocess.Popen(cmd, env=environ, cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    lost_at = 0.0
    frozen: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and job.poll() is None:
            if out.exists() and "READY " in out.read_text(errors="replace"):
                break
            time.sleep(0.05)
        if not (out.exists() and "READY " in out.read_text(errors="replace")):
            raise NeverReady(
                f"the job never said READY:\n{out.read_text(errors='replace') if out.exists() else 'no output'}")
        time.sleep(0.5)  # the call to sl3's worker is on its way
        if lose in ("rank", "freeze-rank"):  # only the worker of the mesh there
            victims = [json.loads(out.read_text(errors="replace").split("READY ", 1)[1].splitlines()[0])[2][1]]
        else:
            victims = _netns_pids(LOST)
        assert victims, f"nothing runs in {LOST}"
        lost_at = time.monotonic()
        for pid in victims:
            try:
                os.kill(pid, signal.SIGSTOP if lose.startswith("freeze") else signal.SIGKILL)
            except ProcessLookupError:
                pass
        frozen = victims if lose.startswith("freeze") else []
        if lose == "freeze-rank":  # its host lives on: srun would wait for the frozen task, so kill it at the end
            deadline = time.monotonic() + 150
            while job.poll() is None and time.monotonic() < deadline and "END" not in out.read_text(errors="replace"):
                time.sleep(0.1)
            for pid in frozen:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        try:
            job.wait(150)
        except subprocess.TimeoutExpired:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(10)
            returncode: int | None = None
        else:
            returncode = job.returncode
    finally:
        for pid in frozen:  # a frozen host is a dead one: kill it now, after the job
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait(10)
    if returncode is None:
        subprocess.run(["scancel", "--full", "--name=hostloss"], timeout=30, check=False)
    output = out.read_text(errors="replace") if out.exists() else ""
    return Job(returncode, output, lost_at, tag)


def _nothing_left(job: Job) -> None:
    """No process of the job anywhere, and only slurmd in the surviving hosts (5 s to go)."""
    deadline = time.monotonic() + 5
    while True:
        left = leftovers(job.tag)
        strays = {h: [f"{p} {_comm(p)}" for p in _netns_pids(h) if _comm(p) != "slurmd"] for h in HOSTS}
        strays = {h: s for h, s in strays.items() if s}
        if not left and not strays:
            return
        if time.monotonic() > deadline:
            for line in left:
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            pytest.fail(f"left behind: {left} {strays}\n{job.describe()}")
        time.sleep(0.1)


def _caught(job: Job, bound: float) -> float:
    caught = job.line("CAUGHT")
    assert caught is not None, job.describe()
    found = json.loads(caught)
    seconds = float(found["t"]) - job.lost_at
    where = json.loads(job.line("READY") or "[]")
    host, pid = where[2]
    assert host == LOST, where
    assert re.search(rf"process 0\.\d+ \(pid {pid}\) on {LOST} died", found["message"]), found["message"]
    print(f"\n{LOST} lost -> SupervisionError at the controller: {seconds * 1e3:.0f} ms")
    assert 0 < seconds < bound, f"SupervisionError {seconds:.3f} s after the loss (bound {bound} s)\n{job.describe()}"
    return seconds


def _survivors_answered(job: Job) -> None:
    where = json.loads(job.line("READY") or "[]")
    after = json.loads(job.line("SURVIVORS") or "[]")
    assert after == where[:2], job.describe()


@pytest.mark.usefixtures("cluster")
def test_a_lost_host_raises_supervision_error_and_the_survivors_go_on(tmp_path: Path) -> None:
    job = _submit(tmp_path, "handled", "kill")
    _caught(job, KILL_BOUND)
    _survivors_answered(job)
    assert "END" in job.output.splitlines(), job.describe()
    assert job.returncode == CHOSEN, job.describe()
    _nothing_left(job)


@pytest.mark.usefixtures("cluster")
def test_a_lost_host_that_the_script_does_not_handle_fails_the_job(tmp_path: Path) -> None:
    job = _submit(tmp_path, "unhandled", "kill")
    assert "NOT REACHED" not in job.output, job.describe()
    assert job.returncode not in (0, None), job.describe()
    assert f"on {LOST} died" in job.output, job.describe()
    _nothing_left(job)


@pytest.mark.usefixtures("cluster")
def test_a_frozen_host_is_found_by_the_heartbeat_detector(tmp_path: Path) -> None:
    job = _submit(tmp_path, "handled", "freeze")
    _caught(job, FREEZE_BOUND)
    _survivors_answered(job)
    assert job.returncode == CHOSEN, job.describe()
    _nothing_left(job)


@pytest.mark.usefixtures("cluster")
def test_without_the_notification_fix_slurm_cancels_the_step(tmp_path: Path) -> None:
    """The negative control: MPIMESH_PMIX_NOTIFY=0, and Slurm's PMIx plugin kills the whole step.

    Pins why the interposer is there; turns red when a Slurm no longer kills
    the step on ULFM's PMIX_ERR_PROC_TERM_WO_SYNC (then the fix may go).
    """
    try:
        job = _submit(tmp_path, "handled", "kill", MPIMESH_PMIX_NOTIFY="0")
    except NeverReady as exc:
        # Measured 2026-11-27: without the interposer a rank's death at boot (a SIGSEGV with no
        # backtrace; ULFM's false report of a failed process while the ranks started is fixed since)
        # makes Slurm cancel the step before any host is lost: this test cannot tell anything then.
        pytest.xfail(f"without the notification fix the job died at boot, before the host loss: {exc}"[:2000])
    assert job.line("SURVIVORS") is None, job.describe()
    assert job.returncode not in (0, None), job.describe()
    assert re.search(r"CANCELLED|_errhandler|Killed", job.output), job.describe()
    _nothing_left(job)


@pytest.mark.usefixtures("cluster")
def test_a_single_rank_killed_on_another_host(tmp_path: Path) -> None:
    job = _submit(tmp_path, "handled", "rank")
    _caught(job, KILL_BOUND)
    _survivors_answered(job)
    assert job.returncode == CHOSEN, job.describe()
    _nothing_left(job)
