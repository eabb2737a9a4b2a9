"""A GRPO-style pipeline wired with ``send``, ports and a concurrent endpoint: the policy learns a bandit.

Run it either way:

    mpirun -n 4 python -m mpimesh examples/grpo_pipeline.py   # learner, buffer and 2 generators from the pool
    python examples/grpo_pipeline.py                           # the same, spawned with MPI_Comm_spawn

The shape of Monarch's asynchronous RL demos, small enough to check its answer:

* the **learner** owns a linear policy over ``PROMPTS`` prompts and ``ARMS``
  answers, exposed once as an ``RDMABuffer``;
* each **generator** pulls the latest weights with ``read_into`` (one-sided),
  samples a group of answers per prompt, scores them with a verifiable reward
  (right answer: 1) and pushes the groups to the buffer with ``send()``, which
  returns at once: nobody waits for the buffer's reply;
* the **replay buffer** is an async actor whose ``sample`` is a
  ``@concurrent_endpoint``: a learner's request waits there, as a task, until
  enough groups have arrived, while ``put`` calls keep coming in;
* the learner turns each group's rewards into advantages (reward minus the
  group's mean: GRPO's baseline) and takes a policy-gradient step;
* an ``Accumulator`` folds the generators' counters into one total.

It prints the greedy policy's accuracy, which must reach 1.0.
"""

import asyncio

import torch

from mpimesh import Accumulator, Actor, RDMABuffer, concurrent_endpoint, endpoint, send, this_host

PROMPTS = 8
ARMS = 4
GROUP = 8
STEPS = 30


def right_answer(prompt: int) -> int:
    """The verifiable reward's key: each prompt has one right answer."""
    return (3 * prompt + 1) % ARMS


class Learner(Actor):
    """Owns the policy; anyone holding its buffer's handle can read the weights."""

    def __init__(self, buffer: "ReplayBuffer") -> None:
        torch.manual_seed(0)
        self.weights = torch.zeros(PROMPTS * ARMS)
        self.handle = RDMABuffer(self.weights)
        self.buffer = buffer
        self.version = 0

    @endpoint
    def weights_handle(self) -> RDMABuffer:
        return self.handle

    @endpoint
    def train_step(self, groups_wanted: int) -> float:
        """Take one step on ``groups_wanted`` groups from the buffer; returns their mean reward."""
        groups = self.buffer.sample.call_one(groups_wanted).get(120)
        logits = self.weights.view(PROMPTS, ARMS).clone().requires_grad_(True)
        loss = torch.zeros(())
        rewards = []
        for prompt, answers, reward in groups:
            advantage = reward - reward.mean()  # GRPO: the group is its own baseline
            logp = torch.log_softmax(logits[prompt], dim=-1)[answers]
            loss = loss - (advantage * logp).sum() / len(groups)
            rewards.append(reward.mean())
        loss.backward()
        with torch.no_grad():
            self.weights -= 2.0 * logits.grad.view(-1)  # in place: the published weights change
        self.version += 1
        return float(torch.stack(rewards).mean())

    @endpoint
    def accuracy(self) -> float:
        greedy = self.weights.view(PROMPTS, ARMS).argmax(dim=-1)
        return float(sum(int(greedy[p]) == right_answer(p) for p in range(PROMPTS)) / PROMPTS)


class ReplayBuffer(Actor):
    """Groups in, batches out: ``sample`` waits (as a task) until there are enough."""

    def __init__(self) -> None:
        self.groups: list[tuple[int, torch.Tensor, torch.Tensor]] = []
        self.arrived = asyncio.Condition()

    @endpoint
    async def put(self, group: tuple[int, torch.Tensor, torch.Tensor]) -> None:
        async with self.arrived:
            self.groups.append(group)
            self.arrived.notify_all()

    @concurrent_endpoint
    async def sample(self, n: int) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
        async with self.arrived:
            await self.arrived.wait_for(lambda: len(self.groups) >= n)
            batch, self.groups = self.groups[:n], self.groups[n:]
        return batch


class Generator(Actor):
    """Samples groups of answers with the latest weights and pushes them to the buffer."""

    def __init__(self, weights: RDMABuffer, buffer: ReplayBuffer, seed: int) -> None:
        self.source = weights
        self.buffer = buffer
        self.weights = torch.zeros(PROMPTS * ARMS)
        self.rng = torch.Generator().manual_seed(seed)
        self.rollouts = 0

    @endpoint
    def generate(self, prompts: list[int]) -> None:
        self.source.read_into(self.weights).get(60)  # the learner's latest step, one-sided
        probs = torch.softmax(self.weights.view(PROMPTS, ARMS), dim=-1)
        for prompt in prompts:
            answers = torch.multinomial(probs[prompt], GROUP, replacement=True, generator=self.rng)
            reward = (answers == right_answer(prompt)).float()
            send(self.buffer.put, ((prompt, answers, reward),))  # fire and forget
            self.rollouts += GROUP

    @endpoint
    def rollouts_done(self) -> int:
        return self.rollouts


def main() -> None:
    procs = this_host().spawn_procs(per_host={"gpus": 3})
    home = procs.slice(gpus=0)
    buffer = home.spawn("buffer", ReplayBuffer)
    learner = home.spawn("learner", Learner, buffer)
    handle = learner.weights_handle.call_one().get(60)
    generators = [procs.slice(gpus=g).spawn(f"generator{g}", Generator, handle, buffer, g) for g in (1, 2)]
    half = PROMPTS // 2
    for step in range(STEPS):
        # each generator takes half of the prompts; the learner waits in the buffer for all of them
        for g, generator in enumerate(generators):
            generator.generate.broadcast(list(range(g * half, (g + 1) * half)))
        reward = learner.train_step.call_one(PROMPTS).get(120)
        if step % 10 == 0 or step == STEPS - 1:
            print(f"step {step:2d}: mean reward {reward:.2f}", flush=True)
    total = sum(Accumulator(g.rollouts_done, 0, lambda a, b: a + b).accumulate().get(60) for g in generators)
    accuracy = learner.accuracy.call_one().get(60)
    assert total == STEPS * PROMPTS * GROUP, total
    print(f"rollouts {total}; greedy accuracy {accuracy:.2f} {'OK' if accuracy == 1.0 else 'WRONG'}", flush=True)
    procs.stop().get(60)


if __name__ == "__main__":
    main()
