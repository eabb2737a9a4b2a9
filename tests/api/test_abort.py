"""Instance.abort(reason): the actor fails, later calls raise SupervisionError, and its owner is told."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from mpimesh import Actor, SupervisionError, context, endpoint, this_proc

if TYPE_CHECKING:
    from conftest import Faults

pytestmark = pytest.mark.mesh


class Child(Actor):
    @endpoint
    def give_up(self, reason: str | None) -> str:
        if reason is None:
            context().actor_instance.abort()
        else:
            context().actor_instance.abort(reason)
        return "answered"

    @endpoint
    def ping(self) -> str:
        return "pong"


class Owner(Actor):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def __supervise__(self, failure: object) -> bool:
        self.seen.append(failure.report())  # type: ignore[attr-defined]
        return True

    @endpoint
    def run(self) -> tuple[str, str]:
        self.child = this_proc().spawn("child", Child)
        said = self.child.give_up.call_one("bad state 7").get(30)  # type: ignore[attr-defined]
        try:
            later = self.child.ping.call_one().get(30)  # type: ignore[attr-defined]
        except SupervisionError as exc:
            later = f"SupervisionError: {exc}"
        return said, later

    @endpoint
    def seen_failures(self) -> list[str]:
        return list(self.seen)


def test_abort_fails_the_actor_and_tells_its_owner(one_proc: object) -> None:
    owner = one_proc.spawn("owner", Owner)  # type: ignore[attr-defined]
    said, later = owner.run.call_one().get(60)
    assert said == "answered"
    assert later.startswith("SupervisionError: ") and "aborted: bad state 7" in later, later
    deadline = time.monotonic() + 10
    seen: list[str] = []
    while not seen and time.monotonic() < deadline:
        seen = owner.seen_failures.call_one().get(30)
    assert len(seen) == 1 and "aborted: bad state 7" in seen[0], seen
    owner.stop().get(30)


def test_abort_without_a_reason(one_proc: object, faults: Faults) -> None:
    """abort() with no reason says so, in Monarch's words."""
    child = one_proc.spawn("reasonless", Child)  # type: ignore[attr-defined]
    assert child.give_up.call_one(None).get(30) == "answered"
    (failure,) = faults.wait_for("reasonless")
    assert "aborted: no reason provided" in failure.cause, failure.cause
    child.stop().get(30)


def test_abort_outside_an_actor_says_why() -> None:
    with pytest.raises(RuntimeError, match=r"^cannot abort client: it is the controller script, not an actor$"):
        context().actor_instance.abort("no")
