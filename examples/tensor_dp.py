"""Data-parallel training driven from one script: an MLP on a ``dp`` mesh, checked against one process.

The model's parameters are replicated on every process, the batch is
sharded over ``dp``; ``loss.backward()`` runs on every process, gradients are
averaged with ``reduce_("dp", "avg")`` (MPI_Allreduce) and a stock
``torch.optim.SGD`` steps.  The same model trained in this process on the
whole batch gives the same losses.

    mpirun -n 5 python -m mpimesh examples/tensor_dp.py
    python examples/tensor_dp.py                                # workers spawned
"""

import copy

import torch

import mpimesh
from mpimesh import Replicate, Shard, this_host

STEPS, BATCH, LR = 20, 64, 0.05


def to_mesh(module: torch.nn.Module, procs: mpimesh.ProcMesh) -> torch.nn.Module:
    """Replace every parameter by a copy replicated on each process of ``procs``."""
    for mod in module.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(mpimesh.distribute(p.detach(), procs, [Replicate()])))
    return module


torch.manual_seed(0)
reference = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1))
x, y = torch.randn(BATCH, 16), torch.randn(BATCH, 1)

procs = this_host().spawn_procs(per_host={"dp": 4})
model = to_mesh(copy.deepcopy(reference), procs)
xs, ys = mpimesh.distribute(x, procs, [Shard(0)]), mpimesh.distribute(y, procs, [Shard(0)])
opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
ref_opt = torch.optim.SGD(reference.parameters(), lr=LR, momentum=0.9)

worst = 0.0
for step in range(STEPS):
    loss = torch.nn.functional.mse_loss(model(xs), ys)  # each process: the loss of its shard
    loss.backward()
    mpimesh.reduce_([p.grad for p in model.parameters()], "dp", "avg")  # one Allreduce, as DDP's buckets
    opt.step()
    opt.zero_grad()
    mesh_loss = mpimesh.inspect(loss.detach().reduce("dp", "avg")).item()  # the full batch's loss

    ref_loss = torch.nn.functional.mse_loss(reference(x), y)
    ref_loss.backward()
    ref_opt.step()
    ref_opt.zero_grad()
    worst = max(worst, abs(mesh_loss - ref_loss.item()) / abs(ref_loss.item()))
    if step % 5 == 0 or step == STEPS - 1:
        print(f"step {step:2d}: loss {mesh_loss:.6f} (one process: {ref_loss.item():.6f})")

print(f"largest relative difference from one-process training: {worst:.1e}", "OK" if worst < 1e-5 else "FAILED")
procs.stop().get()
