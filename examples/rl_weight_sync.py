"""RL weight sync: a trainer keeps its weights in an RDMABuffer; generators pull them every step.

Run it either way:

    mpirun -n 4 python -m mpimesh examples/rl_weight_sync.py   # trainer and 2 generators from the launch pool
    python examples/rl_weight_sync.py                           # the same, spawned with MPI_Comm_spawn

The pattern of Monarch's RL demos: the trainer's parameters are views into
one flat tensor, exposed once as an ``RDMABuffer``.  The generators get the
handle (a small picklable value) when they are created.  Every step, each
generator pulls the latest weights with ``read_into`` (one-sided: the trainer
does nothing for it) and returns a batch of rollouts; the rollouts travel to
the trainer as endpoint arguments, out of band; the trainer updates its
parameters in place, which is all it takes to publish them.
"""

import torch

from mpimesh import Actor, RDMABuffer, context, endpoint, this_host

DIM = 256
BATCH = 512
STEPS = 5


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    """Move every parameter of ``model`` into one flat tensor, of which they become views."""
    params = list(model.parameters())
    flat = torch.zeros(1 + sum(p.numel() for p in params))  # slot 0: the weights' version
    offset = 1
    for p in params:
        n = p.numel()
        flat[offset:offset + n].copy_(p.data.view(-1))
        p.data = flat[offset:offset + n].view_as(p)
        offset += n
    return flat


class Trainer(Actor):
    """Owns the policy; its weights are readable by anyone holding the handle."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.policy = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.Tanh(), torch.nn.Linear(DIM, DIM))
        self.flat = flat_parameters(self.policy)
        self.weights = RDMABuffer(self.flat.view(torch.uint8))
        self.optimizer = torch.optim.SGD(self.policy.parameters(), lr=0.01)

    @endpoint
    def weights_handle(self) -> RDMABuffer:
        return self.weights

    @endpoint
    def train_step(self, rollouts: list[dict[str, torch.Tensor]]) -> int:
        states = torch.cat([r["states"] for r in rollouts])
        targets = torch.cat([r["actions"] for r in rollouts]).roll(1, dims=1)
        loss = torch.nn.functional.mse_loss(self.policy(states), targets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()  # in place: the RDMABuffer now exposes the new weights
        self.flat[0] += 1
        return int(self.flat[0])

    @endpoint
    def checksum(self) -> float:
        return float(self.flat.double().sum())


class Generator(Actor):
    """Acts with a copy of the policy that it refreshes from the trainer before each rollout."""

    def __init__(self, weights: RDMABuffer) -> None:
        self.weights = weights
        self.policy = torch.nn.Sequential(torch.nn.Linear(DIM, DIM), torch.nn.Tanh(), torch.nn.Linear(DIM, DIM))
        self.flat = flat_parameters(self.policy)
        self.seed = context().actor_instance.rank.rank

    @endpoint
    def rollout(self, step: int) -> dict[str, torch.Tensor]:
        self.weights.read_into(self.flat.view(torch.uint8)).get()
        torch.manual_seed(1000 * step + self.seed)
        states = torch.randn(BATCH, DIM)
        with torch.no_grad():
            actions = self.policy(states)
        return {"states": states, "actions": actions, "version": self.flat[:1].clone()}

    @endpoint
    def checksum(self) -> float:
        return float(self.flat.double().sum())


def main() -> None:
    trainer_procs = this_host().spawn_procs(per_host={"gpus": 1})
    generator_procs = this_host().spawn_procs(per_host={"gpus": 2})
    trainer = trainer_procs.spawn("trainer", Trainer)
    handle = trainer.weights_handle.call_one().get()
    print(f"trainer exposes {handle.size()} bytes of weights as {handle}")
    generators = generator_procs.spawn("generators", Generator, handle)

    for step in range(STEPS):
        rollouts = generators.rollout.call(step).get().values()
        seen = sorted({int(r["version"]) for r in rollouts})
        version = trainer.train_step.call_one(rollouts).get()
        print(f"step {step}: generators acted with weights version {seen}, trainer published version {version}")

    generators.rollout.call(STEPS).get()  # one last pull of the final weights
    same = generators.checksum.call().get().values() == [trainer.checksum.call_one().get()] * 2
    print(f"generators hold the trainer's final weights: {same}")
    generator_procs.stop().get()
    trainer_procs.stop().get()
    print("done")


if __name__ == "__main__":
    main()
