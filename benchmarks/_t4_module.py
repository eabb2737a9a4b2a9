"""T4's measured side with ``module_to_mesh``: the brief's training step on a ``dp=4`` Mesh, driven from the controller.

Run as ``mpiexec -n 5 python -m mpimesh _t4_module.py STEPS WARMUP`` (4 pool workers).  The step is a
PyTorch user's: ``model(x)``, the loss, ``loss.backward()`` (gradients all-reduced in buckets during the
backward pass, on the MPI backend), ``opt.step()``, ``loss.item()``.  Prints one JSON line: the median
step time.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from _t4_model import LR, data, model

import mpimesh
from mpimesh.distributed import Mesh


def main() -> None:
    steps, warmup = int(sys.argv[1]), int(sys.argv[2])
    mesh = Mesh(shape=(4,), mesh_dim_names=("dp",))
    net = mpimesh.module_to_mesh(model(), mesh)
    x, y = data(4)
    # the data sit on the workers, a shard each, as a data loader per rank leaves them (DDP's side too)
    xs = mpimesh.distribute(x, mesh, sharding_spec=["dp", None])
    ys = mpimesh.distribute(y, mesh, sharding_spec=["dp", None])
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(net(xs), ys)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    print(json.dumps({"module_step_ms": statistics.median(times) * 1e3}), flush=True)
    mesh.stop().get(60)


if __name__ == "__main__":
    main()
