"""Data-parallel training that survives a killed worker, and still gets the right answer.

Run it either way:

    mpimesh run -n 6 examples/train_survives.py    # 4 trainers + 1 spare from the launch pool (ULFM)
    python examples/train_survives.py               # trainers and spare spawned with MPI_Comm_spawn

Four trainers fit a tiny linear regression whose answer is known,
``y = x @ [2, -3, 0.5] + 1``.  Each holds a replica of the model (a
``torch.nn.Linear(3, 1)`` on CPU) and one shard of the synthetic data.  Each
step the controller asks every trainer for its gradient, averages them, and
has every replica apply the average; then it keeps the weights as the
checkpoint of that step.

At step 20 the example SIGKILLs trainer 2 itself (it says so).  The pending
gradient call to it fails with ``SupervisionError``; the fault hook set below
prints the failure instead of ending the job (the default would end it).
The controller spawns a replacement process with
``this_host().spawn_procs(...)``, gives it the lost shard, restores every
replica to the checkpoint of the last completed step, and repeats that step.
The other trainers keep their processes: calls to healthy slices of a mesh
keep working.  At the end it checks the weights against the known answer and
prints ``final weights ... OK``.
"""

from __future__ import annotations

import os
import signal
import sys

import torch

import mpimesh
from mpimesh import Actor, MeshFailure, SupervisionError, current_rank, endpoint, this_host

TRUE_W = [2.0, -3.0, 0.5]
TRUE_B = 1.0
TRAINERS = 4
STEPS = 80
KILL_AT = 20
VICTIM = 2
LR = 0.1


class Trainer(Actor):
    """One data-parallel replica: a linear model, an optimizer and a shard of the data."""

    def __init__(self, shard: int | None = None, rows: int = 256) -> None:
        torch.set_num_threads(1)
        self.shard = current_rank().rank if shard is None else shard
        gen = torch.Generator().manual_seed(1000 + self.shard)  # the same shard wherever it is rebuilt
        self.x = torch.randn(rows, 3, generator=gen)
        self.y = (self.x @ torch.tensor(TRUE_W) + TRUE_B).unsqueeze(1)
        self.model = torch.nn.Linear(3, 1)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=LR)

    @endpoint
    def grad(self) -> tuple[list[torch.Tensor], float]:
        """Gradient of the mean squared error on this shard, and the loss."""
        self.opt.zero_grad()
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        return [p.grad.detach().clone() for p in self.model.parameters()], loss.item()

    @endpoint
    def apply(self, grads: list[torch.Tensor]) -> None:
        """Take one optimizer step with the averaged gradient."""
        for p, g in zip(self.model.parameters(), grads, strict=True):
            p.grad = g.clone()
        self.opt.step()

    @endpoint
    def state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    @endpoint
    def load(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    @endpoint
    def pid(self) -> int:
        return os.getpid()

    @endpoint
    def crash(self) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


def log(line: str) -> None:
    """One whole line (the fault hook runs on another thread than the loop)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def on_failure(failure: MeshFailure) -> None:
    """The fault hook: report, and let the training loop recover (the default would end the job)."""
    log(f"supervision: {failure.report()}")


def gather(futures: list[mpimesh.Future]) -> tuple[list, dict[int, SupervisionError]]:
    """Every result, and the trainers whose process died (by shard)."""
    values: list = []
    dead: dict[int, SupervisionError] = {}
    for shard, fut in enumerate(futures):
        try:
            values.append(fut.get(60))
        except SupervisionError as exc:
            values.append(None)
            dead[shard] = exc
    return values, dead


def main() -> None:
    mpimesh.unhandled_fault_hook = on_failure
    procs = this_host().spawn_procs(per_host={"gpus": TRAINERS})
    trainers = procs.spawn("trainers", Trainer)
    # One view per replica: a failed one is replaced without touching the others.
    shards = [trainers.slice(gpus=i) for i in range(TRAINERS)]
    checkpoint = shards[0].state.call_one().get(60)
    for shard in shards[1:]:
        shard.load.call_one(checkpoint).get(60)  # every replica starts from the same weights
    killed = False
    replaced = 0
    step = 0
    loss = float("nan")
    while step < STEPS:
        if step == KILL_AT and not killed:
            pid = shards[VICTIM].pid.call_one().get(60)
            log(f"step {step}: killing trainer {VICTIM} (pid {pid}) with SIGKILL")
            shards[VICTIM].crash.broadcast()
            killed = True
        results, dead = gather([s.grad.call_one() for s in shards])
        if not dead:
            grads = [torch.stack(g).mean(0) for g in zip(*(r[0] for r in results), strict=True)]
            loss = sum(r[1] for r in results) / len(results)
            _, dead = gather([s.apply.call_one(grads) for s in shards])
        if dead:
            for shard, exc in dead.items():
                log(f"step {step}: trainer {shard} is gone: {exc}")
                spare = this_host().spawn_procs(per_host={"gpus": 1})
                shards[shard] = spare.spawn(f"trainer{shard}_replacement", Trainer, shard)
                replaced += 1
            # Some replicas may have applied this step: put them all back to the last checkpoint.
            gather([s.load.call_one(checkpoint) for s in shards])
            log(f"step {step}: replaced {len(dead)} trainer(s); restored the weights of step {step - 1}, "
                "repeating the step")
            continue
        checkpoint = shards[0].state.call_one().get(60)
        if step % 20 == 0:
            log(f"step {step}: loss {loss:.6f}")
        step += 1

    states, dead = gather([s.state.call_one() for s in shards])
    assert not dead, dead
    for other in states[1:]:  # the replicas agree
        for key in states[0]:
            assert torch.equal(states[0][key], other[key]), key
    w = states[0]["weight"].flatten().tolist()
    b = states[0]["bias"].item()
    ok = all(abs(a - e) < 1e-3 for a, e in zip(w + [b], TRUE_W + [TRUE_B], strict=True)) and loss < 1e-5
    shown = ", ".join(f"{v:.4f}" for v in w)
    log(f"final weights [{shown}] bias {b:.4f} (loss {loss:.2e}; trainers replaced: {replaced}) "
        f"{'OK' if ok else 'WRONG'}")
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
