"""module_to_mesh's gradient buckets (issue #28 item 4): how parameters are bucketed, and training with many buckets."""

from __future__ import annotations

import re

import pytest
import torch
from shared_job_run import TIMEOUT, section

from mpimesh.tensor._buckets import GradBuckets


def test_buckets_follow_the_backward_order_cap_and_dtype() -> None:
    """Reverse registration order, a new bucket past the cap (a parameter larger than it alone), one dtype each."""
    params = [torch.zeros(n, dtype=dtype) for n, dtype in
              ((10, torch.float32), (300, torch.float32), (20, torch.float64), (50, torch.float32),
               (60, torch.float32), (5, torch.float64))]
    ids = {id(p): i for i, p in enumerate(params)}
    buckets = GradBuckets(params, [0], cap_bytes=440)  # 110 float32s
    assert [[ids[i] for i in b] for b in buckets.buckets] == [[5, 2], [4, 3], [1], [0]]
    one_each = GradBuckets(params, [0], cap_bytes=0)
    assert [[ids[i] for i in b] for b in one_each.buckets] == [[5], [4], [3], [2], [1], [0]]
    assert len(GradBuckets(params, [0], cap_bytes=25 << 20).buckets) == 2  # one per dtype


@pytest.mark.subprocess
@pytest.mark.timeout(TIMEOUT + 60)  # the first test of the three runs the shared job
def test_many_buckets_match_one_bucket() -> None:
    """dp x tp on the MPI backend: 5 SGD steps with four buckets give what one bucket gives (within 1e-6)."""
    out = section("module_buckets_job")
    assert "backend ['mpimesh']" in out, out
    assert "buckets many [[3, 1, 1, 1]]" in out and "buckets one [[6]]" in out, out
    found = re.search(r"buckets: loss difference (\S+) weight difference (\S+)", out)
    assert found is not None, out
    assert float(found[1]) < 1e-6 and float(found[2]) < 1e-6, out
