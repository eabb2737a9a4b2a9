"""Global-view tensors (issue #28): what a user sees, line by line (global_view_job.py, a section of shared_job.py)."""

from __future__ import annotations

import pytest
from shared_job_run import TIMEOUT, section

pytestmark = pytest.mark.subprocess

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


@pytest.mark.timeout(TIMEOUT + 60)  # the first test of the three runs the shared job
def test_global_view_tensors() -> None:
    """Shapes and placements known at once, ops with their global meaning, clear mixing errors, poison, freeing."""
    out = section("global_view_job")
    for line in EXPECTED:
        assert line in out, (line, out)
