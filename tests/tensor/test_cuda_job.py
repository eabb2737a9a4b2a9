"""Every CUDA path in one job (cuda_job.py): skipped without a CUDA device, run on a lent GPU machine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from mpitest import python_cmd, run

pytestmark = [pytest.mark.subprocess,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

JOB = Path(__file__).with_name("cuda_job.py")
CHECKS = ("awareness", "arguments", "engine", "global", "training", "nccl")


def test_every_cuda_path() -> None:
    """CUDA-awareness, staged arguments and results, engine and global tensors, training, NCCL in spmd."""
    result = run(python_cmd(str(JOB)), timeout=300)
    print(result.stdout)  # every check's line, in the report of a failure (and with -rA)
    print(result.stderr[-8000:], file=sys.stderr)
    lines = result.stdout.splitlines()
    for name in CHECKS:
        assert any(line.startswith(f"{name} ok ") for line in lines), name
    assert result.returncode == 0, result.stderr
    assert lines[-1] == "done"
    assert result.orphans == []
