"""module_to_mesh's gradients are one process's full-batch gradients (issue #28 item 5), shown by SGD."""

from __future__ import annotations

import re

import pytest
from shared_job_run import TIMEOUT, section


@pytest.mark.subprocess
@pytest.mark.timeout(TIMEOUT + 60)  # the first test of the three runs the shared job
def test_sgd_on_the_mesh_matches_one_process() -> None:
    """20 SGD steps (momentum 0.9, float64) on dp x tp and on dp alone: losses and weights within 1e-5.

    A mean loss over a batch sharded on dp once gave dp times the gradient (a
    loss's backward kernel divided by its piece's size), which AdamW hides.
    """
    out = section("module_sgd_job")
    for label in ("dp x tp", "dp"):
        found = re.search(rf"^{re.escape(label)}: loss difference (\S+) weight difference (\S+)", out, re.M)
        assert found is not None, out
        assert float(found[1]) < 1e-5 and float(found[2]) < 1e-5, out
