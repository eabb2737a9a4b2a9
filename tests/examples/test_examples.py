"""The examples run, both from the launch pool and with spawned workers."""

from __future__ import annotations

import pytest
from mpitest import ROOT, mpiexec_cmd, python_cmd, run

pytestmark = pytest.mark.subprocess


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


@pytest.mark.parametrize("launch", ["mpirun4", "spawned"])
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
