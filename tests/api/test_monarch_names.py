"""Monarch's remaining public names: concurrent_endpoint, as_endpoint and shutdown_context (issue #14 item 1)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest
from mpitest import spawning

from mpimesh import (
    Actor,
    ActorError,
    Channel,
    Port,
    SupervisionError,
    as_endpoint,
    concurrent_endpoint,
    endpoint,
    shutdown_context,
    this_host,
)

if TYPE_CHECKING:
    from conftest import Faults

mesh = pytest.mark.mesh


class Overlapping(Actor):
    """``wait`` awaits an event that only a later call sets: it needs concurrent calls."""

    def __init__(self, events: Port[str]) -> None:
        self.events = events
        self.gates: dict[str, asyncio.Event] = {}

    def _gate(self, key: str) -> asyncio.Event:
        return self.gates.setdefault(key, asyncio.Event())

    @concurrent_endpoint
    async def wait(self, key: str) -> str:
        try:
            await asyncio.wait_for(self._gate(key).wait(), 30)
        except asyncio.CancelledError:
            self.events.send(f"cancelled {key}")
            raise
        return f"opened {key}"

    @endpoint
    async def open(self, key: str) -> None:
        self._gate(key).set()

    @concurrent_endpoint
    async def fail(self) -> None:
        raise ValueError("task failed 21")

    @concurrent_endpoint(explicit_response_port=True)
    async def fail_with_port(self, port: Port[str]) -> None:
        raise ValueError("port task failed 22")

    async def __cleanup__(self, exc: Exception | None) -> None:
        self.events.send("cleanup")


@mesh
def test_concurrent_endpoint_calls_overlap(one_proc: object) -> None:
    """A call to a @concurrent_endpoint does not hold the actor: a later call can let it finish."""
    events, _ = Channel[str].open()
    actor = one_proc.spawn("overlap", Overlapping, events)  # type: ignore[attr-defined]
    first = actor.wait.call_one("a")
    second = actor.wait.call_one("b")
    actor.open.call_one("b").get(30)
    assert second.get(30) == "opened b"
    assert not first.done()
    actor.open.call_one("a").get(30)
    assert first.get(30) == "opened a"
    actor.stop().get(30)


@mesh
def test_stop_cancels_concurrent_calls_before_cleanup(one_proc: object) -> None:
    """stop() cancels the calls still running (their callers get SupervisionError), then runs __cleanup__."""
    events, received = Channel[str].open()
    actor = one_proc.spawn("cancelled", Overlapping, events)  # type: ignore[attr-defined]
    pending = actor.wait.call_one("never")
    actor.open.call_one("other").get(30)  # `wait` has started by now: calls start in arrival order
    actor.stop().get(30)
    assert [received.recv().get(30), received.recv().get(30)] == ["cancelled never", "cleanup"]
    cancelled = (r"^Endpoint call cancelled\.wait\(\) failed, The actor test_monarch_names\.Overlapping cancelled "
                 r"and all its descendants have failed: Actor cancelled\[0\]@\d+\.\d+ stopped before wait\(\) "
                 r"finished$")
    with pytest.raises(SupervisionError, match=cancelled):
        pending.get(30)


@mesh
def test_exceptions_escaping_concurrent_endpoints(one_proc: object, faults: Faults) -> None:
    """A concurrent call's exception reaches its caller as ActorError (the actor lives on); one escaping a body
    that answers through its own port fails the actor: SupervisionError, and a MeshFailure to the owner."""
    events, _ = Channel[str].open()
    actor = one_proc.spawn("failing", Overlapping, events)  # type: ignore[attr-defined]
    with pytest.raises(ActorError, match=r"ValueError: task failed 21$"):
        actor.fail.call_one().get(30)
    actor.open.call_one("x").get(30)  # still serving
    with pytest.raises(SupervisionError, match=r"ValueError in fail_with_port: port task failed 22$"):
        actor.fail_with_port.call_one().get(30)
    (failure,) = faults.wait_for("failing")
    assert "ValueError in fail_with_port: port task failed 22" in failure.cause
    unhealthy = r"^Endpoint call failing\.open\(\) failed, The actor .* is unhealthy with reason: ValueError in "
    with pytest.raises(SupervisionError, match=unhealthy):
        actor.open.call_one("x").get(30)
    actor.stop().get(30)


def test_concurrent_endpoint_misuse() -> None:
    """@concurrent_endpoint takes only async def methods, and does not stack with @endpoint (Monarch's texts)."""

    def plain(self: object) -> None: ...

    async def coro(self: object) -> None: ...

    async def other(self: object) -> None: ...

    with pytest.raises(ValueError, match=r"^@concurrent_endpoint can only wrap async endpoints, got "
                                         r"test_concurrent_endpoint_misuse\.<locals>\.plain; declare it async def, "
                                         r"or use @endpoint$"):
        concurrent_endpoint(plain)
    with pytest.raises(ValueError, match=r"^@concurrent_endpoint does not wrap @endpoint "
                                         r"test_concurrent_endpoint_misuse\.<locals>\.coro; use one of the two$"):
        concurrent_endpoint(endpoint(coro))
    with pytest.raises(ValueError, match=r"^@endpoint does not wrap @concurrent_endpoint "
                                         r"test_concurrent_endpoint_misuse\.<locals>\.other; use one of the two$"):
        endpoint(concurrent_endpoint(other))
    # Monarch's marker: a concurrent endpoint answers through a port of its own
    assert Overlapping.wait._explicit_response_port is True  # type: ignore[attr-defined]
    assert Overlapping.open._explicit_response_port is False  # type: ignore[attr-defined]


class Plain(Actor):
    """Methods without @endpoint, reached through as_endpoint()."""

    def __init__(self) -> None:
        self.total = 0

    @endpoint
    def ping(self) -> str:
        return "pong"

    def add(self, n: int) -> int:
        self.total += n
        return self.total

    def answer_later(self, port: Port[str], word: str) -> None:
        port.send(f"said {word}")


@mesh
def test_as_endpoint_calls_a_plain_method(procs: object) -> None:
    """as_endpoint(mesh.method) gives every adverb to a method without @endpoint."""
    actors = procs.spawn("plain", Plain)  # type: ignore[attr-defined]
    add = as_endpoint(actors.add)  # type: ignore[attr-defined]
    assert add.call(2).get(30).values() == [2, 2]
    assert as_endpoint(actors.slice(gpus=1).add).call_one(3).get(30) == 5  # type: ignore[attr-defined]
    assert as_endpoint(actors.slice(gpus=0).add).call_one(5).get(30) == 7  # type: ignore[attr-defined]
    said = as_endpoint(actors.answer_later, explicit_response_port=True)  # type: ignore[attr-defined]
    assert said.call("hi").get(30).values() == ["said hi", "said hi"]
    assert as_endpoint(actors.ping) is actors.ping  # type: ignore[attr-defined]
    actors.stop().get(30)


def test_as_endpoint_misuse() -> None:
    """as_endpoint() names what it takes."""
    with pytest.raises(TypeError, match=r"^as_endpoint expects a method of an actor mesh, got 3; pass mesh.method, "
                                        r"e\.g\. as_endpoint\(trainers\.step\)$"):
        as_endpoint(3)


class Tidy(Actor):
    def __init__(self, said: Port[str]) -> None:
        self.said = said

    @endpoint
    def ping(self) -> str:
        return "pong"

    def __cleanup__(self, exc: Exception | None) -> None:
        self.said.send("cleanup")


@mesh
def test_shutdown_context_stops_every_mesh_this_process_spawned() -> None:
    """shutdown_context() stops the process meshes not stopped yet (their actors clean up); twice is harmless."""
    said, heard = Channel[str].open()
    with spawning():
        first = this_host().spawn_procs(per_host={"gpus": 1})
        second = this_host().spawn_procs(per_host={"gpus": 1})
    actors = [first.spawn("tidy", Tidy, said), second.spawn("tidy", Tidy, said)]
    assert [a.ping.call_one().get(30) for a in actors] == ["pong", "pong"]  # type: ignore[attr-defined]
    assert shutdown_context().get(60) is None
    assert [heard.recv().get(30), heard.recv().get(30)] == ["cleanup", "cleanup"]
    with pytest.raises(
        RuntimeError, match=r"^cannot spawn on ProcMesh\(gpus=1\): `ProcMesh` has already been stopped; "
    ):
        first.spawn("again", Tidy, said)
    assert shutdown_context().get(10) is None
