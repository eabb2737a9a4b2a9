"""Monarch's ``send`` primitive and ``Accumulator``: replies routed to a port, a fold over the replies.

``endpoint.reduce`` and ``Accumulator(..., merge=...)`` fold in the cast's tree when there is one
(the suite's tree run, ``MPIMESH_CAST_TREE_MIN=2``), on the caller otherwise: same results.
"""

from __future__ import annotations

import operator
import re

import pytest

from mpimesh import (
    Accumulator,
    Actor,
    ActorError,
    Channel,
    SupervisionError,
    context,
    current_actor_name,
    current_rank,
    endpoint,
    send,
)

pytestmark = pytest.mark.mesh


class Numbers(Actor):
    @endpoint
    def value(self, scale: int = 1) -> int:
        return (current_rank().rank + 1) * scale

    @endpoint
    def names(self) -> tuple[str, str, str]:
        return current_actor_name(), context().actor_instance.name, str(current_rank())

    @endpoint
    def fail_on(self, rank: int) -> int:
        if current_rank().rank == rank:
            raise ValueError(f"boom at {rank}")
        return current_rank().rank


class Forwarder(Actor):
    @endpoint
    def forward(self, target: object, port: object) -> None:
        """Send from inside an actor, replies to a port the controller holds."""
        send(target.value, (100,), port=port)  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def numbers(procs: object) -> object:
    mesh = procs.spawn("numbers", Numbers)  # type: ignore[attr-defined]
    mesh.initialized.get(30)
    return mesh


def test_send_routes_every_reply_to_a_port(numbers: object) -> None:
    port, receiver = Channel.open()
    assert send(numbers.value, (10,), port=port) is None  # type: ignore[attr-defined]
    assert sorted(receiver.recv().get(30) for _ in range(2)) == [10, 20]


def test_send_to_a_ranked_port_and_with_keywords(numbers: object) -> None:
    port, receiver = Channel.open_ranked()
    send(numbers.value, kwargs={"scale": 3}, port=port)  # type: ignore[attr-defined]
    assert sorted(receiver.recv().get(30) for _ in range(2)) == [(0, 3), (1, 6)]


def test_send_choose_reaches_one_actor(numbers: object) -> None:
    port, receiver = Channel.open()
    send(numbers.value, port=port, selection="choose")  # type: ignore[attr-defined]
    assert receiver.recv().get(30) in (1, 2)
    with pytest.raises(TimeoutError):
        receiver.recv().get(0.5)


def test_send_without_a_port_is_a_broadcast(numbers: object) -> None:
    send(numbers.value)  # type: ignore[attr-defined]
    assert numbers.value.call().get(30).values() == [1, 2]  # type: ignore[attr-defined]


def test_an_endpoint_error_arrives_at_the_port(numbers: object) -> None:
    port, receiver = Channel.open_ranked()
    send(numbers.fail_on, (1,), port=port)  # type: ignore[attr-defined]
    outcomes = []
    for _ in range(2):
        try:
            outcomes.append(receiver.recv().get(30))
        except ActorError as exc:
            outcomes.append(str(exc.exception))
    assert sorted(map(str, outcomes)) == ["(0, 0)", "boom at 1"]


def test_send_from_an_actor_to_the_controllers_port(procs: object, numbers: object) -> None:
    forwarder = procs.slice(gpus=0).spawn("forwarder", Forwarder)  # type: ignore[attr-defined]
    port, receiver = Channel.open()
    forwarder.forward.call_one(numbers, port).get(30)
    assert sorted(receiver.recv().get(30) for _ in range(2)) == [100, 200]
    forwarder.stop().get(30)


def test_send_misuse(numbers: object) -> None:
    with pytest.raises(TypeError, match=r"^send\(\) needs an endpoint of an actor mesh, got 3; "):
        send(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^send\(\) selection must be 'all' or 'choose', got 'one'; "):
        send(numbers.value, selection="one")  # type: ignore[attr-defined, arg-type]
    with pytest.raises(TypeError, match=r"^send\(\) port must be a Port, got 'p'; "):
        send(numbers.value, port="p")  # type: ignore[attr-defined, arg-type]
    with pytest.raises(TypeError, match=r"^send\(\) args must be a tuple, got 5; "):
        send(numbers.value, 5)  # type: ignore[attr-defined, arg-type]
    with pytest.raises(TypeError, match=r"too many positional arguments"):
        send(numbers.value, (1, 2))  # type: ignore[attr-defined]


def test_accumulator_folds_the_replies(numbers: object) -> None:
    total = Accumulator(numbers.value, 0, operator.add)  # type: ignore[attr-defined]
    assert total.accumulate(5).get(30) == 15
    seen = Accumulator(numbers.value, (), lambda acc, x: (*acc, x)).accumulate()  # type: ignore[attr-defined]
    assert sorted(seen.get(30)) == [1, 2]


def test_accumulator_fails_with_the_first_error(numbers: object) -> None:
    with pytest.raises(ActorError, match="boom at 0"):
        Accumulator(numbers.fail_on, 0, operator.add).accumulate(0).get(30)  # type: ignore[attr-defined]

    def bad(acc: int, x: int) -> int:
        raise ZeroDivisionError("in combine")

    with pytest.raises(ZeroDivisionError, match="in combine"):
        Accumulator(numbers.value, 0, bad).accumulate().get(30)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"^Accumulator combine must be callable, got 1; "):
        Accumulator(numbers.value, 0, 1)  # type: ignore[attr-defined, arg-type]


def test_reduce_and_accumulator_with_merge_fold_in_the_tree(numbers: object) -> None:
    """One value for the whole mesh; a tree cast (MPIMESH_CAST_TREE_MIN) folds it on the way up."""
    assert numbers.value.reduce(operator.add, 3).get(30) == 9  # type: ignore[attr-defined]
    assert numbers.value.reduce(max).get(30) == 2  # type: ignore[attr-defined]
    fold = Accumulator(numbers.value, (), lambda acc, x: (*acc, x), merge=operator.add)  # type: ignore[attr-defined]
    assert sorted(fold.accumulate(10).get(30)) == [10, 20]
    with pytest.raises(ActorError, match="boom at 1") as info:
        numbers.fail_on.reduce(operator.add, 1).get(30)  # type: ignore[attr-defined]
    assert info.value.rank == 1


def test_reduce_misuse_names_the_fix(numbers: object) -> None:
    import threading

    with pytest.raises(TypeError, match=r"^numbers\.value\.reduce\(\) needs a callable op first, got 3; "):
        numbers.value.reduce(3)  # type: ignore[attr-defined]
    lock = threading.Lock()
    with pytest.raises(TypeError, match=r"^Accumulator\(numbers\.value\): the fold cannot be pickled "):
        Accumulator(numbers.value, lock, operator.add, merge=operator.add)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"^Accumulator merge must be callable or None, got 1; "):
        Accumulator(numbers.value, 0, operator.add, merge=1)  # type: ignore[attr-defined, arg-type]

    def bad(a: int, b: int) -> int:
        raise ZeroDivisionError("in merge")

    with pytest.raises(ActorError, match="in merge"):
        numbers.value.reduce(bad).get(30)  # type: ignore[attr-defined]


def test_current_actor_name_is_the_actors_unique_id(numbers: object) -> None:
    """As in Monarch: one id per actor (the mesh's name is actor_instance.name); str(rank) is coordinate/size."""
    names = numbers.names.call().get(30).values()  # type: ignore[attr-defined]
    ids = [actor_id for actor_id, _, _ in names]
    assert len(set(ids)) == 2 and all(re.fullmatch(r"numbers\[[01]\]@\d+\.\d+", i) for i in ids), ids
    assert [name for _, name, _ in names] == ["numbers", "numbers"]
    assert [rank for _, _, rank in names] == ["{'gpus': 0/2}", "{'gpus': 1/2}"]
    assert current_actor_name() == "client"


def test_calls_after_stop_raise_supervision_error(procs: object) -> None:
    mesh = procs.spawn("stopped", Numbers)  # type: ignore[attr-defined]
    mesh.stop().get(30)
    stopped = r"^Endpoint call stopped\.value\(\) failed, The actor stopped and all its descendants have failed: it "
    with pytest.raises(SupervisionError, match=stopped):
        mesh.value.call()
    with pytest.raises(SupervisionError):
        send(mesh.value, port=Channel.open()[0])
