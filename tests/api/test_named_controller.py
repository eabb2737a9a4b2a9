"""get_or_spawn_controller: one named actor in the controller's process, the same for every caller."""

from __future__ import annotations

import os

import pytest

from mpimesh import Actor, endpoint, get_or_spawn_controller

pytestmark = pytest.mark.mesh


class Registry(Actor):
    def __init__(self, label: str) -> None:
        self.label = label
        self.items: list[str] = []

    @endpoint
    def add(self, item: str) -> int:
        self.items.append(item)
        return len(self.items)

    @endpoint
    def state(self) -> tuple[str, int, list[str]]:
        return self.label, os.getpid(), list(self.items)


class User(Actor):
    @endpoint
    def register(self, item: str) -> int:
        registry = get_or_spawn_controller("registry", Registry, "from a worker").get(60)
        return registry.add.call_one(item).get(60)  # type: ignore[attr-defined]


def test_the_script_and_actors_share_one_named_actor(procs: object) -> None:
    registry = get_or_spawn_controller("registry", Registry, "first").get(30)
    assert registry.add.call_one("script").get(30) == 1  # type: ignore[attr-defined]
    users = procs.spawn("users", User)  # type: ignore[attr-defined]
    counts = sorted(users.register.call("worker").get(60).values())
    assert counts == [2, 3]
    again = get_or_spawn_controller("registry", Registry, "ignored").get(30)
    label, pid, items = again.state.call_one().get(30)  # type: ignore[attr-defined]
    assert (label, pid) == ("first", os.getpid())  # the first call's arguments; in the controller's process
    assert sorted(items) == ["script", "worker", "worker"]
    users.stop().get(30)


def test_names_are_separate_and_misuse_raises() -> None:
    other = get_or_spawn_controller("other", Registry, "second").get(30)
    assert other.state.call_one().get(30)[0] == "second"  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match=r"^controller name must be a non-empty str, got ''; "):
        get_or_spawn_controller("", Registry, "x")
    with pytest.raises(TypeError, match=r"^cannot spawn controller 'x' of <class 'int'>: it is not an Actor"):
        get_or_spawn_controller("x", int)  # type: ignore[type-var]
