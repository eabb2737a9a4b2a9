"""T4's model, data and optimizer, shared by the controller-driven run and the DDP baseline (no MPI here)."""

from __future__ import annotations

import torch

IN, HIDDEN, OUT = 256, 1024, 16
BATCH = 64  # per process
LR = 0.01


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
        torch.nn.Linear(HIDDEN, OUT),
    )


def data(world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch: ``world`` shards of BATCH rows."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(world * BATCH, IN, generator=g), torch.randn(world * BATCH, OUT, generator=g)
