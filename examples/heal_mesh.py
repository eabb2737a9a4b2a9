"""The brief's loop: catch the node failure, heal the mesh, run the batch again.

Run it either way:

    mpimesh run -n 6 examples/heal_mesh.py    # 4 workers + 1 spare from the launch pool (ULFM)
    python examples/heal_mesh.py               # workers, and the replacement, spawned with MPI_Comm_spawn
    python examples/heal_mesh.py --shrink      # elastic: go on with the 3 survivors instead

Four workers each hold a running total of the batches they were given.  At
batch 3 the example SIGKILLs worker 2 itself (it says so).  The pending call
fails with ``DeviceMeshError`` (the same class as ``SupervisionError``);
``heal_mesh(procs)`` gives the same 4-process mesh back, with a spare (or a
new process) in place of the dead one and a new ``Worker`` on it, made with
the mesh's original constructor arguments.  The healthy workers keep their
state; the replacement gets its total from a survivor, and the batch runs
again.  At the end every worker's total must be the same, and the example
prints ``totals [...] OK``.

With ``--shrink`` the loop goes on with fewer workers instead (elastic):
``procs.shrink()`` gives a new mesh of the 3 survivors (``gpus=3``,
renumbered), ``workers`` follows it with the same actors and their state,
and the batch runs again on them.
"""

from __future__ import annotations

import os
import signal
import sys

import mpimesh
from mpimesh import Actor, MeshFailure, current_rank, endpoint, heal_mesh, this_host
from mpimesh.exceptions import DeviceMeshError

WORKERS = 4
BATCHES = 6
KILL_AT = 3
VICTIM = 2


class Worker(Actor):
    """Keeps a running total of every batch it was given, scaled by ``scale``."""

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self.total = 0.0
        self.rank = current_rank().rank

    @endpoint
    def compute(self, batch: list[float]) -> float:
        self.total += self.scale * sum(batch)
        return self.total

    @endpoint
    def restore(self, total: float) -> None:
        self.total = total

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
    """The fault hook: report, and let the loop heal (the default would end the job)."""
    log(f"supervision: {failure.report()}")


def perform_heavy_computation(workers: Worker, batch: list[float]) -> list[float]:
    return list(workers.compute.call(batch).get(60).values())  # type: ignore[attr-defined]


def main() -> None:
    shrink = "--shrink" in sys.argv[1:]
    mpimesh.unhandled_fault_hook = on_failure
    procs = this_host().spawn_procs(per_host={"gpus": WORKERS})
    workers = procs.spawn("workers", Worker, 0.5)
    before = list(procs.addresses)
    done: list[float] = []
    for i in range(BATCHES):
        batch = [float(i), float(i + 1)]
        if i == KILL_AT:
            pid = workers.slice(gpus=VICTIM).pid.call_one().get(60)  # type: ignore[attr-defined]
            log(f"batch {i}: killing worker {VICTIM} (pid {pid}) with SIGKILL")
            workers.slice(gpus=VICTIM).crash.broadcast()  # type: ignore[attr-defined]
        try:
            result = perform_heavy_computation(workers, batch)
        except DeviceMeshError as e:
            log(f"Node failure detected at step {i}: {e}")
            if shrink:
                procs = procs.shrink()  # workers now addresses the survivors, renumbered
                log(f"shrunk: {procs!r}, {workers!r}")
            else:
                procs = heal_mesh(procs)
                replaced = [r for r, (a, b) in enumerate(zip(before, procs.addresses, strict=True)) if a != b]
                log(f"healed: {procs!r}, rank(s) {replaced} replaced")
            # The survivors applied this batch or not: all go back to the last total, then run it again.
            total = done[-1] if done else 0.0
            workers.restore.call(total).get(60)  # type: ignore[attr-defined]
            result = perform_heavy_computation(workers, batch)
        done.append(result[0])
        log(f"batch {i}: totals {result}")
    ok = len(set(result)) == 1 and result[0] == 0.5 * sum(2 * i + 1 for i in range(BATCHES))
    log(f"totals {result} {'OK' if ok else 'WRONG'}")
    procs.stop().get(60)
    if not ok:
        sys.exit(1)


if __name__ == "__main__":
    main()
