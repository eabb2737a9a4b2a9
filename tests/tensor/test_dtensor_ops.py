"""Global-view tensors give one process's answer for the operators a training user hits (issue #28).

One job (dtensor_ops_job.py) runs every case of op_cases.py, forward and
backward, on a 2 x 2 dp x tp Mesh, sharded over dp only and over dp and tp.
torch's DTensor has no sharding rule for some of them and ran their kernels
on each process's piece: a mean loss's backward divided by the piece's size
(the gradient was dp times too large), silently (mpimesh/tensor/_op_rules.py).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mpitest import python_cmd, run

pytestmark = pytest.mark.subprocess

JOB = Path(__file__).with_name("dtensor_ops_job.py")

#: Cases torch's DTensor refuses with an error at the line (loud, not wrong): what the error starts with.
REFUSED = {
    # nll_loss's mean over a batch that does not split evenly (7 rows over 2): DTensor's own guard
    "cross_entropy uneven | dp": "error ValueError: The intermediate results of nll_loss cannot be evenly sharded",
    "cross_entropy uneven | dp x tp": "error ValueError: The intermediate results of nll_loss cannot be evenly",
    # rms_norm decomposes before dispatch into a mean over the tp-sharded dimension (Partial) and an
    # in-place add_ of eps, which DTensor cannot apply to a partial tensor
    "rms_norm | dp x tp": "error RuntimeError: aten.add_.Scalar: in-place operations that require placement",
}


def test_every_op_matches_one_process() -> None:
    """Each case's forward result and gradients within 1e-5 of torch on the full tensors, or a known refusal."""
    result = run(python_cmd(str(JOB)), timeout=300)
    assert result.returncode == 0, result.stderr
    lines = dict(re.findall(r"^(.+? \| [^:]+): (.*)$", result.stdout, re.M))
    assert len(lines) >= 90, result.stdout + result.stderr
    wrong = {}
    for label, outcome in lines.items():
        if label in REFUSED and outcome.startswith(REFUSED[label]):
            continue  # a later torch that runs it must get it right: checked as any other case
        if outcome.startswith("error") or float(outcome.split()[0]) > 1e-5:
            wrong[label] = outcome
    assert not wrong, wrong
    assert result.stdout.rstrip().endswith("done")
    assert result.orphans == []
