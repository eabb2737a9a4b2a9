"""T5's program, shared by both sides: the brief's 1024 x 1024 matrix and how its timings are summarized."""

from __future__ import annotations

import statistics

import torch

N = 1024
SHAPE = (4, 2)
NAMES = ("data_parallel", "model_parallel")
SPEC = ["data_parallel", None]  # the brief's sharding_spec: rows over data_parallel


def local_tensor() -> torch.Tensor:
    """The brief's ``torch.randn(1024, 1024)``, the same on every process (seeded)."""
    return torch.randn(N, N, generator=torch.Generator().manual_seed(0))


def summary(matmul: list[float], pipelined: float, program: list[float]) -> dict[str, float]:
    """Medians in ms of the timed loops."""
    return {"matmul_ms": statistics.median(matmul) * 1e3, "pipelined_ms": pipelined * 1e3,
            "program_ms": statistics.median(program) * 1e3}
