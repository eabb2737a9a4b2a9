"""A cast's packed entries (``_core.entries``) and the runs its replies come back in (``relays.compact``).

The caller of a cast down a tree numbers its destinations with array
operations (:class:`Table`) and sends each subtree's entries as bytes; the
forwarders read and split them as a sequence (:class:`Entries`).  Replies of
plain values come back as runs of consecutive ranks, joined in each relay
and taken whole by the caller's :class:`Gather`; the rest stay items.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from mpimesh._core.entries import Entries, Table, pack
from mpimesh._core.multicast import _below
from mpimesh._core.ports import Gather, unpack
from mpimesh._core.protocol import Status
from mpimesh._core.relays import compact
from mpimesh._core.trees import split
from mpimesh.errors import SupervisionError
from mpimesh.future import Future
from mpimesh.shape import Shape

Entry = tuple[int, tuple[int, int], int]


def tree(n: int, island: int = 0, number: int = 1) -> list[Entry]:
    return [(r, (island, r + 1), number + r) for r in range(n)]


def test_entries_read_back_what_was_packed() -> None:
    plain = tree(5, island=3)
    packed = Entries(pack(plain))
    assert list(packed) == plain and len(packed) == 5
    assert packed[0] == plain[0] and packed[-1] == plain[-1] and packed.head == (3, 1)
    assert packed[1:4] == plain[1:4] and isinstance(packed[1:4], Entries)
    assert packed[::2] == plain[::2]
    assert pack(packed) is packed.packed  # already packed: passed through
    with pytest.raises(IndexError):
        packed[5]
    with pytest.raises(IndexError):
        _ = Entries(b"").head


def test_a_forwarder_splits_packed_entries_as_it_split_tuples() -> None:
    plain = tree(11)
    packed = Entries(pack(plain))
    assert [list(p) for p in split(packed[1:], 3)] == [list(p) for p in split(plain[1:], 3)]
    assert list(_below(packed, (0, 2), 2)) == list(_below(plain, (0, 2), 2))


def test_packed_entries_reject_a_torn_buffer() -> None:
    with pytest.raises(ValueError, match="multiple of 32 bytes, got 31"):
        Entries(b"x" * 31)


def test_a_table_numbers_each_destination_once_per_cast() -> None:
    addrs = [(0, 5), (0, 6), (1, 7), (1, 8)]
    last = np.zeros(16, dtype=np.int64)
    # consecutive slots (a slice) and scattered ones (an index array) number alike
    for slots in ([4, 5, 6, 7], [9, 2, 11, 3]):
        table = Table(range(4), addrs, slots, [slice(0, 1), [1, 3], slice(2, 3)])
        first = [list(Entries(part)) for part in table.number(last)]
        second = [list(Entries(part)) for part in table.number(last)]
        assert table.heads == [(0, 5), (0, 6), (1, 7)]
        assert first == [[(0, (0, 5), 1)], [(1, (0, 6), 1), (3, (1, 8), 1)], [(2, (1, 7), 1)]]
        assert [[e[2] for e in part] for part in second] == [[2], [2, 2], [2]]
        assert sorted(last[slots].tolist()) == [2, 2, 2, 2]
    # a direct frame to one destination in between moves only its number
    table = Table(range(4), addrs, [4, 5, 6, 7], [slice(0, 4)])
    last[5] += 1
    assert [e[2] for e in Entries(table.number(last)[0])] == [3, 4, 3, 3]


def test_packed_entries_pickle_as_bytes() -> None:
    packed = Entries(pack(tree(64)))
    frame = (1, None, "entries", packed.packed)
    assert len(pickle.dumps(frame, protocol=5)) < 64 * 32 + 64
    assert list(Entries(pickle.loads(pickle.dumps(frame, protocol=5))[3])) == tree(64)


VALUE, OK = Status.VALUE, Status.OK


def item(index: int, value: Any, status: int = VALUE, buffers: int = 0) -> tuple[Any, ...]:
    return (index, status, value, buffers, (0, index + 1))


def test_compact_joins_plain_values_of_consecutive_ranks() -> None:
    # a relay's own reply (rank 4), then its children's runs, out of order
    assert compact([item(4, "a"), (7, ["d", "e"]), (5, ["b", "c"])]) == [(4, ["a", "b", "c", "d", "e"])]
    # a gap keeps two runs
    assert compact([item(0, 0), item(2, 2)]) == [(0, [0]), (2, [2])]
    # one plain reply is a run of one
    assert compact([item(3, "x")]) == [(3, ["x"])]
    assert compact([]) == []


def test_compact_keeps_other_replies_in_order_with_their_buffers() -> None:
    items = [item(0, b"p0", OK, 1), item(1, 1), item(2, b"p2", OK, 2), (3, [3, 4])]
    out = compact(items)
    # rank 2's pickled reply sits between 1 and 3: two runs
    assert out == [item(0, b"p0", OK, 1), item(2, b"p2", OK, 2), (1, [1]), (3, [3, 4])]
    # the raw buffers follow the items that own them, in order
    pairs = unpack(out, ["b0", "b2a", "b2b"])
    assert [(it[0], bufs) for it, bufs in pairs if it[1] == OK] == [(0, ["b0"]), (2, ["b2a", "b2b"])]
    assert [(it[0], it[2]) for it, _ in pairs if it[1] == VALUE] == [(1, 1), (3, 3), (4, 4)]


def gather(n: int) -> tuple[Gather, Future[Any]]:
    fut: Future[Any] = Future("g")
    return Gather(fut, "m.f", Shape.row_major(("gpus",), (n,)), [(0, r + 1) for r in range(n)]), fut


def test_gather_takes_a_run_whole() -> None:
    g, fut = gather(6)
    assert not g.deliver_many((0, 1), [(0, [10, 11, 12])], [])
    assert g.pending == {(0, 4), (0, 5), (0, 6)} and g.owes()
    assert g.deliver_many((0, 4), [(3, [13, 14, 15])], [])
    assert list(fut.get(0).values()) == [10, 11, 12, 13, 14, 15]
    assert g.pending == set() and not g.owes()


def test_gather_takes_a_run_that_overlaps_a_resend_once() -> None:
    g, fut = gather(4)
    g.deliver(1, VALUE, "direct", [], (0, 2))  # answered straight back after a resend
    assert g.deliver_many((0, 1), [(0, ["a", "b", "c", "d"])], [])
    assert list(fut.get(0).values()) == ["a", "direct", "c", "d"]


def test_gather_mixes_runs_items_and_failures() -> None:
    g, fut = gather(4)
    g.fail((0, 4), "process 4 died")
    assert g.pending == {(0, 1), (0, 2), (0, 3)}
    g.deliver_many((0, 1), [item(2, "actor 2 stopped", Status.FAILED), (0, [0, 1])], [])
    assert not g.owes()
    # the lowest failing rank's error (Monarch's rule)
    with pytest.raises(SupervisionError, match="actor 2 stopped"):
        fut.get(0)
