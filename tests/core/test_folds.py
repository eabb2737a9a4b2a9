"""Folds in the tree (``_core.folds``): partials in relays, and the caller's choice of pieces.

These run without MPI: a :class:`Partial` is what a relay builds from its
subtree's items, a :class:`Folded` what the caller builds from partials and
single replies.  The runtime's side (relays folding in real jobs, a relay's
death) is in ``test_multicast.py``.
"""

from __future__ import annotations

import operator
import pickle
from typing import Any

import pytest

from mpimesh import ActorError, SupervisionError
from mpimesh._core import serialize
from mpimesh._core.folds import PARTIAL, Fold, Folded, Partial
from mpimesh._core.protocol import Status
from mpimesh.future import Future
from mpimesh.shape import Shape

ADDRS = [(0, r + 1) for r in range(6)]
SHAPE = Shape.row_major(("gpus",), (6,))


def reply(index: int, value: Any) -> tuple[tuple[Any, ...], list[Any]]:
    """One actor's reply as a relay sees it: plain data rides in the frame."""
    return (index, Status.VALUE, value, 0, ADDRS[index]), []


def error(index: int, exc: Exception) -> tuple[tuple[Any, ...], list[Any]]:
    payload = serialize.error_payload(exc, f"### actor at rank {index}", index, {}, "h")
    body, buffers = serialize.dumps(payload)
    return (index, Status.ERROR, body, len(buffers), ADDRS[index]), list(buffers)


def partial(fold: Fold, *items: tuple[tuple[Any, ...], list[Any]], at: int = 0) -> tuple[Any, list[Any]]:
    """A relay's partial over ``items``, as it is sent (through pickle, as over MPI)."""
    p = Partial(fold, "m.value", "h")
    for item, buffers in items:
        p.add(item, buffers)
    item, buffers = p.item(ADDRS[at])
    return pickle.loads(pickle.dumps(item)), [bytes(memoryview(b)) for b in buffers]


def folded(fold: Fold) -> tuple[Folded, Future[Any]]:
    fut: Future[Any] = Future("m.value.reduce()")
    return Folded(fut, "m.value", SHAPE, ADDRS, fold), fut


SUM = Fold(None, None, operator.add, "m.value.reduce()")


def test_a_relay_sends_one_partial_of_its_subtree() -> None:
    inner = partial(SUM, reply(4, 40), reply(5, 50), at=4)
    item, buffers = partial(SUM, reply(3, 30), inner, at=3)
    assert item[1] == PARTIAL
    covered, _, value, errors = item[2]
    assert (sorted(covered), value, errors) == ([3, 4, 5], 120, [])


def test_the_caller_folds_partials_and_single_replies() -> None:
    receiver, fut = folded(SUM)
    left = partial(SUM, reply(0, 1), reply(1, 2), reply(2, 3))
    right = partial(SUM, reply(3, 4), reply(4, 5))
    assert not receiver.deliver_many(ADDRS[0], [left[0]], left[1])
    assert not receiver.deliver_many(ADDRS[3], [right[0]], right[1])
    assert receiver.pending == {ADDRS[5]}
    assert receiver.deliver(5, Status.VALUE, 6, [], ADDRS[5])
    assert fut.get(1) == 21


def test_a_reply_that_comes_twice_counts_once() -> None:
    # A relay's partial got out before it died; the caller resent to its
    # subtree, whose processes answered again, alone.
    receiver, fut = folded(SUM)
    for index in (3, 4):
        receiver.deliver(index, Status.VALUE, 10 * index, [], ADDRS[index])
    whole = partial(SUM, *(reply(i, 10 * i) for i in range(6)))
    assert receiver.deliver_many(ADDRS[0], [whole[0]], whole[1])
    assert fut.get(1) == 150


def test_tensors_fold_through_out_of_band_buffers() -> None:
    torch = pytest.importorskip("torch")
    fold = Fold(None, None, torch.add, "m.value.reduce()")
    receiver, fut = folded(fold)
    items = []
    for i in range(6):
        body, buffers = serialize.dumps(torch.full((1 << 16,), float(i)))
        items.append(((i, Status.OK, body, len(buffers), ADDRS[i]), list(buffers)))
    p = partial(fold, *items[:5])
    receiver.deliver_many(ADDRS[0], [p[0]], p[1])
    receiver.deliver(*items[5][0][:3], items[5][1], ADDRS[5])
    assert fut.get(1).tolist() == [15.0] * (1 << 16)


def test_the_lowest_failing_rank_wins_and_the_identity_starts_each_partial() -> None:
    fold = Fold((), lambda acc, v: (*acc, v), operator.add, "Accumulator(m.value)")
    receiver, fut = folded(fold)
    p = partial(fold, reply(0, "a"), error(2, ValueError("two")), reply(1, "b"))
    receiver.deliver_many(ADDRS[0], [p[0]], p[1])
    receiver.deliver(*error(4, KeyError("four"))[0][:3], [], ADDRS[4])
    receiver.deliver(3, Status.VALUE, "c", [], ADDRS[3])
    receiver.fail(ADDRS[5], "killed by SIGKILL")
    with pytest.raises(ActorError, match="two") as info:
        fut.get(1)
    assert info.value.rank == 2


def test_a_dead_rank_fails_the_fold_with_its_point() -> None:
    receiver, fut = folded(SUM)
    for i in (0, 1, 3, 4, 5):
        receiver.deliver(i, Status.VALUE, i, [], ADDRS[i])
    assert receiver.fail(ADDRS[2], "killed by SIGKILL")
    with pytest.raises(SupervisionError, match=r"^Endpoint call m\.value\(\) failed, The actor m\{'gpus': 2/6\} "):
        fut.get(1)


def test_an_exception_of_the_fold_is_an_actor_error_of_the_rank_folded_in() -> None:
    def picky(a: int, b: int) -> int:
        if b == 3:
            raise ValueError("picky: 3")
        return a + b

    fold = Fold(None, None, picky, "m.value.reduce()")
    # in a relay ...
    item, buffers = partial(fold, *(reply(i, i) for i in range(4)))
    assert [e[0] for e in item[2][3]] == [3]
    # ... and at the caller
    receiver, fut = folded(fold)
    for i in range(6):
        receiver.deliver(i, Status.VALUE, i, [], ADDRS[i])
    with pytest.raises(ActorError, match="picky: 3") as info:
        fut.get(1)
    assert info.value.rank == 3


def test_a_fold_that_does_not_pickle_is_refused_with_the_fix() -> None:
    import threading

    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"^m\.value\.reduce\(\): the fold cannot be pickled to run in the tree "):
        Fold(lock, None, operator.add, "m.value.reduce()")

