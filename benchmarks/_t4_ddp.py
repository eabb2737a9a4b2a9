"""T4's baseline: the same data-parallel step under torch DDP (gloo), launched SPMD by ``mpiexec -n 4``.

Prints one JSON line from rank 0: the median step time (ms) over the timed steps.
"""

from __future__ import annotations

import json
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
from _t4_model import BATCH, LR, data, model
from mpi4py import MPI


def main() -> None:
    steps, warmup = int(sys.argv[1]), int(sys.argv[2])
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    net = torch.nn.parallel.DistributedDataParallel(model())
    x, y = data(world)
    xs, ys = x[rank * BATCH:(rank + 1) * BATCH], y[rank * BATCH:(rank + 1) * BATCH]
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    times = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        loss = torch.nn.functional.mse_loss(net(xs), ys)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"ddp_step_ms": statistics.median(times) * 1e3}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
