"""module_to_mesh on a 2 x 2 Mesh with gradient buckets of a few parameters each (a section of shared_job.py).

Trains the same model three ways, 5 SGD steps: on the mesh with 1 KiB buckets, on the mesh with one
bucket, and in this process.  Prints the buckets, the workers' backend, and the largest differences.
"""

import copy

import torch
import torch.distributed as dist
from shared_job_train import loss_difference, train_sgd, weight_difference
from torch import nn

import mpimesh
from mpimesh import Actor, endpoint
from mpimesh.distributed import Mesh


class Probe(Actor):
    @endpoint
    def backend(self) -> str:
        return dist.get_backend()


def check(mesh: Mesh) -> None:
    """Train on ``mesh`` (2 x 2, dp x tp)."""
    torch.manual_seed(0)
    reference = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4))
    batches = [(torch.randn(8, 8), torch.randn(8, 4)) for _ in range(5)]
    plan = {"0": "colwise", "2": "rowwise"}
    # 1 KiB buckets: the 32x32 weight (4 KiB) alone, the small parameters up to three to a bucket
    many = mpimesh.module_to_mesh(copy.deepcopy(reference), mesh, plan=plan, bucket_cap_mb=1 / 1024)
    one = mpimesh.module_to_mesh(copy.deepcopy(reference), mesh, plan=plan)
    for name, model in (("many", many), ("one", one)):
        owners = {id(h.__self__): h.__self__ for p in model.parameters()
                  for h in p._post_accumulate_grad_hooks.values()}
        print("buckets", name, [[len(b) for b in o.buckets] for o in owners.values()])
    print("backend", sorted(set(mesh.spawn("probe", Probe).backend.call().get(120).values())))
    many_losses, one_losses, reference_losses = train_sgd([many, one, reference], batches)
    print(f"buckets: loss difference {loss_difference(many_losses, one_losses):.2e} "
          f"weight difference {weight_difference(many, one):.2e}")
    print(f"one process: loss difference {loss_difference(many_losses, reference_losses):.2e} "
          f"weight difference {weight_difference(many, reference):.2e}")
