"""T5's baseline: the same DTensor program run SPMD, ``mpiexec -n 8`` with gloo, what users run today.

Prints one JSON line from rank 0 (see :func:`_t5_program.summary`), each loop timed on rank 0 from a
barrier: ``(dt @ dt.T).full_tensor()``; ``PIPELINED`` products then one ``full_tensor()``; and
``distribute_tensor`` of the local matrix plus the product.
"""

from __future__ import annotations

import json
import socket
import sys
import time

import torch.distributed as dist
from _t5_program import NAMES, SHAPE, local_tensor, summary
from mpi4py import MPI
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor


def main() -> None:
    reps, pipelined = int(sys.argv[1]), int(sys.argv[2])
    comm = MPI.COMM_WORLD
    rank, world = comm.Get_rank(), comm.Get_size()
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = comm.bcast(port, root=0)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", SHAPE, mesh_dim_names=NAMES)
    placements = [Shard(0), Replicate()]  # the brief's sharding_spec ["data_parallel", None]
    local = local_tensor()
    dt = distribute_tensor(local, mesh, placements)
    (dt @ dt.T).full_tensor()
    matmul, program = [], []
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        (dt @ dt.T).full_tensor()
        matmul.append(time.perf_counter() - t0)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(pipelined):
        last = dt @ dt.T
    last.full_tensor()
    per = (time.perf_counter() - t0) / pipelined
    for _ in range(reps):
        dist.barrier()
        t0 = time.perf_counter()
        d = distribute_tensor(local, mesh, placements)
        (d @ d.T).full_tensor()
        program.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps(summary(matmul, per, program)), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
