"""DistributedDataParallel inside actors: a process mesh made a torch.distributed world (gloo, CPU).

Run it either way:

    mpirun -n 5 python -m mpimesh examples/ddp_in_actors.py     # 4 trainers from the launch pool
    python examples/ddp_in_actors.py                             # 4 trainers spawned with MPI_Comm_spawn

``setup_torch_elastic_env(procs)`` gives each of the 4 processes what
``torchrun`` would (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR``, ``MASTER_PORT``, ...), so the trainers' code is plain
PyTorch: ``init_process_group("gloo")``, ``DistributedDataParallel`` around a
small MLP, one shard of a synthetic regression per rank (fixed seeds).  The
controller drives the steps and prints the mean loss of each; at the end it
checks that every rank holds the same parameters (DDP averaged the
gradients) and that the loss went down, and prints ``OK``.
"""

from __future__ import annotations

import os

from mpimesh import Actor, endpoint, this_host
from mpimesh.spmd import setup_torch_elastic_env

WORLD = 4
STEPS = 30
BATCH = 64


class Trainer(Actor):
    """One DDP rank: a replica of the MLP and its own shard of the data."""

    @endpoint
    def setup(self) -> str:
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        torch.set_num_threads(1)  # 4 ranks share this host's cores: one thread each, no oversubscription
        dist.init_process_group("gloo")  # init_method="env://": the variables setup_torch_elastic_env set
        rank = dist.get_rank()
        torch.manual_seed(0)  # the same initial weights everywhere (DDP broadcasts rank 0's anyway)
        mlp = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        self.model = DistributedDataParallel(mlp)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        # this rank's shard: y = tanh(x . w / 4) + noise, with a w shared by all ranks
        w = torch.randn(8, generator=torch.Generator().manual_seed(1))
        data = torch.Generator().manual_seed(100 + rank)
        self.x = torch.randn(STEPS, BATCH, 8, generator=data)
        self.y = torch.tanh(self.x @ w / 4).unsqueeze(-1) + 0.01 * torch.randn(STEPS, BATCH, 1, generator=data)
        return f"rank {rank}/{dist.get_world_size()} (LOCAL_RANK {os.environ['LOCAL_RANK']}, pid {os.getpid()})"

    @endpoint
    def step(self, i: int) -> float:
        import torch

        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(self.x[i]), self.y[i])
        loss.backward()  # DDP all-reduces the gradients here
        self.opt.step()
        return float(loss.item())

    @endpoint
    def parameters(self) -> list[float]:
        return [v for p in self.model.module.parameters() for v in p.detach().flatten().tolist()]

    @endpoint
    def finish(self) -> None:
        import torch.distributed as dist

        # DDP holds the process group: drop it first, so the group is torn down
        # now, on every rank together, and not one by one as the processes exit
        del self.model, self.opt
        dist.destroy_process_group()


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": WORLD})
    setup_torch_elastic_env(procs)
    trainers = procs.spawn("trainers", Trainer)
    for line in trainers.setup.call().get(300).values():
        print(line)
    losses = []
    for i in range(STEPS):
        per_rank = trainers.step.call(i).get(120).values()
        losses.append(sum(per_rank) / len(per_rank))
        print(f"step {i:2d}: loss {losses[-1]:.4f}")
    params = list(trainers.parameters.call().get(120).values())
    same = all(p == params[0] for p in params)
    print(f"parameters identical on all {len(params)} ranks: {same}")
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    print(f"loss went down: {first:.4f} -> {last:.4f}")
    trainers.finish.call().get(60)
    procs.stop().get(60)
    if not (same and last < 0.2 * first):
        raise SystemExit("FAILED")
    print("OK")


if __name__ == "__main__":
    main()
