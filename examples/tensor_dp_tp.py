"""Data and tensor parallelism together on a ``dp x tp`` mesh, driven from one script.

A two-layer MLP in Megatron's layout: the first layer's weight is split by
rows over ``tp`` (each process computes a slice of the hidden units), the
second's by columns (each computes a partial output, summed over ``tp`` with
an MPI_Allreduce); the batch is split over ``dp`` and gradients are averaged
over ``dp``.  The same model trained in this process on the whole batch
gives the same losses.

    mpirun -n 5 python -m mpimesh examples/tensor_dp_tp.py
    python examples/tensor_dp_tp.py                             # workers spawned
"""

from typing import Any

import torch

import mpimesh
from mpimesh import Replicate, Shard, this_host

STEPS, BATCH, HIDDEN, LR = 10, 32, 32, 0.1


class SumOverTP(torch.autograd.Function):
    """Forward: add the partial outputs over ``tp``; backward: each partial gets the output's gradient."""

    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor) -> torch.Tensor:
        return partial.reduce("tp", "sum")

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


torch.manual_seed(0)
w1, b1 = torch.randn(HIDDEN, 8) * 0.3, torch.zeros(HIDDEN)
w2, b2 = torch.randn(1, HIDDEN) * 0.3, torch.zeros(1)
x, y = torch.randn(BATCH, 8), torch.randn(BATCH, 1)

procs = this_host().spawn_procs(per_host={"dp": 2, "tp": 2})
# placements: one per mesh dimension (dp, tp)
params = [
    mpimesh.distribute(w1, procs, [Replicate(), Shard(0)]),  # rows of W1: hidden units over tp
    mpimesh.distribute(b1, procs, [Replicate(), Shard(0)]),
    mpimesh.distribute(w2, procs, [Replicate(), Shard(1)]),  # columns of W2: the same hidden units
    mpimesh.distribute(b2, procs, [Replicate(), Replicate()]),
]
for p in params:
    p.requires_grad_()
xs = mpimesh.distribute(x, procs, [Shard(0), Replicate()])
ys = mpimesh.distribute(y, procs, [Shard(0), Replicate()])
opt = torch.optim.SGD(params, lr=LR)

ref = [t.clone().requires_grad_() for t in (w1, b1, w2, b2)]
ref_opt = torch.optim.SGD(ref, lr=LR)

worst = 0.0
for step in range(STEPS):
    mw1, mb1, mw2, mb2 = params
    hidden = torch.relu(xs @ mw1.T + mb1)  # (batch/dp, hidden/tp)
    out = SumOverTP.apply(hidden @ mw2.T) + mb2
    loss = ((out - ys) ** 2).mean()
    loss.backward()
    for p in params:
        p.grad.reduce_("dp", "avg")
    opt.step()
    opt.zero_grad()
    mesh_loss = mpimesh.inspect(loss.detach().reduce("dp", "avg")).item()

    rw1, rb1, rw2, rb2 = ref
    ref_loss = (((torch.relu(x @ rw1.T + rb1) @ rw2.T + rb2) - y) ** 2).mean()
    ref_loss.backward()
    ref_opt.step()
    ref_opt.zero_grad()
    worst = max(worst, abs(mesh_loss - ref_loss.item()) / abs(ref_loss.item()))
    print(f"step {step}: loss {mesh_loss:.6f} (one process: {ref_loss.item():.6f})")

full_w1 = mpimesh.gather(params[0].detach(), [Replicate(), Shard(0)]).get()
print("W1 gathered from the tp shards equals one-process W1:", torch.allclose(full_w1, ref[0].detach(), atol=1e-6))
print(f"largest relative difference from one-process training: {worst:.1e}", "OK" if worst < 1e-5 else "FAILED")
procs.stop().get()
