"""The launch pool's placement and its free ranks (``_roles.pool``, pure).

A free pool rank is read from its row (no mesh holds it, it has not died),
never kept in a second list; a mesh takes the free ranks of each host it
asks for, lowest first.  The runtime is a stand-in: the pool uses only its
host.
"""

from __future__ import annotations

from typing import Any

import pytest

from mpimesh._roles.pool import Pool
from mpimesh._roles.procs import Procs


class Runtime:
    """What the pool's table uses of the controller's runtime: its host."""

    host = "h0"


def make_pool(ranks: list[tuple[int, str]]) -> Pool:
    rt: Any = Runtime()
    return Pool(Procs(rt), rt.host, [((0, r), host, 100 + r) for r, host in ranks])


def test_take_hands_out_the_lowest_free_ranks_host_by_host() -> None:
    """Each host's row is its lowest free ranks; a short row says what is missing there."""
    pool = make_pool([(1, "h0"), (2, "h1"), (3, "h0"), (4, "h1"), (5, "h1")])
    assert pool.hosts == ["h0", "h1"] and pool.across_hosts
    rows, missing = pool.take(2, ["h1", "h0"])
    assert rows == [[(0, 2), (0, 4)], [(0, 1), (0, 3)]]
    assert missing == []
    rows, missing = pool.take(2, ["h0", "h1"])
    assert rows == [[], [(0, 5)]]
    assert missing == [("h0", 2), ("h1", 1)]
    assert pool.free_ranks() == []


def test_a_free_rank_is_neither_held_nor_dead() -> None:
    """Given back, a rank is free again, unless it died meanwhile; a dead rank is never handed out."""
    pool = make_pool([(1, "h0"), (2, "h0"), (3, "h0")])
    rows, _ = pool.take(2, ["h0"])
    assert rows == [[(0, 1), (0, 2)]] and pool.free_ranks("h0") == [(0, 3)]
    pool.procs[(0, 1)].dead = True
    pool.give_back(rows[0])
    assert pool.free_ranks() == [(0, 2), (0, 3)]
    assert not pool.is_free((0, 1))
    assert pool.take(3, ["h0"]) == ([[(0, 2), (0, 3)]], [("h0", 1)])
    assert pool.live_ranks() == [(0, 2), (0, 3)]


@pytest.mark.parametrize(
    ("ranks", "fix"),
    [
        ([(1, "h0")], ("launch with more ranks (e.g. `mpirun -n 5 python -m mpimesh ...`, or more srun tasks: "
                       "spawning is not possible under srun)")),
        ([(1, "h0"), (2, "h1")], ("launch with enough ranks on each host for the meshes (e.g. `mpirun --host "
                                  "h0:2,h1:4`, `srun --ntasks-per-node=...`)")),
    ],
    ids=["one host", "two hosts"],
)
def test_no_room_says_what_to_launch(ranks: list[tuple[int, str]], fix: str) -> None:
    """When the pool lacks ranks and spawning is not possible, the message gives the launch that would fit."""
    pool = make_pool(ranks)
    pool.take(1, [pool.hosts[-1]])
    message = pool.no_room([(pool.hosts[-1], 3)], "MPI_Comm_spawn failed (no)")
    assert message == (f"cannot start 3 worker processes (3 on {pool.hosts[-1]}): the launch pool has no free rank "
                       f"there and MPI_Comm_spawn failed (no); {fix}")


def test_spares_come_from_the_dead_process_host_first_then_any_other() -> None:
    """Every free rank is a spare: one of the wanted host first, then another host's (the controller's last)."""
    pool = make_pool([(1, "h0"), (2, "h1"), (3, "h1"), (4, "h2"), (5, "h0"), (6, "h2")])
    pool.take(1, ["h0", "h1", "h2"])  # a mesh holds 1, 2 and 4: the spares are 3 (h1), 5 (h0) and 6 (h2)
    assert pool.take_spares(["h1", "h2"]) == [(0, 3), (0, 6)]
    # h1 has no spare left: the other hosts' serve, the controller's host (h0) last
    assert pool.take_spares(["h1"]) == [(0, 5)]
    assert pool.take_spares(["h2"]) == [None]
    assert pool.free_ranks() == []


def test_a_lost_host_has_no_spare_and_no_life() -> None:
    """A host whose every process died serves no spare; the wanted process comes from a living host."""
    pool = make_pool([(1, "h0"), (2, "h1"), (3, "h1"), (4, "h0")])
    pool.take(1, ["h1"])
    for rank in (2, 3):
        pool.procs[(0, rank)].dead = True
    assert not pool.host_lives("h1") and pool.host_lives("h0")
    assert pool.take_spares(["h1"]) == [(0, 1)]
