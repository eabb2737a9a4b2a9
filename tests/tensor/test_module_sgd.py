"""module_to_mesh's gradients are one process's full-batch gradients (issue #28 item 5), shown by SGD."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mpitest import python_cmd, run

JOB = Path(__file__).with_name("module_sgd_job.py")


@pytest.mark.subprocess
def test_sgd_on_the_mesh_matches_one_process() -> None:
    """20 SGD steps (momentum 0.9, float64) on dp x tp and on dp alone: losses and weights within 1e-5.

    A mean loss over a batch sharded on dp once gave dp times the gradient (a
    loss's backward kernel divided by its piece's size), which AdamW hides.
    """
    result = run(python_cmd(str(JOB)), timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for label in ("dp x tp", "dp"):
        found = re.search(rf"^{re.escape(label)}: loss difference (\S+) weight difference (\S+)", out, re.M)
        assert found is not None, out + result.stderr
        assert float(found[1]) < 1e-5 and float(found[2]) < 1e-5, out
    assert out.rstrip().endswith("done")
    assert result.orphans == []
