"""The Slurm helpers shared by the Slurm tests and ``benchmarks/bench_heal.py`` (pure: a fake ``sinfo``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from slurmlib import nodes_idle

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def sinfo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``sinfo`` first on PATH that prints the file it returns, word for word."""
    states = tmp_path / "states"
    fake = tmp_path / "bin" / "sinfo"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\ncat "{states}"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    return states


def test_idle_nodes_return_at_once(sinfo: Path) -> None:
    """Every node named and idle: None."""
    sinfo.write_text("fx1 idle\nfx2 idle\n")
    assert nodes_idle(["fx1", "fx2"], 5) is None


def test_a_node_not_idle_gives_the_states_at_the_timeout(sinfo: Path) -> None:
    """A node down (or one missing) is waited for until the timeout, then the states seen are returned."""
    sinfo.write_text("fx1 idle\nfx2 down*\n")
    assert nodes_idle(["fx1", "fx2"], 0.3) == ["fx1", "idle", "fx2", "down*"]
    sinfo.write_text("fx1 idle\n")
    assert nodes_idle(["fx1", "fx2"], 0.0) == ["fx1", "idle"]


def test_the_benchmark_imports_the_helper_without_pytest() -> None:
    """bench_heal.py finds slurmlib from its own folder, and slurmlib needs nothing but the standard library."""
    code = ("import sys; sys.modules['pytest'] = None; sys.path.insert(0, 'benchmarks'); "
            "import runpy; g = runpy.run_path('benchmarks/bench_heal.py', run_name='not_main'); "
            "assert g['nodes_idle'].__module__ == 'slurmlib'")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
