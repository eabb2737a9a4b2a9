"""T4's measured side: the data-parallel step driven from the controller on a ``dp=4`` mesh.

Run as ``mpiexec -n 5 python -m mpimesh _t4_mesh.py STEPS WARMUP`` (4 pool workers).  Prints one JSON
line: the median step time with a value fetched every step (the loss, as a training loop that prints
it does), and the mean step time of a run that fetches only at the end (pipelined).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch
from _t4_model import LR, data, model

import mpimesh
from mpimesh import Replicate, Shard, this_host


def main() -> None:
    steps, warmup = int(sys.argv[1]), int(sys.argv[2])
    procs = this_host().spawn_procs(per_host={"dp": 4})
    net = model()
    for mod in net.modules():
        for name, p in list(mod.named_parameters(recurse=False)):
            setattr(mod, name, torch.nn.Parameter(mpimesh.distribute(p.detach(), procs, [Replicate()])))
    x, y = data(4)
    xs, ys = mpimesh.distribute(x, procs, [Shard(0)]), mpimesh.distribute(y, procs, [Shard(0)])
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)

    def step() -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(net(xs), ys)
        loss.backward()
        mpimesh.reduce_([p.grad for p in net.parameters()], "dp", "avg")  # one Allreduce for all
        opt.step()
        opt.zero_grad()
        return loss.detach()

    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        mpimesh.inspect(step())
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(steps):
        last = step()
    mpimesh.inspect(last)
    pipelined = (time.perf_counter() - t0) / steps
    print(json.dumps({"mesh_step_ms": statistics.median(times) * 1e3, "mesh_pipelined_step_ms": pipelined * 1e3}),
          flush=True)
    procs.stop().get(60)


if __name__ == "__main__":
    main()
