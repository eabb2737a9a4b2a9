"""Communicators made from the group alone, beside the wire's polling, do not hang (issue #27 item 5).

After a death the tensor engine makes its communicators with
``MPI_Comm_create_from_group`` (``Communicators.get`` with a tag).  Open MPI 5
waits for ever in that call's activation in about a third of the tries when
another thread of the process polls ``MPI_COMM_WORLD`` meanwhile (a bare
mpi4py job hangs within 20 tries, on one host or two, with or without ULFM);
the elastic example across hosts hung there.  The engine now makes the call
with the wire's locks held (``_transport.mpi.alone``).  Here each worker runs
a poller of its own that takes the wire's receiving lock as the wire does,
and makes communicators in a loop: without the locks this hangs, and the
bounded ``get`` fails instead of the suite hanging.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from mpimesh import Actor, endpoint

pytestmark = pytest.mark.mesh

TRIES = 60


class Maker(Actor):
    """Makes communicators from the group while a thread polls the world as the wire does."""

    @endpoint
    def addr(self) -> tuple[int, int]:
        from mpimesh.context import context

        island, rank = context().actor_instance.proc.addresses[0]
        return (island, rank)

    @endpoint
    def make(self, members: list[tuple[int, int]], tries: int) -> int:
        from mpimesh._core.current import current
        from mpimesh._transport.mpi import MPI
        from mpimesh.context import context
        from mpimesh.tensor._collectives import Communicators

        router = current().router
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                with router.exclusive():
                    MPI.COMM_WORLD.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
                time.sleep(0.0002)

        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        comms = Communicators(context().actor_instance.proc.addresses[0])
        total = 0
        try:
            group = tuple((i, r) for i, r in members)
            for k in range(tries):
                comm = comms.get(group, (), tag=f"test_comm_from_group:{k}")
                total += comm.allreduce(1)
        finally:
            done.set()
            poller.join(5)
            comms.free()
        return total


@pytest.mark.timeout(180)
def test_communicators_from_the_group_beside_the_wire(procs: Any) -> None:
    """Every try gives a communicator over both workers (the bounded get fails where one hangs)."""
    makers = procs.spawn("comm_makers", Maker)
    addrs = [tuple(a) for a in makers.addr.call().get(60).values()]
    if len({island for island, _ in addrs}) > 1:
        pytest.skip("the mesh spans two MPI worlds here (pool and spawned ranks): ports join them, not this call")
    totals = makers.make.call(addrs, TRIES).get(120)
    assert list(totals.values()) == [TRIES * len(addrs)] * len(addrs)
