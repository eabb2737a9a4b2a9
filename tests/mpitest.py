"""Helpers for tests that run mpimesh in a subprocess: commands, bounds, orphans.

Every subprocess gets a unique ``MPIMESH_TEST_TAG`` in its environment; all
its descendants inherit it, so after the run :func:`leftovers` finds any
process of that run still alive, whoever its parent is now.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

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
    and reports those still alive as orphans (and kills them).
    """
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
        for line in leftovers(tag):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        raise AssertionError(f"{' '.join(cmd)} hung (>{timeout:g} s)\nstdout:\n{out}\nstderr:\n{err}") from None
    seconds = time.monotonic() - start
    deadline = time.monotonic() + settle
    orphans = leftovers(tag)
    while orphans and time.monotonic() < deadline:
        time.sleep(0.05)
        orphans = leftovers(tag)
    for line in orphans:
        try:
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    return Run(proc.returncode, out, err, seconds, orphans)


def python_cmd(*args: str) -> list[str]:
    """This interpreter with ``args``."""
    return [sys.executable, *args]
