"""Raw mpi4py baselines: the controller half and the worker half.

Inside an mpimesh job the worker half runs in an actor endpoint
(:class:`_actors.Bench`), on ``MPI.COMM_WORLD`` with tag ``_common.TAG``,
which mpimesh never uses.  The controller half runs on rank 0's main thread
while the endpoint call is pending.

Run standalone it is the same exchange in a pure mpi4py job, for scripts
whose mpimesh workers were spawned and so share no ``COMM_WORLD`` with the
controller: ``python benchmarks/_raw.py KIND ROUNDS --spawn K`` (a singleton
spawns K echo processes with ``MPI_Comm_spawn`` and talks to them over the
intercommunicator, the link mpimesh's spawned workers have) or
``mpiexec -n K+1 python benchmarks/_raw.py KIND ROUNDS`` (over ``COMM_WORLD``).

Messages are small pickled tuples, sent with lowercase ``send``/``recv``
(mpi4py's pickle path), as the peers' "mpi4py raw" figures were.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence

from _common import TAG

__all__ = ["echo", "fanout", "pipelined", "block"]


def echo(comm, rounds: int, tag: int = TAG) -> int:
    """Worker half: ``rounds`` times, receive a tuple from rank 0 and send it back."""
    for _ in range(rounds):
        msg = comm.recv(source=0, tag=tag)
        comm.send(msg, dest=0, tag=tag)
    return rounds


def fanout(comm, dests: Sequence[int], rounds: int, tag: int = TAG) -> tuple[list[int], float]:
    """Controller half of a ping-pong with every rank of ``dests`` per round.

    Returns:
        Per-round wall times in ns, and process CPU seconds for all rounds.
    """
    out: list[int] = []
    clock = time.perf_counter_ns
    cpu0 = time.process_time()
    for i in range(rounds):
        t0 = clock()
        for d in dests:
            comm.send((0, i), dest=d, tag=tag)
        for d in dests:
            comm.recv(source=d, tag=tag)
        out.append(clock() - t0)
    return out, time.process_time() - cpu0


def group_comm(world, ranks: Sequence[int]):
    """A communicator of ``ranks`` of ``world`` (collective over them: every one of them calls it)."""
    return world.Create_group(world.Get_group().Incl(list(ranks)), tag=TAG + 2)


def collective(comm, rounds: int, nbytes: int = 0) -> tuple[list[int], float]:
    """One side (any rank) of MPI's own trees on ``comm``, rank 0 the root, per round.

    ``nbytes`` 0: ``bcast`` of a small pickled tuple, then ``gather`` of one
    from each rank (a cast and its replies, done by MPI's collectives); else
    ``Bcast`` of an ``nbytes`` buffer.

    Returns:
        Per-round wall times in ns, and process CPU seconds for all rounds.
    """
    import numpy as np

    buf = np.zeros(nbytes, np.uint8) if nbytes else None
    if buf is not None:
        buf[:] = 1  # faulted in, as a tensor argument would be
    out: list[int] = []
    clock = time.perf_counter_ns
    comm.Barrier()
    cpu0 = time.process_time()
    for i in range(rounds):
        t0 = clock()
        if buf is None:
            comm.bcast((0, i), root=0)
            comm.gather(i, root=0)
        else:
            comm.Bcast(buf, root=0)
            comm.Barrier()  # done everywhere, as a call().get() is
        out.append(clock() - t0)
    return out, time.process_time() - cpu0


def pipelined(comm, dest: int, n: int, tag: int = TAG) -> float:
    """Controller half of B3's baseline: one sync round, then ``n`` ``isend``s, then ``n`` acks.

    The worker half is :func:`echo` with ``n + 1`` rounds.

    Returns:
        Seconds from the first ``isend`` to the last ack.
    """
    from mpi4py import MPI

    comm.send((0, -1), dest=dest, tag=tag)
    comm.recv(source=dest, tag=tag)
    t0 = time.perf_counter()
    reqs = [comm.isend((0, i), dest=dest, tag=tag) for i in range(n)]
    for _ in range(n):
        comm.recv(source=dest, tag=tag)
    MPI.Request.waitall(reqs)
    return time.perf_counter() - t0


def block(comm, tag: int = TAG + 1) -> int:
    """Worker half of B8's baseline: sit in a blocking ``recv`` until rank 0 sends."""
    comm.recv(source=0, tag=tag)
    return 0


def _main(argv: list[str]) -> int:
    from mpi4py import MPI

    kind, rounds = argv[0], int(argv[1])
    if kind == "echo":  # a spawned child: echo over the intercommunicator to its parent
        parent = MPI.Comm.Get_parent()
        echo(parent, rounds)
        parent.Disconnect()
        return 0
    if kind not in ("fanout", "pipelined"):
        raise SystemExit(f"expecting kind 'fanout' or 'pipelined', got {kind!r}")
    echoes = rounds + 1 if kind == "pipelined" else rounds
    if argv[2:3] == ["--spawn"]:
        k = int(argv[3])
        comm = MPI.COMM_SELF.Spawn(sys.executable, [__file__, "echo", str(echoes)], maxprocs=k)
        rank, dests = 0, list(range(k))
    else:
        comm = MPI.COMM_WORLD
        rank, dests = comm.Get_rank(), list(range(1, comm.Get_size()))
    if rank != 0:
        echo(comm, echoes)
        return 0
    if kind == "pipelined":
        out: dict[str, object] = {"kind": kind, "n": rounds, "seconds": pipelined(comm, dests[0], rounds)}
    else:
        times, cpu = fanout(comm, dests, rounds)
        out = {"kind": kind, "ns": times, "cpu_s": cpu}
    if comm != MPI.COMM_WORLD:
        comm.Disconnect()
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
