"""Monarch's supervision contract, case by case (issue #14 items 2, 6, 9 and 10).

Each test pins one row of the fault matrix in
``../shared/reference/monarch-api.md`` §1.11: who hears of a failure, what a
waiting caller gets, and that nothing waits unbounded.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import TYPE_CHECKING

import pytest
from mpitest import spawning

from mpimesh import Actor, Channel, MeshFailure, Port, SupervisionError, endpoint, this_host, this_proc

if TYPE_CHECKING:
    from conftest import Faults

pytestmark = pytest.mark.mesh


class Replier(Actor):
    """Answers through an explicit response port, or raises before it does."""

    @endpoint(explicit_response_port=True)
    def answer(self, port: Port[str], fail: bool) -> None:
        if fail:
            raise ValueError("no answer 11")
        port.send("answered")

    @endpoint
    def ping(self) -> str:
        return "pong"


def test_explicit_port_endpoint_that_raises_fails_the_actor_and_the_caller(
    one_proc: object, faults: Faults
) -> None:
    """An exception escaping an explicit-response-port endpoint: the caller gets SupervisionError, the owner a
    MeshFailure, and the actor takes no more calls."""
    mesh = one_proc.spawn("replier", Replier)  # type: ignore[attr-defined]
    assert mesh.answer.call_one(False).get(30) == "answered"
    with pytest.raises(
        SupervisionError,
        match=r"^Endpoint call replier\.answer\(\) failed, The actor test_supervision_semantics\.Replier replier and "
        r"all its descendants have failed: Actor replier\[0\]@\d+\.\d+ failed: ValueError in answer: no answer 11$",
    ):
        mesh.answer.call_one(True).get(30)
    (failure,) = faults.wait_for("replier")
    assert failure.crashed_ranks == [0]
    assert "ValueError in answer: no answer 11" in failure.cause
    unhealthy = r"^Endpoint call replier\.ping\(\) failed, The actor .* have failed: Actor .* is unhealthy with "
    with pytest.raises(SupervisionError, match=unhealthy + "reason: ValueError in "):
        mesh.ping.call_one().get(30)


class SlowStart(Actor):
    """Says it started, then waits in __init__ for the test's word (Monarch: spawn does not block)."""

    def __init__(self, started: Port[Port[str]]) -> None:
        release, release_rx = Channel[str].open()
        started.send(release)  # "in __init__", and how to let it go on
        self.word = release_rx.recv().get(60)  # blocks __init__ until the test answers

    @endpoint
    def ping(self) -> str:
        return "pong"


def test_spawn_returns_before_init_and_stop_ends_an_init_that_has_not_returned(one_proc: object) -> None:
    """spawn() returns while __init__ runs (its side effects happen), and stop() of that actor completes."""
    started, started_rx = Channel[Port[str]].open()
    mesh = one_proc.spawn("slow", SlowStart, started)  # type: ignore[attr-defined]
    release = started_rx.recv().get(30)  # __init__ is running
    with pytest.raises(TimeoutError):
        mesh.initialized.get(0.2)
    queued = mesh.ping.call_one()  # waits behind __init__
    mesh.stop().get(10)
    with pytest.raises(SupervisionError, match=r"^Endpoint call slow\.__init__\(\) failed, The actor .* have failed: "
                                               r"Actor slow\[0\]@\d+\.\d+ was stopped before its __init__ "
                                               r"returned \(stopped by client\)$"):
        mesh.initialized.get(10)
    release.send("go")  # __init__ returns now: the actor runs nothing else
    with pytest.raises(SupervisionError, match=r"^Endpoint call slow\.ping\(\) failed, The actor .* have failed: "
                                               r"Actor slow\[0\]@\d+\.\d+ was stopped before "
                                               r"its __init__ returned \(stopped by client\)$"):
        queued.get(10)


class Failing(Actor):
    @endpoint
    def fail(self) -> None:
        raise ValueError("child failed 12")


class BusyOwner(Actor):
    """An async owner whose endpoint awaits the failure of the mesh it spawned."""

    def __init__(self) -> None:
        self.failed = asyncio.Event()
        self.seen: list[str] = []

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(failure.report())
        self.failed.set()
        return True

    @endpoint
    async def spawn_and_wait(self) -> list[str]:
        self.child = this_proc().spawn("child", Failing)
        self.child.fail.broadcast()
        # Monarch delivers supervision while an async endpoint awaits: this
        # endpoint is still running when __supervise__ sets the event.
        await asyncio.wait_for(self.failed.wait(), 30)
        return self.seen


def test_supervise_reaches_an_async_owner_while_its_endpoint_awaits(one_proc: object, faults: Faults) -> None:
    """A failure of an owned mesh reaches __supervise__ of an async owner that is busy awaiting it."""
    owner = one_proc.spawn("busy", BusyOwner)  # type: ignore[attr-defined]
    (report,) = owner.spawn_and_wait.call_one().get(60)
    assert re.match(r"MeshFailure of actor mesh 'child' \(test_supervision_semantics\.Failing\): rank=0 failed, "
                    r"crashed_ranks=\[0\]: The actor test_supervision_semantics\.Failing child and all its descendants "
                    r"have failed:\n"
                    r"  actor child\[0\]@\d+\.\d+ on \S+: ValueError in fail: child failed 12\n", report), report
    assert faults.failures == []  # handled by the owner: nothing reached the controller
    owner.stop().get(30)


class RefusingOwner(Actor):
    """An async owner whose __supervise__ does not handle the failure (returns False, or raises)."""

    def __init__(self, raises: bool) -> None:
        self.raises = raises

    def __supervise__(self, failure: MeshFailure) -> bool:
        if self.raises:
            raise RuntimeError("supervise refused 13")
        return False

    @endpoint
    async def spawn_and_linger(self) -> str:
        self.child = this_proc().spawn("child", Failing)
        self.child.fail.broadcast()
        await asyncio.sleep(60)  # still awaiting when this actor fails
        return "lingered"


@pytest.mark.parametrize("raises", [False, True], ids=["returns_false", "raises"])
def test_an_owner_that_fails_while_its_endpoint_awaits_fails_that_call(
    one_proc: object, faults: Faults, raises: bool
) -> None:
    """An owner that does not handle a failure fails; the call it was awaiting in gets SupervisionError at once,
    naming the child's failure (and what __supervise__ raised), not a result 60 s later."""
    owner = one_proc.spawn("refusing", RefusingOwner, raises)  # type: ignore[attr-defined]
    extra = r"; __supervise__ raised RuntimeError: supervise refused 13" if raises else ""
    with pytest.raises(
        SupervisionError,
        match=r"(?s)^Endpoint call refusing\.spawn_and_linger\(\) failed, The actor test_supervision_semantics\."
        r"RefusingOwner refusing and all its descendants have failed: actor refusing\[0\]@\d+\.\d+ on \S+ did not "
        rf"handle a failure{extra}:\n  MeshFailure of actor mesh 'child' .*The actor test_supervision_semantics\."
        r"Failing child and all its descendants have failed:.*ValueError: child failed 12$",
    ):
        owner.spawn_and_linger.call_one().get(30)
    assert [f.mesh_name for f in faults.wait_for("refusing")] == ["refusing"]
    owner.stop().get(30)


class PromptOwner(Actor):
    """An async owner with an async __supervise__ that calls its child until the child fails."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.procs = this_host().spawn_procs(per_host={"gpus": 1})  # the child in another process

    async def __supervise__(self, failure: MeshFailure) -> bool:
        await asyncio.sleep(0)  # a real await: it runs as a task on the actor's loop
        self.seen.append(failure.mesh_name)
        return True

    @endpoint
    async def fail_child(self, name: str) -> str:
        self.child = self.procs.spawn(name, Replier)
        try:
            await self.child.answer.call_one(True)
        except SupervisionError:
            return "child failed"
        return "child answered"

    @endpoint
    async def seen_failures(self) -> list[str]:
        return self.seen


def test_the_owner_hears_of_a_failure_before_its_call_to_the_child_raises(one_proc: object, faults: Faults) -> None:
    """When the caller owns the failed actor, its __supervise__ has run by the time it asks right after the call
    raised SupervisionError (Monarch's test_async_supervise_callback_handled asks at once)."""
    owner = one_proc.spawn("prompt", PromptOwner)  # type: ignore[attr-defined]
    for i in range(5):
        assert owner.fail_child.call_one(f"replier{i}").get(30) == "child failed"
        assert owner.seen_failures.call_one().get(30)[-1:] == [f"replier{i}"]
    assert faults.failures == []
    owner.stop().get(30)


class BadChildInit(Actor):
    def __init__(self) -> None:
        raise KeyError("missing config 13")


class InitOwner(Actor):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def __supervise__(self, failure: MeshFailure) -> bool:
        self.seen.append(f"{failure.mesh_name} {failure.crashed_ranks} {failure.cause.splitlines()[0]}")
        return True

    @endpoint
    def spawn_bad(self) -> str:
        self.child = this_proc().spawn("badchild", BadChildInit)
        try:
            self.child.initialized.get(30)
        except Exception as exc:
            return type(exc).__name__
        return "initialized"

    @endpoint
    def seen_failures(self) -> list[str]:
        return list(self.seen)


def test_init_failure_reaches_the_owners_supervise(one_proc: object, faults: Faults) -> None:
    """An actor whose __init__ raises is a supervision event for the actor that spawned it."""
    owner = one_proc.spawn("initowner", InitOwner)  # type: ignore[attr-defined]
    assert owner.spawn_bad.call_one().get(60) == "ActorError"
    seen: list[str] = []
    # The owner takes the failure after spawn_bad returns (sync actor: mailbox order), when the child's
    # report reaches it: a bound in time, not in calls (100 calls take under a millisecond now).
    end = time.monotonic() + 30
    while not seen and time.monotonic() < end:
        seen = owner.seen_failures.call_one().get(30)
        if not seen:
            time.sleep(0.005)
    assert len(seen) == 1 and re.fullmatch(
        r"badchild \[0\] actor badchild\[0\]@\d+\.\d+ on \S+: KeyError in __init__: 'missing config 13'", seen[0]
    ), seen
    assert faults.failures == []
    owner.stop().get(30)


class Level(Actor):
    """Spawns the level below it (and, at the top, a process mesh of its own); says when it cleans up."""

    def __init__(self, said: Port[str], tag: str, depth: int, own_procs: bool = False) -> None:
        self.said = said
        self.tag = tag
        if depth > 0:
            self.below = this_proc().spawn(f"level{depth - 1}", Level, said, f"level{depth - 1}", depth - 1)
            self.below.initialized.get(30)
        if own_procs:
            self.procs = this_host().spawn_procs(per_host={"gpus": 1})
            self.far = self.procs.spawn("far", Level, said, "far", 0)
            self.far.initialized.get(30)

    @endpoint
    def ping(self) -> str:
        return self.tag

    def __cleanup__(self, exc: Exception | None) -> None:
        self.said.send(f"cleanup {self.tag}")

    def __del__(self) -> None:
        self.said.send(f"deleted {self.tag}")


class CycleCollector(Actor):
    """Turns the cycle collector of its process off and on."""

    @endpoint
    def enable(self, on: bool) -> None:
        import gc

        if on:
            gc.enable()
        else:
            gc.collect()
            gc.disable()


def test_stopping_a_mesh_stops_what_its_actors_own_bottom_up(one_proc: object) -> None:
    """stop() of a mesh stops the meshes its actors spawned first (recursively), then cleans up the actor."""
    said, heard = Channel[str].open()
    # Each actor's object is let go at once when it stops, not by the cycle collector: it is off in
    # their process (a close's error kept with its traceback made a cycle through the stopping
    # actor's frames; docs/design/ownership.md).
    gc = one_proc.spawn("gc", CycleCollector)  # type: ignore[attr-defined]
    gc.enable.call(False).get(60)
    try:
        top = one_proc.spawn("top", Level, said, "top", 2, True)  # type: ignore[attr-defined]
        with spawning():
            top.initialized.get(60)
        top.stop().get(60)
        events = [heard.recv().get(30) for _ in range(8)]
    finally:
        gc.enable.call(True).get(60)
        gc.stop().get(60)
    cleanups = [e for e in events if e.startswith("cleanup")]
    assert sorted(cleanups) == ["cleanup far", "cleanup level0", "cleanup level1", "cleanup top"], events
    assert cleanups.index("cleanup level0") < cleanups.index("cleanup level1") < cleanups.index("cleanup top"), events
    assert cleanups.index("cleanup far") < cleanups.index("cleanup top"), events
    # each actor's object is let go once it has stopped: its __del__ runs after its own cleanup
    for tag in ("far", "level0", "level1", "top"):
        assert events.index(f"cleanup {tag}") < events.index(f"deleted {tag}"), events


class SlowCleanup(Actor):
    """Cleans up for longer than its owner waits for it (``MPIMESH_CLEANUP_TIMEOUT``)."""

    def __cleanup__(self, exc: Exception | None) -> None:
        import time

        from mpimesh.config import settings

        time.sleep(settings.cleanup_timeout + 1.0)


class SlowOwner(Actor):
    """Owns an actor mesh whose stop does not end in time; says when its object is let go."""

    def __init__(self, said: Port[str]) -> None:
        self.said = said
        self.slow = this_proc().spawn("slow", SlowCleanup)
        self.slow.initialized.get(30)

    def __cleanup__(self, exc: Exception | None) -> None:
        self.said.send("cleanup owner")

    def __del__(self) -> None:
        self.said.send("deleted owner")


def test_an_actor_whose_owned_stop_times_out_is_let_go_at_once(one_proc: object) -> None:
    """The stop of what an actor owns timing out leaves no cycle: its object goes when it stops, collector off."""
    said, heard = Channel[str].open()
    gc = one_proc.spawn("gc", CycleCollector)  # type: ignore[attr-defined]
    gc.enable.call(False).get(60)
    try:
        owner = one_proc.spawn("slowowner", SlowOwner, said)  # type: ignore[attr-defined]
        owner.initialized.get(60)
        owner.stop().get(60)  # after MPIMESH_CLEANUP_TIMEOUT: it waits that long for "slow", then gives up
        assert [heard.recv().get(30) for _ in range(2)] == ["cleanup owner", "deleted owner"]
    finally:
        gc.enable.call(True).get(60)
        gc.stop().get(60)


class CleansUpForASecond(Actor):
    """A ``__cleanup__`` that takes a second: a second stop arrives while it runs."""

    def __cleanup__(self, exc: Exception | None) -> None:
        import time

        time.sleep(1.0)


def test_a_process_stopped_while_its_actor_cleans_up_answers_once_the_cleanup_ends() -> None:
    """The stop of a process whose actor is already stopping answers when that stop ends, not at its bound.

    The second STOP waited behind the first in the actor's mailbox, and the
    actor's thread ended with it unread: the process's stop then took
    ``MPIMESH_SHUTDOWN_TIMEOUT`` (10 s) every time.
    """
    procs = this_host().spawn_procs(per_host={"gpus": 1})
    try:
        mesh = procs.spawn("cleans", CleansUpForASecond)
        mesh.initialized.get(30)
        first = mesh.stop()  # __cleanup__ runs for a second
        procs.stop().get(7)  # under the 10 s bound: answered when the cleanup ends
        first.get(10)
    finally:
        procs.stop().get(30)
