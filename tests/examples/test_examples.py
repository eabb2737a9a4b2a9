"""The examples run, both from the launch pool and with spawned workers."""

from __future__ import annotations

import pytest
from mpitest import ROOT, mpiexec_cmd, python_cmd, run

#: pytest-timeout's bound is above every run's own (at most 300 s): a run that overruns is ended by
#: mpitest.run, which kills its session and reports its output, not left running by pytest-timeout.
pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(360)]


@pytest.mark.parametrize("launch", ["mpirun5", "spawned"])
def test_hello_mesh(launch: str) -> None:
    """hello_mesh prints one greeting per actor, catches the remote error, ends cleanly."""
    cmd = python_cmd(str(ROOT / "examples" / "hello_mesh.py"))
    if launch == "mpirun5":
        cmd = mpiexec_cmd(5, *python_cmd("-m", "mpimesh", str(ROOT / "examples" / "hello_mesh.py")))
    result = run(cmd, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("hello, mesh, from") == 4
    assert "caught ZeroDivisionError from rank 1: float division by zero" in result.stdout
    assert result.stdout.rstrip().endswith("done")
    assert result.orphans == []


@pytest.mark.parametrize("launch", ["mpirun5", "spawned"])
def test_ping_pong(launch: str) -> None:
    """ping_pong: each ping rallies with the pong of its own rank, sync and async."""
    cmd = python_cmd(str(ROOT / "examples" / "ping_pong.py"))
    if launch == "mpirun5":
        cmd = mpiexec_cmd(5, *python_cmd("-m", "mpimesh", str(ROOT / "examples" / "ping_pong.py")))
    result = run(cmd, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "ping[1]: ['pong 0 from pong[1]', 'pong 1 from pong[1]', 'pong 2 from pong[1]']" in result.stdout
    assert "async: ['pong 0 from pong[1]', 'pong 1 from pong[1]']" in result.stdout
    assert result.orphans == []


# The heavier examples run once each, alternating the launch: the other way is the
# mesh suite's (n=1 spawns its workers), and hello_mesh and ping_pong run both ways.
@pytest.mark.parametrize("launch", ["spawned"])
def test_grpo_pipeline(launch: str) -> None:
    """grpo_pipeline: send(), a concurrent buffer and RDMA weights train the bandit policy to full accuracy."""
    script = str(ROOT / "examples" / "grpo_pipeline.py")
    cmd = python_cmd(script)
    if launch == "mpirun4":
        cmd = mpiexec_cmd(4, *python_cmd("-m", "mpimesh", script))
    result = run(cmd, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "rollouts 1920; greedy accuracy 1.00 OK" in result.stdout, result.stdout
    assert result.orphans == []


@pytest.mark.parametrize("launch", ["mpirun5"])
def test_tensor_basics(launch: str) -> None:
    """tensor_basics: ops on every process, reduce/stack, remote functions, a sharded matmul, a poisoned fetch."""
    script = str(ROOT / "examples" / "tensor_basics.py")
    cmd = python_cmd(script)
    if launch == "mpirun5":
        cmd = mpiexec_cmd(5, *python_cmd("-m", "mpimesh", script))
    result = run(cmd, timeout=240)
    assert result.returncode == 0, result.stderr
    for line in ("x on gpus=2: [3.0, 3.0, 3.0]", "sum over gpus: [10.0, 10.0, 10.0]", "stacked ranks: [0, 1, 2, 3]",
                 "remote on gpus=3: [4.0, 4.0, 4.0]", "sharded a @ a.T equals local torch: True",
                 "gather(distribute(a)) == a: True", "caught on gpus=2: ValueError: rank 2 does not like this tensor",
                 "gpus=0 is fine: [2.0, 2.0]"):
        assert line in result.stdout, (line, result.stdout)
    assert result.stdout.rstrip().endswith("done")
    assert result.orphans == []


@pytest.mark.parametrize(("example", "launch"), [("tensor_dp.py", "mpirun5"), ("tensor_dp_tp.py", "spawned")])
def test_tensor_training_matches_one_process(example: str, launch: str) -> None:
    """Data-parallel and dp x tp training from the controller give one-process training's losses (1e-5 relative)."""
    script = str(ROOT / "examples" / example)
    cmd = python_cmd(script)
    if launch == "mpirun5":
        cmd = mpiexec_cmd(5, *python_cmd("-m", "mpimesh", script))
    result = run(cmd, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "largest relative difference from one-process training:" in result.stdout, result.stdout
    assert result.stdout.rstrip().endswith("OK"), result.stdout
    assert result.orphans == []


@pytest.mark.parametrize("launch", ["mpirun5", "spawned"])
def test_ddp_in_actors(launch: str) -> None:
    """ddp_in_actors: DDP over gloo in 4 actors keeps every rank's parameters equal and lowers the loss."""
    script = str(ROOT / "examples" / "ddp_in_actors.py")
    cmd = python_cmd(script)
    if launch == "mpirun5":
        cmd = mpiexec_cmd(5, *python_cmd("-m", "mpimesh", script))
    result = run(cmd, timeout=240)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("step ") == 30, result.stdout
    assert "parameters identical on all 4 ranks: True" in result.stdout, result.stdout
    assert result.stdout.rstrip().endswith("OK"), result.stdout
    assert result.orphans == []
