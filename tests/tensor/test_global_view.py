"""Global-view tensors (issue #28): one job checks what a user sees, line by line (global_view_job.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mpitest import python_cmd, run

pytestmark = pytest.mark.subprocess

JOB = Path(__file__).with_name("global_view_job.py")

EXPECTED = (
    "mesh Mesh(dp=2, tp=2) 4 ('dp', 'tp') True",
    "slice ProcMesh 2",
    "shape (8, 6) (Shard(dim=0), Shard(dim=1))",
    "matmul True",
    "index True",
    "ops True",
    "mean True",
    "redistribute (Replicate(), Replicate()) True",
    "to_local Tensor (4, 3) True",
    "placements True",
    "mixing: tensor engine: aten.add.Tensor mixes a global tensor (mpimesh.DTensor) with a per-process tensor",
    "mixing in activate: tensor engine: aten.add.Tensor mixes a global tensor (mpimesh.DTensor) with a per-process",
    "global in activate True",
    "controller tensor replicated True",
    "shape error at the line: RuntimeError",
    "cached True True True True True",
    "poisoned: RemoteTensorError",
    "still serving True",
    "loop True",
    "freed True",
)


def test_global_view_tensors() -> None:
    """Shapes and placements known at once, ops with their global meaning, clear mixing errors, poison, freeing."""
    result = run(python_cmd(str(JOB)), timeout=240)
    assert result.returncode == 0, result.stderr
    for line in EXPECTED:
        assert line in result.stdout, (line, result.stdout)
    assert result.stdout.rstrip().endswith("done")
    assert result.orphans == []
