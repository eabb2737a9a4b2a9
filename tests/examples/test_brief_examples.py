"""The product brief's programs (``../shared/reference/brief-examples.md`` §1-2) run with only the imports changed."""

from __future__ import annotations

import re

import pytest
from mpitest import ROOT, mpiexec_cmd, python_cmd, run

#: Above every run's own bound (at most 300 s): see tests/examples/test_examples.py.
pytestmark = [pytest.mark.subprocess, pytest.mark.timeout(360)]


def test_brief_sharded_matmul() -> None:
    """§1: an 8-process Mesh, a tensor sharded by rows that shows its global shape, dt @ dt.T the global product."""
    result = run(python_cmd(str(ROOT / "examples" / "brief_sharded_matmul.py")), timeout=240)
    assert result.returncode == 0, result.stderr
    for line in ("Mesh initialized with 8 devices.", "torch.Size([1024, 1024])", "equals the local product: True"):
        assert line in result.stdout, (line, result.stdout)
    assert result.orphans == []


def test_brief_training_matches_one_process() -> None:
    """§2 on a 2 x 2 mesh (pool ranks and spawned ones): 20 AdamW steps give one-process losses within 1e-5."""
    script = str(ROOT / "examples" / "brief_training.py")
    env = {"BRIEF_MESH": "2x2", "BRIEF_STEPS": "20"}
    result = run(mpiexec_cmd(3, *python_cmd("-m", "mpimesh", script)), timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    found = re.search(r"largest loss difference (\S+), largest weight difference (\S+)", result.stdout)
    assert found is not None, result.stdout
    assert float(found[1]) < 1e-5, result.stdout
    assert float(found[2]) < 1e-4, result.stdout
    assert result.stdout.count("step ") == 20
    assert result.orphans == []
