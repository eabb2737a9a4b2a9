"""module_to_mesh trains as one process does on the full batch (a section of shared_job.py; issue #28 item 5).

20 SGD steps (momentum 0.9, float64, a mean loss) on the shared 2 x 2 dp x tp Mesh with a plan, then
on a 2-process dp-only Mesh, each against the same model trained in this process.  SGD, unlike AdamW,
shows a gradient off by a constant factor.  Prints the largest loss and weight differences of each.
"""

import copy

import torch
from shared_job_train import loss_difference, train_sgd, weight_difference
from torch import nn

import mpimesh
from mpimesh.distributed import Mesh


def check(grid: Mesh) -> None:
    """Train on ``grid`` (2 x 2, dp x tp), then on a 2-process dp Mesh of its own."""
    torch.set_default_dtype(torch.float64)
    try:
        train(grid)
    finally:
        torch.set_default_dtype(torch.float32)  # the sections after this one build float32 models


def train(grid: Mesh) -> None:
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    batches = [(torch.randn(8, 8), torch.randn(8, 4)) for _ in range(20)]
    for label, plan in (("dp x tp", {"0": "colwise", "2": "rowwise"}), ("dp", None)):
        mesh = grid if plan is not None else Mesh(shape=(2,), mesh_dim_names=("dp",))
        models = [mpimesh.module_to_mesh(copy.deepcopy(reference), mesh, plan=plan), copy.deepcopy(reference)]
        losses = train_sgd(models, batches)
        print(f"{label}: loss difference {loss_difference(*losses):.2e} "
              f"weight difference {weight_difference(*models):.2e} last loss {losses[1][-1]:.4f}")
        if mesh is not grid:
            mesh.stop().get()
