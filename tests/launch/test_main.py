"""``python -m mpimesh``: exit status, tracebacks, teardown, no orphans.

Each case runs its own job in a subprocess with a time bound, and checks
that no process of that job is left afterwards.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from mpitest import base_env, leftovers, mpiexec_cmd, python_cmd, run

pytestmark = pytest.mark.subprocess

ACTORS = """
import os, sys, time
from mpimesh import Actor, endpoint, this_host

class A(Actor):
    @endpoint
    def pid(self):
        return os.getpid()

    @endpoint
    def fail(self):
        raise ValueError("remote failure 42")

    @endpoint
    def hang(self):
        time.sleep(3600)
"""


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(ACTORS + body)
    return str(path)


@pytest.mark.parametrize("launch", ["mpirun2", "mpirun3", "spawned"])
def test_exit_status_is_the_scripts(tmp_path: Path, launch: str) -> None:
    """The job exits with the script's status and its argv; every rank ends."""
    path = script(tmp_path, """
procs = this_host().spawn_procs(per_host={"gpus": 2})
print("pids", procs.spawn("a", A).pid.call().get(30).values(), sys.argv[1:], flush=True)
sys.exit(3)
""")
    cmd = python_cmd("-m", "mpimesh", path, "x", "--y")
    if launch != "spawned":
        cmd = mpiexec_cmd(int(launch[-1]), *cmd)
    result = run(cmd, timeout=60)
    assert result.returncode == 3, result.stderr
    assert "pids [" in result.stdout and "['x', '--y']" in result.stdout
    assert result.orphans == []


@pytest.mark.parametrize("launch", ["mpirun2", "spawned"])
def test_uncaught_exception_ends_every_rank(tmp_path: Path, launch: str) -> None:
    """An uncaught exception prints its traceback once and ends the job non-zero, promptly."""
    path = script(tmp_path, """
procs = this_host().spawn_procs(per_host={"gpus": 2})
mesh = procs.spawn("a", A)
mesh.pid.call().get(30)
mesh.fail.call().get(30)
""")
    cmd = python_cmd("-m", "mpimesh", path)
    if launch != "spawned":
        cmd = mpiexec_cmd(2, *cmd)
    result = run(cmd, timeout=60)
    assert result.returncode != 0
    # one report: the remote traceback chained under the controller's
    assert result.stderr.count("mpimesh.ActorError: Actor call a.fail failed") == 1, result.stderr
    assert result.stderr.count("### rank 0 (gpus=0)") == 1, result.stderr
    assert result.stderr.count(", in fail\n") == 1, result.stderr  # the remote frame, printed once
    assert "ValueError: remote failure 42" in result.stderr
    assert "### rank 0 (gpus=0) on " in result.stderr
    assert "mpimesh.ActorError: Actor call a.fail failed at rank 0" in result.stderr
    assert result.seconds < 30
    assert result.orphans == []


def test_worker_stuck_in_endpoint_is_ended(tmp_path: Path) -> None:
    """At exit, a worker stuck inside an endpoint does not keep the job alive."""
    path = script(tmp_path, """
procs = this_host().spawn_procs(per_host={"gpus": 1})
procs.spawn("a", A).hang.broadcast()
time.sleep(0.2)
print("leaving", flush=True)
""")
    result = run(python_cmd("-m", "mpimesh", path), timeout=60,
                 env={"MPIMESH_SHUTDOWN_TIMEOUT": "2", "MPIMESH_CLEANUP_TIMEOUT": "1"})
    assert "leaving" in result.stdout
    assert result.seconds < 20
    assert result.orphans == []


def test_module_and_code_targets(tmp_path: Path) -> None:
    """`-m module` and `-c code` run as __main__ with their argv."""
    (tmp_path / "jobmod.py").write_text("import sys\nprint('module', __name__, sys.argv[1:])\n")
    result = run(mpiexec_cmd(2, *python_cmd("-m", "mpimesh", "-m", "jobmod", "a")), timeout=60, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "module __main__ ['a']" in result.stdout
    result = run(python_cmd("-m", "mpimesh", "-c", "import sys; print('code', sys.argv)", "b"), timeout=60)
    assert result.returncode == 0 and "code ['-c', 'b']" in result.stdout


def test_embedded_controller(tmp_path: Path) -> None:
    """`python script.py` that imports mpimesh spawns its workers and ends them."""
    path = script(tmp_path, """
procs = this_host().spawn_procs(per_host={"gpus": 2})
print("values", procs.spawn("a", A).pid.call().get(30).values(), flush=True)
""")
    result = run(python_cmd(path), timeout=60)
    assert result.returncode == 0, result.stderr
    assert "values [" in result.stdout
    assert result.orphans == []


def test_every_rank_running_the_script_is_refused(tmp_path: Path) -> None:
    """`mpirun -n 2 python script.py` (without -m mpimesh) says how to launch."""
    path = script(tmp_path, "this_host()\n")
    result = run(mpiexec_cmd(2, *python_cmd(path)), timeout=60)
    assert result.returncode != 0
    assert (
        "RuntimeError: rank 0 of 2 runs the controller script: every rank of this job started it; "
        "launch it with `mpirun -n 2 python -m mpimesh job.py`"
    ) in result.stderr
    assert result.orphans == []


def test_usage_errors() -> None:
    """No script, an unknown option or a missing file: usage on stderr, non-zero exit."""
    result = run(python_cmd("-m", "mpimesh"), timeout=30)
    assert result.returncode != 0 and "mpimesh: no script given" in result.stderr
    result = run(python_cmd("-m", "mpimesh", "--frobnicate"), timeout=30)
    assert result.returncode != 0 and "mpimesh: unknown option '--frobnicate'" in result.stderr
    result = run(python_cmd("-m", "mpimesh", "/nonexistent/job.py"), timeout=30)
    assert result.returncode != 0 and "mpimesh: can't open file '/nonexistent/job.py': no such file" in result.stderr


def test_no_worker_outlives_a_killed_controller(tmp_path: Path) -> None:
    """SIGKILL of the controller: its spawned workers notice and exit."""
    ready = tmp_path / "ready"
    path = script(tmp_path, f"""
procs = this_host().spawn_procs(per_host={{"gpus": 2}})
pids = procs.spawn("a", A).pid.call().get(30).values()
open({str(ready)!r}, "w").write(" ".join(map(str, pids)))
time.sleep(3600)
""")
    tag = f"mpimesh-kill-{os.getpid()}-{time.time_ns()}"
    env = base_env(MPIMESH_TEST_TAG=tag)
    proc = subprocess.Popen(python_cmd("-m", "mpimesh", path), env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() or not ready.read_text():
            assert time.monotonic() < deadline and proc.poll() is None, "job did not start"
            time.sleep(0.05)
        pids = [int(p) for p in ready.read_text().split()]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{p}").exists() and ") Z " not in Path(f"/proc/{p}/stat").read_text() for p in pids):
            assert time.monotonic() < deadline, f"workers {pids} outlived the controller"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        for line in leftovers(tag):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
