"""Debugging actors from the controller's terminal: breakpoints on two ranks, then a post-mortem.

    mpimesh run -n 3 examples/debugging.py
    python examples/debugging.py

Both ranks pause at ``breakpoint()`` and the ``mpimesh_dbg>`` prompt opens.
Try ``list``, ``cast trainers ranks(0:2) p loss``, ``attach trainers 1``
(then ``n``, ``p loss``, ``detach``), and ``continue``.  Then a call fails and
``mpimesh.debug.pm`` opens pdb in the failed frame: ``p batch``, ``c``.  With
no terminal (``</dev/null``) the ranks go on, with a notice.
"""

import mpimesh
from mpimesh import Actor, current_rank, endpoint, this_host


class Trainer(Actor):
    @endpoint
    def step(self, lr: float) -> float:
        rank = current_rank().rank
        loss = 1.0 / (rank + 2)
        breakpoint()  # pauses this actor only; the prompt opens on the controller
        loss -= lr * loss
        return loss

    @endpoint
    def load(self, batch: list[int]) -> int:
        return sum(batch) // (len(batch) - 3)  # fails for a batch of three


def main() -> None:
    trainers = this_host().spawn_procs(per_host={"gpus": 2}).spawn("trainers", Trainer)
    losses = trainers.step.call(0.1).get(timeout=3600)
    print(f"losses {[round(loss, 3) for loss in losses.values()]}")
    try:
        trainers.slice(gpus=1).load.call_one([1, 2, 3]).get(timeout=60)
    except mpimesh.ActorError as error:
        print(f"caught: {error.message}")
        mpimesh.debug.pm(error, timeout=3600)
    print("done")


if __name__ == "__main__":
    main()
